// CIFAR-10, binary version (https://www.cs.toronto.edu/~kriz/cifar.html, "CIFAR-10 binary
// version (suitable for C programs)"): data_batch_1.bin .. data_batch_5.bin for training,
// test_batch.bin for testing. Each record is 1 label byte followed by 3072 image bytes
// (3 channels x 32 x 32, channel-major), so files are n * 3073 bytes long.
#pragma once

#include <filesystem>

#include <ATen/ATen.h>

#include "largo/data/dataset.h"

namespace largo::data {

class Cifar10Dataset : public InMemoryDataset {
 public:
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kChannels = 3;
  static constexpr int64_t kHeight = 32;
  static constexpr int64_t kWidth = 32;
  static constexpr int64_t kRecordBytes = 1 + kChannels * kHeight * kWidth; // 3073

  // images: [N, 3, 32, 32] uint8; labels: [N] int64 in [0, 10).
  Cifar10Dataset(at::Tensor images, at::Tensor labels);

  // Loads the split from `root_dir`, or from `root_dir`/cifar-10-batches-bin (where the
  // official tarball extracts to) when the files are not directly in `root_dir`.
  // Throws DataError for a missing file, a file whose size is not a multiple of 3073
  // bytes, or a label outside [0, 10).
  static Cifar10Dataset load(const std::filesystem::path& root_dir, Split split);

  // One batch file -> images [n, 3, 32, 32] uint8 and labels [n] int64.
  static Batch read_batch_file(const std::filesystem::path& path);
};

} // namespace largo::data
