// MODEL.CUDA_CACHE's hook (train/device_cache_hook.h): the CUDA caching allocator's unused
// blocks go back to the driver before every `every`-th iteration and at no other; a CPU run
// has nothing to empty.
#include <largo/core/error.h>
#include <largo/train/device_cache_hook.h>

#include <ATen/DeviceAccelerator.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

namespace largo::train::device_cache_hook_test {
namespace {

// The hook after the step that moved the run to `iteration`.
void step_to(DeviceCacheHook& hook, int64_t iteration) {
  checkpoint::TrainingProgress progress;
  progress.iteration = iteration;
  const StepResult step;
  hook.on_step_end(StepEvent{progress, step, {step}, 0.0, std::nullopt, std::nullopt});
}

TEST(DeviceCacheHookTest, RefusesAFrequencyBelowOne) {
  EXPECT_THROW(DeviceCacheHook(torch::kCPU, 0), OptionError);
}

TEST(DeviceCacheHookTest, EmptiesNothingOnTheCpu) {
  DeviceCacheHook hook(torch::kCPU, 2);
  for (int64_t iteration = 1; iteration <= 6; ++iteration) {
    step_to(hook, iteration);
  }
  EXPECT_EQ(hook.times_emptied(), 0);
}

// The bytes the allocator has reserved from the driver drop when a freed block is handed back.
TEST(DeviceCacheHookTest, CudaCacheIsEmptiedBeforeEveryNthIterationOnly) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  const torch::Device device(torch::kCUDA, 0);
  auto reserved = [] {
    return at::accelerator::getDeviceStats(0).reserved_bytes[0].current; // aggregate
  };
  DeviceCacheHook hook(device, 3);
  { auto block = torch::empty({64 << 20}, torch::TensorOptions().device(device)); }
  const int64_t cached = reserved();
  ASSERT_GE(cached, int64_t{64} << 20) << "the freed 64 MiB block stays cached";
  step_to(hook, 2); // not a multiple of 3: nothing happens
  EXPECT_EQ(hook.times_emptied(), 0);
  EXPECT_EQ(reserved(), cached);
  step_to(hook, 3);
  EXPECT_EQ(hook.times_emptied(), 1);
  EXPECT_LE(reserved(), cached - (int64_t{64} << 20));
}

} // namespace
} // namespace largo::train::device_cache_hook_test
