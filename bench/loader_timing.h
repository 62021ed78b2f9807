// What the loader benchmarks (image_pipeline_bench, webdataset_loader_bench) time: one epoch
// of a DataLoader after a warm-up, so that thread start-up and first allocations are left out.
#pragma once

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "largo/data/data_loader.h"

namespace largo::bench {

inline constexpr int kWarmupBatches = 2;

// One epoch that reads `order`: the images delivered after kWarmupBatches batches and the
// seconds they took (a multi-view batch counts its images once, not once per view).
inline std::pair<int64_t, double>
time_epoch(data::DataLoader& loader, const std::vector<int64_t>& order) {
  using Clock = std::chrono::steady_clock;
  loader.start_epoch(order, 0);
  Clock::time_point start;
  int64_t images = 0;
  for (int64_t k = 0; auto batch = loader.next(); ++k) {
    if (k == kWarmupBatches) {
      start = Clock::now();
    } else if (k > kWarmupBatches) {
      images += batch->labels.size(0);
    }
  }
  return {images, std::chrono::duration<double>(Clock::now() - start).count()};
}

} // namespace largo::bench
