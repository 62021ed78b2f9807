// The run's MFU denominator is the per-rank peak of its compute dtype times the ranks, and a
// low precision that multiplies far slower than float32 on the CPU is said at start-up, with
// the faster choices. The peaks come from a cache file written here, so the figures are exact.
#include <largo/train/run_peak_flops.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace largo::train::run_peak_flops_test {
namespace {

namespace fs = std::filesystem;

fs::path cache_with(const std::string& name, double float32, double bfloat16, double float16) {
  const fs::path dir = fs::temp_directory_path() / ("largo_run_peak_flops_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path cache = dir / "peak_flops.json";
  std::ofstream(cache) << nlohmann::json{
      {peak_flops_key(at::kCPU, at::kFloat, 2), float32},
      {peak_flops_key(at::kCPU, at::kBFloat16, 2), bfloat16},
      {peak_flops_key(at::kCPU, at::kHalf, 2),
       float16}}.dump();
  return cache;
}

precision::PrecisionPolicy o1(at::ScalarType dtype) {
  precision::PrecisionPolicyOptions options;
  options.use_amp = true;
  options.dtype = dtype == at::kHalf ? "float16" : "bfloat16";
  return precision::resolve_precision_policy(options);
}

TEST(RunPeakFlops, IsTheComputeDtypesPeakTimesTheRanks) {
  const fs::path cache = cache_with("ranks", 20e9, 40e9, 1e9);
  const RunPeakFlops float32 = run_peak_flops(at::kCPU, precision::PrecisionPolicy{}, 4, 2, cache);
  EXPECT_EQ(float32.per_rank.flops_per_sec, 20e9);
  EXPECT_EQ(float32.world, 80e9);
  EXPECT_FALSE(float32.slow_precision_warning);
  const RunPeakFlops bfloat16 = run_peak_flops(at::kCPU, o1(at::kBFloat16), 4, 2, cache);
  EXPECT_EQ(bfloat16.world, 160e9);
  EXPECT_FALSE(bfloat16.slow_precision_warning); // faster than float32 here
  fs::remove_all(cache.parent_path());
}

TEST(RunPeakFlops, AFarSlowerLowPrecisionIsSaidWithTheFasterChoices) {
  const fs::path cache = cache_with("slow", 20e9, 40e9, 1e9);
  const RunPeakFlops half = run_peak_flops(at::kCPU, o1(at::kHalf), 1, 2, cache);
  EXPECT_EQ(half.world, 1e9);
  ASSERT_TRUE(half.slow_precision_warning);
  const std::string& warning = *half.slow_precision_warning;
  for (const std::string& expected :
       {"Half",
        "20.0x slower",
        "bfloat16 (40 GFLOP/s",
        "MODEL.AMP_PARAMS.DTYPE",
        "MODEL.AMP_PARAMS.USE_AMP False",
        "a GPU"}) {
    EXPECT_NE(warning.find(expected), std::string::npos) << expected << " in: " << warning;
  }
  // bfloat16 slow too: only float32 and the GPU are offered.
  const fs::path both_slow = cache_with("both_slow", 20e9, 5e9, 1e9);
  const RunPeakFlops neither = run_peak_flops(at::kCPU, o1(at::kHalf), 1, 2, both_slow);
  ASSERT_TRUE(neither.slow_precision_warning);
  EXPECT_EQ(neither.slow_precision_warning->find("bfloat16 ("), std::string::npos)
      << *neither.slow_precision_warning;
  fs::remove_all(cache.parent_path());
  fs::remove_all(both_slow.parent_path());
}

} // namespace
} // namespace largo::train::run_peak_flops_test
