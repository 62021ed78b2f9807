// Image files through the per-sample pipeline into a uint8 batch.
#include "largo/data/image_dataset.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "largo/core/error.h"

namespace largo::data {
namespace {

// Bad files named in warnings before the rest are only counted.
constexpr int64_t kMaxNamedBadSamples = 10;

// The encoded image of sample `index`, read into a per-thread buffer: its file, or its bytes
// from the list's source.
EncodedImage open_image(const ImageList& list, int64_t index, const DecodeOptions& options) {
  thread_local std::vector<uint8_t> bytes;
  const std::string& name = list.paths[static_cast<size_t>(index)];
  if (list.bytes_source) {
    list.bytes_source->read(index, bytes);
  } else {
    read_file_bytes(name, bytes);
  }
  return EncodedImage(bytes.data(), bytes.size(), name, options);
}

} // namespace

ImageDataset::ImageDataset(ImageList list, SamplePipeline pipeline, ImageDatasetOptions options)
    : list_(std::move(list)), pipeline_(std::move(pipeline)), options_(options) {
  check_and_read_labels();
  std::optional<ImageSize> size = pipeline_.output_size();
  if (!size) {
    // The transforms keep (or depend on) the image's size: take it from the first image.
    const EncodedImage first = open_image(list_, 0, options_.decode);
    size = pipeline_.output_size(ImageSize{first.height(), first.width()});
  }
  output_size_ = *size;
}

ImageDataset::ImageDataset(ImageList list, MultiViewPipeline pipeline, ImageDatasetOptions options)
    : list_(std::move(list)), multi_view_(std::move(pipeline)), options_(options) {
  check_and_read_labels();
  const ViewSizes sizes = multi_view_->view_sizes();
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (!sizes[k]) {
      throw ConfigError(fmt::format(
          "image dataset: view {} of the multi-view pipeline has no fixed size; end every view "
          "at a fixed size (a crop or a resize to [h, w])",
          k));
    }
    view_sizes_.push_back(*sizes[k]);
  }
  output_size_ = view_sizes_.front();
}

void ImageDataset::check_and_read_labels() {
  if (list_.paths.empty()) {
    throw DataError("image dataset: the list of image files is empty");
  }
  if (list_.labels.size() != list_.paths.size()) {
    throw DataError(fmt::format(
        "image dataset: {} paths but {} labels", list_.paths.size(), list_.labels.size()));
  }
  if (options_.max_replacement_tries < 1) {
    throw ConfigError(fmt::format(
        "image dataset: max_replacement_tries must be >= 1, got {}",
        options_.max_replacement_tries));
  }
  labels_ = at::tensor(list_.labels, at::kLong);
}

int64_t ImageDataset::size() const {
  return list_.size();
}

std::vector<int64_t> ImageDataset::sample_shape() const {
  return {Image::kChannels, output_size_.height, output_size_.width};
}

std::vector<std::vector<int64_t>> ImageDataset::view_shapes() const {
  std::vector<std::vector<int64_t>> shapes;
  for (const ImageSize& size : view_sizes_) {
    shapes.push_back({Image::kChannels, size.height, size.width});
  }
  return shapes;
}

int64_t ImageDataset::num_classes() const {
  return list_.num_classes();
}

const ImageList& ImageDataset::list() const {
  return list_;
}

int64_t ImageDataset::num_bad_samples() const {
  return num_bad_samples_.load();
}

at::Tensor ImageDataset::labels() const {
  return labels_;
}

void ImageDataset::load_sample(int64_t index, at::Generator& gen, uint8_t* out) const {
  TORCH_CHECK(!multi_view_, "ImageDataset::load_sample: this dataset makes several views");
  const EncodedImage encoded = open_image(list_, index, options_.decode);
  pipeline_.run(encoded, options_.decode, gen, output_size_, out);
}

void ImageDataset::warn_bad_sample(const std::string& message) const {
  std::lock_guard<std::mutex> lock(warn_mutex_);
  ++num_warnings_;
  if (num_warnings_ <= kMaxNamedBadSamples) {
    spdlog::warn("skipping a bad sample ({} so far): {}", num_warnings_, message);
  } else if (num_warnings_ == kMaxNamedBadSamples + 1) {
    spdlog::warn("more bad samples are skipped; only their count is reported from here on");
  }
}

int64_t ImageDataset::load_or_replace(
    int64_t index,
    const BatchRequest& request,
    const std::function<void(int64_t, at::Generator&)>& load) const {
  int64_t skipped = 0;
  for (int64_t attempt = 0;; ++attempt) {
    const int64_t candidate = (index + attempt) % size();
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        sample_seed(request.seed, request.epoch, candidate));
    try {
      load(candidate, gen);
      return skipped;
    } catch (const DataError& error) {
      if (!options_.skip_bad_samples) {
        throw;
      }
      ++skipped;
      num_bad_samples_.fetch_add(1);
      warn_bad_sample(error.what());
      if (attempt + 1 >= options_.max_replacement_tries) {
        throw DataError(fmt::format(
            "image dataset: sample {} and the {} samples after it could not be loaded; the last "
            "error: {}",
            index,
            attempt,
            error.what()));
      }
    }
  }
}

Batch ImageDataset::load_batch(const BatchRequest& request) const {
  check_indices(request.indices, size(), "the image dataset");
  if (multi_view_) {
    return load_views(request);
  }
  const auto count = static_cast<int64_t>(request.indices.size());
  const std::vector<int64_t> shape = sample_shape();
  at::Tensor images = request.buffer_for(count, shape);
  if (!images.defined()) {
    images = at::empty({count, shape[0], shape[1], shape[2]}, at::kByte);
  }
  const int64_t sample_bytes = shape[0] * shape[1] * shape[2];
  auto* data = images.data_ptr<uint8_t>();
  Batch batch;
  std::vector<int64_t> labels(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t index = request.indices[static_cast<size_t>(i)];
    uint8_t* out = data + i * sample_bytes;
    const int64_t skipped =
        load_or_replace(index, request, [&](int64_t candidate, at::Generator& gen) {
          load_sample(candidate, gen, out);
        });
    batch.num_bad_samples += skipped;
    labels[static_cast<size_t>(i)] = list_.labels[static_cast<size_t>((index + skipped) % size())];
  }
  batch.images = images;
  batch.labels = at::tensor(labels, at::kLong);
  return batch;
}

Batch ImageDataset::load_views(const BatchRequest& request) const {
  const auto count = static_cast<int64_t>(request.indices.size());
  Batch batch;
  std::vector<int64_t> view_bytes;
  for (const ImageSize& size : view_sizes_) {
    batch.views.push_back(at::empty({count, Image::kChannels, size.height, size.width}, at::kByte));
    view_bytes.push_back(Image::kChannels * size.height * size.width);
  }
  std::vector<uint8_t*> outs(view_sizes_.size());
  std::vector<int64_t> labels(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < outs.size(); ++k) {
      outs[k] = batch.views[k].data_ptr<uint8_t>() + i * view_bytes[k];
    }
    const int64_t index = request.indices[static_cast<size_t>(i)];
    const int64_t skipped =
        load_or_replace(index, request, [&](int64_t candidate, at::Generator& gen) {
          const EncodedImage encoded = open_image(list_, candidate, options_.decode);
          multi_view_->run(encoded, options_.decode, gen, view_sizes_, outs);
        });
    batch.num_bad_samples += skipped;
    labels[static_cast<size_t>(i)] = list_.labels[static_cast<size_t>((index + skipped) % size())];
  }
  batch.labels = at::tensor(labels, at::kLong);
  return batch;
}

Batch ImageDataset::get_batch(const std::vector<int64_t>& indices) const {
  BatchRequest request;
  request.indices = indices;
  return load_batch(request);
}

} // namespace largo::data
