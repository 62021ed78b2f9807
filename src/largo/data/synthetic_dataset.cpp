// Synthetic samples from splitmix64 streams: a few GB/s per core, independent of libtorch's
// generators, so the bytes are stable across libtorch versions.
#include "largo/data/synthetic_dataset.h"

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "largo/core/error.h"
#include "largo/data/hash.h"

namespace largo::data {
namespace {

// Distinct stream tags so a sample's label is not a function of its first image bytes.
constexpr uint64_t kImageStream = 0x696d616765ULL; // "image"
constexpr uint64_t kLabelStream = 0x6c6162656cULL; // "label"

} // namespace

SyntheticDataset::SyntheticDataset(
    int64_t num_samples, std::vector<int64_t> sample_shape, int64_t num_classes, uint64_t seed)
    : num_samples_(num_samples),
      sample_shape_(std::move(sample_shape)),
      num_classes_(num_classes),
      seed_(seed) {
  if (num_samples_ < 0) {
    throw ConfigError(
        fmt::format("synthetic dataset: num_samples must be >= 0, got {}", num_samples_));
  }
  if (sample_shape_.size() != 3 ||
      std::any_of(sample_shape_.begin(), sample_shape_.end(), [](int64_t d) { return d <= 0; })) {
    throw ConfigError(fmt::format(
        "synthetic dataset: sample_shape must be [channels, h, w] with all > 0, got {}",
        sample_shape_));
  }
  if (num_classes_ < 1) {
    throw ConfigError(
        fmt::format("synthetic dataset: num_classes must be >= 1, got {}", num_classes_));
  }
}

int64_t SyntheticDataset::size() const {
  return num_samples_;
}

std::vector<int64_t> SyntheticDataset::sample_shape() const {
  return sample_shape_;
}

int64_t SyntheticDataset::num_classes() const {
  return num_classes_;
}

Batch SyntheticDataset::get_batch(const std::vector<int64_t>& indices) const {
  check_indices(indices, num_samples_, "synthetic dataset");
  const auto batch_size = static_cast<int64_t>(indices.size());
  at::Tensor images = at::empty(
      {batch_size, sample_shape_[0], sample_shape_[1], sample_shape_[2]},
      at::kByte);                                         // [batch, channels, h, w]
  at::Tensor labels = at::empty({batch_size}, at::kLong); // [batch]
  const int64_t sample_bytes = sample_shape_[0] * sample_shape_[1] * sample_shape_[2];
  auto* image_bytes = images.data_ptr<uint8_t>();
  auto* label_values = labels.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_size; ++b) {
    const auto index = static_cast<uint64_t>(indices[static_cast<size_t>(b)]);
    uint64_t state = hash_combine(hash_combine(seed_, kImageStream), index);
    uint8_t* out = image_bytes + b * sample_bytes;
    int64_t offset = 0;
    for (; offset + 8 <= sample_bytes; offset += 8) {
      const uint64_t word = splitmix64_next(state);
      std::memcpy(out + offset, &word, 8);
    }
    if (offset < sample_bytes) {
      const uint64_t word = splitmix64_next(state);
      std::memcpy(out + offset, &word, static_cast<size_t>(sample_bytes - offset));
    }
    const uint64_t label_hash = hash_combine(hash_combine(seed_, kLabelStream), index);
    label_values[b] = static_cast<int64_t>(label_hash % static_cast<uint64_t>(num_classes_));
  }
  return Batch{images, labels};
}

} // namespace largo::data
