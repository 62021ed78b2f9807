// The dataset interface the loader reads from, and the in-memory dataset that the file
// formats (idx, CIFAR-10) load into. A dataset hands out whole batches, not samples: one
// index_select over a [N, C, H, W] tensor is far cheaper than N per-sample copies, and a
// dataset of image files (image_dataset.h) decodes a batch's samples straight into one
// reused buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace largo::data {

// Which part of a dataset to load.
enum class Split { kTrain, kTest };

// "train" -> kTrain, "test" -> kTest; anything else throws ConfigError.
Split parse_split(const std::string& name);
std::string to_string(Split split);

// A batch of samples. Datasets return uint8 images; the loader delivers float32 images
// after the transforms.
struct Batch {
  at::Tensor images; // [batch, channels, h, w], uint8 or float32
  at::Tensor labels; // [batch], int64
  // Samples that could not be loaded and were replaced (ImageDataset's skip_bad_samples).
  int64_t num_bad_samples = 0;
  // A multi-view dataset's samples (Dataset::view_shapes non-empty): one tensor per view k,
  // [batch, channels, h_k, w_k], in view order -- VISSL's multicrop_collator; images is then
  // undefined. Empty for one image per sample.
  std::vector<at::Tensor> views{};
};

// What a loader asks a dataset for: the samples, and what their per-sample random
// transforms draw from. Sample i of epoch e draws from a generator seeded with
// sample_seed(seed, e, i), whichever batch or thread loads it.
struct BatchRequest {
  std::vector<int64_t> indices;
  uint64_t seed = 0;
  int64_t epoch = 0;
  // Optional: a uint8 tensor [at least indices.size(), channels, h, w], contiguous, that the
  // images may be written into (the loader reuses one per worker; for CUDA it is pinned).
  // The returned images may then be a view of it. Undefined: the dataset allocates.
  at::Tensor images_buffer;

  // The first `count` images of images_buffer when it fits [count, sample_shape...] uint8
  // contiguous; an undefined tensor otherwise.
  at::Tensor buffer_for(int64_t count, const std::vector<int64_t>& sample_shape) const;
};

// The seed of sample `index`'s transform generator in `epoch`. Stable by contract (a
// resumed run must draw the same crops).
uint64_t sample_seed(uint64_t seed, int64_t epoch, int64_t index);

// A labelled image dataset. Implementations must be safe to read from several threads
// at once (the loader's workers call load_batch concurrently).
class Dataset {
 public:
  virtual ~Dataset();

  virtual int64_t size() const = 0;
  // The shape of one image: [channels, h, w].
  virtual std::vector<int64_t> sample_shape() const = 0;
  virtual int64_t num_classes() const = 0;
  // A dataset whose samples are several views (Batch::views): [channels, h, w] of each view.
  // Empty (the default) for one image per sample.
  virtual std::vector<std::vector<int64_t>> view_shapes() const;

  // The samples at `indices`, in that order (repeats allowed). Throws DataError for an
  // index outside [0, size()).
  virtual Batch get_batch(const std::vector<int64_t>& indices) const = 0;

  // What the loader calls. The default ignores seed and epoch (nothing random per sample)
  // and returns get_batch(indices), copied into images_buffer when that is pinned.
  virtual Batch load_batch(const BatchRequest& request) const;

  // All images as one tensor, [size, channels, h, w] uint8, and all labels, [size] int64.
  // In-memory datasets return their storage without copying; the default gathers every
  // sample through get_batch, which is only sensible for small datasets.
  virtual at::Tensor images() const;
  virtual at::Tensor labels() const;
};

// A dataset held entirely in memory: all images in one uint8 tensor and all labels in one
// int64 tensor. The file-format loaders (IdxDataset, Cifar10Dataset) produce these.
class InMemoryDataset : public Dataset {
 public:
  // images: [N, channels, h, w] uint8; labels: [N] int64 with values in [0, num_classes).
  // Throws DataError when the shapes, dtypes or label range do not fit.
  InMemoryDataset(at::Tensor images, at::Tensor labels, int64_t num_classes);

  int64_t size() const override;
  std::vector<int64_t> sample_shape() const override;
  int64_t num_classes() const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  at::Tensor images() const override;
  at::Tensor labels() const override;

 private:
  at::Tensor images_; // [N, channels, h, w], uint8, contiguous
  at::Tensor labels_; // [N], int64, contiguous
  int64_t num_classes_;
};

// Throws DataError naming `dataset_name` when an index is outside [0, dataset_size).
void check_indices(
    const std::vector<int64_t>& indices, int64_t dataset_size, const std::string& dataset_name);

} // namespace largo::data
