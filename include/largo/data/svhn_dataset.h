// SVHN, cropped digits (http://ufldl.stanford.edu/housenumbers/, "Format 2"): train_32x32.mat
// and test_32x32.mat as torchvision's SVHN downloads them, MAT-files (data/matlab_file.h)
// holding X, uint8 [32, 32, 3, N] (row, column, channel, image), and y, [N, 1] labels 1..10
// where 10 is the digit 0. Read as torchvision reads them: images [N, 3, 32, 32], label 10 as 0.
#pragma once

#include <filesystem>

#include <ATen/ATen.h>

#include "largo/data/dataset.h"

namespace largo::data {

class SvhnDataset : public InMemoryDataset {
 public:
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kChannels = 3;
  static constexpr int64_t kSide = 32;

  // images: [N, 3, 32, 32] uint8; labels: [N] int64 in [0, 10).
  SvhnDataset(at::Tensor images, at::Tensor labels);

  // Loads train_32x32.mat or test_32x32.mat from `root_dir`. Throws DataError for a missing
  // file, one that is not a MAT-file with X and y of those shapes, or a label outside 1..10.
  static SvhnDataset load(const std::filesystem::path& root_dir, Split split);
};

} // namespace largo::data
