// Dataset interface defaults and the in-memory dataset.
#include "largo/data/dataset.h"

#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "largo/core/error.h"
#include "largo/data/hash.h"

namespace largo::data {

Split parse_split(const std::string& name) {
  if (name == "train") {
    return Split::kTrain;
  }
  if (name == "test") {
    return Split::kTest;
  }
  throw ConfigError(fmt::format("unknown data split '{}': expected 'train' or 'test'", name));
}

std::string to_string(Split split) {
  return split == Split::kTrain ? "train" : "test";
}

Dataset::~Dataset() = default;

uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t index) {
  // A different constant than batch_seed's chain, so sample and batch streams never coincide.
  constexpr uint64_t kSampleStream = 0x53414d504c45ULL; // "SAMPLE"
  return hash_combine(
      hash_combine(hash_combine(seed, kSampleStream), static_cast<uint64_t>(epoch)),
      static_cast<uint64_t>(index));
}

at::Tensor BatchRequest::buffer_for(int64_t count, const std::vector<int64_t>& sample_shape) const {
  const at::Tensor& buffer = images_buffer;
  if (!buffer.defined() || buffer.scalar_type() != at::kByte || !buffer.is_contiguous() ||
      buffer.dim() != 4 || buffer.size(0) < count ||
      buffer.sizes().slice(1) != at::IntArrayRef(sample_shape)) {
    return at::Tensor();
  }
  return buffer.narrow(0, 0, count);
}

std::vector<std::vector<int64_t>> Dataset::view_shapes() const {
  return {};
}

Batch Dataset::load_batch(const BatchRequest& request) const {
  Batch batch = get_batch(request.indices);
  // Copying only pays when the buffer is page-locked (a CUDA copy reads it asynchronously).
  const at::Tensor view = request.buffer_for(batch.images.size(0), sample_shape());
  if (view.defined() && view.is_pinned() && batch.images.scalar_type() == at::kByte) {
    view.copy_(batch.images);
    batch.images = view;
  }
  return batch;
}
namespace {

std::vector<int64_t> all_indices(int64_t size) {
  std::vector<int64_t> indices(static_cast<size_t>(size));
  std::iota(indices.begin(), indices.end(), int64_t{0});
  return indices;
}

} // namespace

at::Tensor Dataset::images() const {
  return get_batch(all_indices(size())).images;
}

at::Tensor Dataset::labels() const {
  return get_batch(all_indices(size())).labels;
}

void check_indices(
    const std::vector<int64_t>& indices, int64_t dataset_size, const std::string& dataset_name) {
  for (int64_t index : indices) {
    if (index < 0 || index >= dataset_size) {
      throw DataError(fmt::format(
          "sample index {} is out of range for {} of {} samples "
          "(valid indices are 0..{})",
          index,
          dataset_name,
          dataset_size,
          dataset_size - 1));
    }
  }
}

InMemoryDataset::InMemoryDataset(at::Tensor images, at::Tensor labels, int64_t num_classes)
    : images_(std::move(images)), labels_(std::move(labels)), num_classes_(num_classes) {
  if (!images_.defined() || images_.dim() != 4 || images_.scalar_type() != at::kByte) {
    throw DataError(fmt::format(
        "in-memory dataset: images must be a uint8 tensor [N, channels, h, w], got {} {}",
        images_.defined() ? std::string(c10::toString(images_.scalar_type())) : "undefined",
        images_.defined() ? fmt::format("{}", images_.sizes().vec()) : "tensor"));
  }
  if (!labels_.defined() || labels_.dim() != 1 || labels_.scalar_type() != at::kLong ||
      labels_.size(0) != images_.size(0)) {
    throw DataError(fmt::format(
        "in-memory dataset: labels must be an int64 tensor [{}] (one per image), got {} {}",
        images_.size(0),
        labels_.defined() ? std::string(c10::toString(labels_.scalar_type())) : "undefined",
        labels_.defined() ? fmt::format("{}", labels_.sizes().vec()) : "tensor"));
  }
  if (num_classes_ < 1) {
    throw DataError(
        fmt::format("in-memory dataset: num_classes must be >= 1, got {}", num_classes_));
  }
  images_ = images_.contiguous();
  labels_ = labels_.contiguous();
  if (labels_.numel() > 0) {
    const int64_t min_label = labels_.min().item<int64_t>();
    const int64_t max_label = labels_.max().item<int64_t>();
    if (min_label < 0 || max_label >= num_classes_) {
      throw DataError(fmt::format(
          "in-memory dataset: labels must lie in [0, {}), found {}",
          num_classes_,
          min_label < 0 ? min_label : max_label));
    }
  }
}

int64_t InMemoryDataset::size() const {
  return images_.size(0);
}

std::vector<int64_t> InMemoryDataset::sample_shape() const {
  return {images_.size(1), images_.size(2), images_.size(3)};
}

int64_t InMemoryDataset::num_classes() const {
  return num_classes_;
}

Batch InMemoryDataset::get_batch(const std::vector<int64_t>& indices) const {
  check_indices(indices, size(), "in-memory dataset");
  if (indices.empty()) {
    return Batch{images_.narrow(0, 0, 0).clone(), labels_.narrow(0, 0, 0).clone()};
  }
  // from_blob does not copy: it views the caller's vector for the duration of the call.
  const at::Tensor index = at::from_blob(
      const_cast<int64_t*>(indices.data()),
      {static_cast<int64_t>(indices.size())},
      at::TensorOptions(at::kLong));
  return Batch{images_.index_select(0, index), labels_.index_select(0, index)};
}

at::Tensor InMemoryDataset::images() const {
  return images_;
}

at::Tensor InMemoryDataset::labels() const {
  return labels_;
}

} // namespace largo::data
