// MNIST-family datasets (MNIST, Fashion-MNIST) in the idx file format, gzip-compressed or
// raw. A directory holds four files: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
// Debian's `dataset-fashion-mnist` package installs them in kFashionMnistSystemDir.
#pragma once

#include <filesystem>

#include <ATen/ATen.h>

#include "largo/data/dataset.h"

namespace largo::data {

// Where `apt-get install dataset-fashion-mnist` puts Fashion-MNIST.
inline constexpr const char* kFashionMnistSystemDir = "/usr/share/datasets/fashion-mnist";

class IdxDataset : public InMemoryDataset {
 public:
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kMnistImageSide = 28; // MNIST's and Fashion-MNIST's 28x28 images
  static constexpr uint32_t kImagesMagic = 2051; // idx3, unsigned bytes
  static constexpr uint32_t kLabelsMagic = 2049; // idx1, unsigned bytes

  // images: [N, 1, h, w] uint8; labels: [N] int64 in [0, 10).
  IdxDataset(at::Tensor images, at::Tensor labels);

  // Loads the `split` images and labels from `root_dir`, trying each file name without
  // and with `.gz`. Throws DataError for a missing, truncated or malformed file, for
  // image and label counts that differ, and for labels outside [0, 10).
  static IdxDataset load(const std::filesystem::path& root_dir, Split split);

  // The image file load() reads for `split` (DataError when neither name exists).
  static std::filesystem::path images_file(const std::filesystem::path& root_dir, Split split);

  // One idx3 image file -> [N, 1, rows, cols] uint8. gzip or raw (detected by content).
  static at::Tensor read_images(const std::filesystem::path& path);
  // One idx1 label file -> [N] int64 (values as stored; load() checks the range).
  static at::Tensor read_labels(const std::filesystem::path& path);
};

} // namespace largo::data
