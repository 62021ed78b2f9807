// CIFAR-100, binary version (https://www.cs.toronto.edu/~kriz/cifar.html, "CIFAR-100 binary
// version (suitable for C programs)"): train.bin and test.bin, each record 1 coarse label
// byte, 1 fine label byte and 3072 image bytes (3 channels x 32 x 32, channel-major). The
// labels are the fine ones (100 classes), the targets torchvision's CIFAR100 gives VISSL.
#pragma once

#include <filesystem>

#include <ATen/ATen.h>

#include "largo/data/dataset.h"

namespace largo::data {

class Cifar100Dataset : public InMemoryDataset {
 public:
  static constexpr int64_t kNumClasses = 100;
  static constexpr int64_t kChannels = 3;
  static constexpr int64_t kSide = 32;
  static constexpr int64_t kRecordBytes = 2 + kChannels * kSide * kSide; // 3074

  // images: [N, 3, 32, 32] uint8; labels: [N] int64 in [0, 100).
  Cifar100Dataset(at::Tensor images, at::Tensor labels);

  // Loads train.bin or test.bin from `root_dir`, or from `root_dir`/cifar-100-binary (where
  // the official tarball extracts to). Throws DataError for a missing file, a size that is
  // not a multiple of 3074 bytes, or a fine label outside [0, 100).
  static Cifar100Dataset load(const std::filesystem::path& root_dir, Split split);
};

} // namespace largo::data
