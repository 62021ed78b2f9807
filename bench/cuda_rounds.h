// The CUDA kernel benches' rounds: a side's milliseconds per step between two device
// synchronisations, and the median and range printed for each side.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace largo::bench {

// Milliseconds per call of `step` over `repeats` calls, the device idle before and after.
inline double cuda_milliseconds_per_step(const std::function<void()>& step, int repeats) {
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) {
    step();
  }
  torch::cuda::synchronize();
  const std::chrono::duration<double, std::milli> elapsed =
      std::chrono::steady_clock::now() - start;
  return elapsed.count() / repeats;
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// "1.234 (1.200-1.301)": the median and the range of one side's rounds.
inline std::string median_and_range(const std::vector<double>& values) {
  const auto [least, most] = std::minmax_element(values.begin(), values.end());
  char text[64];
  std::snprintf(text, sizeof text, "%.3f (%.3f-%.3f)", median(values), *least, *most);
  return text;
}

} // namespace largo::bench
