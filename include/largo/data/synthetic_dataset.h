// A dataset of random images and labels for benchmarks and tests. Nothing is stored:
// sample i is generated on demand from a stream seeded by (seed, i), so any number of
// samples costs no memory and a sample is the same whichever batch or thread reads it.
#pragma once

#include <cstdint>
#include <vector>

#include "largo/data/dataset.h"

namespace largo::data {

class SyntheticDataset : public Dataset {
 public:
  // sample_shape: [channels, h, w], all > 0; num_samples >= 0; num_classes >= 1.
  // Throws ConfigError otherwise.
  SyntheticDataset(
      int64_t num_samples,
      std::vector<int64_t> sample_shape,
      int64_t num_classes,
      uint64_t seed = 0);

  int64_t size() const override;
  std::vector<int64_t> sample_shape() const override;
  int64_t num_classes() const override;
  // Images are uniform uint8 in [0, 255]; labels uniform in [0, num_classes).
  Batch get_batch(const std::vector<int64_t>& indices) const override;

 private:
  int64_t num_samples_;
  std::vector<int64_t> sample_shape_; // [channels, h, w]
  int64_t num_classes_;
  uint64_t seed_;
};

} // namespace largo::data
