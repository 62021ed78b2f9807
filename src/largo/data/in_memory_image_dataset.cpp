// In-memory images through the per-sample pipeline into a uint8 batch.
#include "largo/data/in_memory_image_dataset.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>

#include "largo/core/error.h"

namespace largo::data {
namespace {

std::string in_memory_sample_name(int64_t index) {
  return fmt::format("sample {} of the in-memory dataset", index);
}

at::Generator in_memory_sample_generator(const BatchRequest& request, int64_t index) {
  return at::make_generator<at::CPUGeneratorImpl>(sample_seed(request.seed, request.epoch, index));
}

} // namespace

RgbCanvas RgbCanvas::from_spec(const TransformSpec& spec) {
  const TransformArgs args(spec, {"size", "box"});
  RgbCanvas canvas;
  const std::vector<double> size = args.numbers("size", {});
  if (!size.empty()) {
    // VISSL passes `size` to Image.new, which reads it as (width, height).
    const auto [first, second] = args.size("size");
    canvas.size = size.size() == 1 ? ImageSize{first, first} : ImageSize{second, first};
  }
  const std::vector<double> box = args.numbers("box", {0, 0});
  if (box.size() != 2) {
    args.fail("box", fmt::format("takes [left, top], got {} values", box.size()));
  }
  canvas.left = static_cast<int64_t>(box[0]);
  canvas.top = static_cast<int64_t>(box[1]);
  return canvas;
}

ImageSize RgbCanvas::output_size(ImageSize stored) const {
  return size.value_or(stored);
}

InMemoryImageDataset::InMemoryImageDataset(
    std::shared_ptr<const Dataset> stored, SamplePipeline pipeline, std::optional<RgbCanvas> canvas)
    : stored_(std::move(stored)), canvas_(canvas), pipeline_(std::move(pipeline)) {
  check_stored();
  output_sizes_.push_back(*pipeline_.output_size(rgb_size_)); // a known input gives a size
}

InMemoryImageDataset::InMemoryImageDataset(
    std::shared_ptr<const Dataset> stored,
    MultiViewPipeline pipeline,
    std::optional<RgbCanvas> canvas)
    : stored_(std::move(stored)), canvas_(canvas), multi_view_(std::move(pipeline)) {
  check_stored();
  for (const std::optional<ImageSize>& size : multi_view_->view_sizes(rgb_size_)) {
    output_sizes_.push_back(*size);
  }
}

ImageSize InMemoryImageDataset::rgb_size(
    const std::vector<int64_t>& stored_shape, const std::optional<RgbCanvas>& canvas) {
  const int64_t channels = stored_shape.at(0);
  if (channels != 1 && channels != 3) {
    throw ConfigError(fmt::format(
        "in-memory image dataset: per-sample transforms take images of 1 or 3 channels, got "
        "{}",
        channels));
  }
  if (channels == 1 && !canvas) {
    throw ConfigError(
        "in-memory image dataset: the images have one channel (gray), and the per-sample "
        "transforms act on RGB images; make them RGB first with MNISTImgPil2RGB (VISSL's "
        "transform, first in the list), or use only the batch transforms RandomCrop, "
        "RandomHorizontalFlip, ToTensor, Normalize");
  }
  const ImageSize stored{stored_shape.at(1), stored_shape.at(2)};
  return canvas ? canvas->output_size(stored) : stored;
}

void InMemoryImageDataset::check_stored() {
  images_ = stored_->images().contiguous(); // [N, channels, h, w]
  TORCH_CHECK(
      images_.scalar_type() == at::kByte && images_.dim() == 4,
      "InMemoryImageDataset: the stored images must be uint8 [N, channels, h, w]");
  rgb_size_ = rgb_size(stored_->sample_shape(), canvas_);
}

void InMemoryImageDataset::read_rgb(int64_t index, Image& out) const {
  const int64_t channels = images_.size(1);
  const int64_t height = images_.size(2);
  const int64_t width = images_.size(3);
  const int64_t plane = height * width;
  const uint8_t* src = images_.data_ptr<uint8_t>() + index * channels * plane;
  out.reshape(rgb_size_.width, rgb_size_.height);
  const int64_t left = canvas_ ? canvas_->left : 0;
  const int64_t top = canvas_ ? canvas_->top : 0;
  if (canvas_) {
    std::fill(out.pixels.begin(), out.pixels.end(), uint8_t{0}); // Image.new's black
  }
  for (int64_t y = std::max<int64_t>(0, -top); y < std::min(height, out.height - top); ++y) {
    uint8_t* dst = out.row(top + y);
    for (int64_t x = std::max<int64_t>(0, -left); x < std::min(width, out.width - left); ++x) {
      for (int64_t c = 0; c < Image::kChannels; ++c) {
        // A gray image pastes as R = G = B (PIL's convert("RGB") of mode L).
        dst[(left + x) * Image::kChannels + c] =
            src[(channels == 1 ? 0 : c) * plane + y * width + x];
      }
    }
  }
}

int64_t InMemoryImageDataset::size() const {
  return stored_->size();
}

std::vector<int64_t> InMemoryImageDataset::sample_shape() const {
  return {Image::kChannels, output_sizes_.front().height, output_sizes_.front().width};
}

std::vector<std::vector<int64_t>> InMemoryImageDataset::view_shapes() const {
  std::vector<std::vector<int64_t>> shapes;
  if (multi_view_) {
    for (const ImageSize& size : output_sizes_) {
      shapes.push_back({Image::kChannels, size.height, size.width});
    }
  }
  return shapes;
}

int64_t InMemoryImageDataset::num_classes() const {
  return stored_->num_classes();
}

at::Tensor InMemoryImageDataset::labels() const {
  return stored_->labels();
}

Batch InMemoryImageDataset::load_batch(const BatchRequest& request) const {
  check_indices(request.indices, size(), "the in-memory dataset");
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
  thread_local Image rgb; // reused: the pipeline reads it in place
  for (int64_t i = 0; i < count; ++i) {
    const int64_t index = request.indices[static_cast<size_t>(i)];
    at::Generator gen = in_memory_sample_generator(request, index);
    read_rgb(index, rgb);
    pipeline_.run(
        rgb,
        in_memory_sample_name(index),
        gen,
        output_sizes_.front(),
        images.data_ptr<uint8_t>() + i * sample_bytes);
  }
  Batch batch;
  batch.images = images;
  batch.labels = labels().index_select(0, at::tensor(request.indices, at::kLong));
  return batch;
}

Batch InMemoryImageDataset::load_views(const BatchRequest& request) const {
  const auto count = static_cast<int64_t>(request.indices.size());
  Batch batch;
  std::vector<int64_t> view_bytes;
  for (const ImageSize& size : output_sizes_) {
    batch.views.push_back(at::empty({count, Image::kChannels, size.height, size.width}, at::kByte));
    view_bytes.push_back(Image::kChannels * size.height * size.width);
  }
  std::vector<uint8_t*> outs(output_sizes_.size());
  thread_local Image rgb;
  for (int64_t i = 0; i < count; ++i) {
    for (size_t k = 0; k < outs.size(); ++k) {
      outs[k] = batch.views[k].data_ptr<uint8_t>() + i * view_bytes[k];
    }
    const int64_t index = request.indices[static_cast<size_t>(i)];
    at::Generator gen = in_memory_sample_generator(request, index);
    read_rgb(index, rgb);
    multi_view_->run(rgb, in_memory_sample_name(index), gen, output_sizes_, outs);
  }
  batch.labels = labels().index_select(0, at::tensor(request.indices, at::kLong));
  return batch;
}

Batch InMemoryImageDataset::get_batch(const std::vector<int64_t>& indices) const {
  BatchRequest request;
  request.indices = indices;
  return load_batch(request);
}

} // namespace largo::data
