// STL-10, binary version (https://cs.stanford.edu/~acoates/stl10/, stl10_binary.tar.gz):
// <split>_X.bin holds the images, 3 x 96 x 96 bytes each, every channel stored column by
// column (MATLAB's order), and <split>_y.bin one label byte per image, 1..10. torchvision's
// STL10 (which VISSL's benchmarks use) reads the same files, turns each channel to row-major
// and subtracts 1 from the labels; so does this. Splits: train and test (the unlabeled split
// has no labels to train or test a classifier with).
#pragma once

#include <filesystem>

#include <ATen/ATen.h>

#include "largo/data/dataset.h"

namespace largo::data {

class Stl10Dataset : public InMemoryDataset {
 public:
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kChannels = 3;
  static constexpr int64_t kSide = 96;
  static constexpr int64_t kImageBytes = kChannels * kSide * kSide; // 27648

  // images: [N, 3, 96, 96] uint8 (row-major); labels: [N] int64 in [0, 10).
  Stl10Dataset(at::Tensor images, at::Tensor labels);

  // Loads train_X.bin / train_y.bin (or test_*) from `root_dir`, or from
  // `root_dir`/stl10_binary (where the official tarball extracts to). Throws DataError for a
  // missing file, a size that is not whole images, label and image counts that differ, or a
  // label outside 1..10.
  static Stl10Dataset load(const std::filesystem::path& root_dir, Split split);
};

} // namespace largo::data
