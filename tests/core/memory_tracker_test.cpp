// The memory tracker counts the bytes of tensor storage exactly (CPU: the counting
// allocator), tracks their peak and measures windows.
#include <largo/core/error.h>
#include <largo/core/memory_tracker.h>

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::memory_tracker_test {
namespace {

TEST(MemoryTrackerTest, CountsCpuAllocationsAndFrees) {
  MemoryTracker tracker(torch::kCPU);
  EXPECT_TRUE(cpu_memory_counter_installed());
  const int64_t before = tracker.current_bytes();
  {
    at::Tensor a = torch::empty({1000}, torch::kFloat); // 4000 bytes
    EXPECT_EQ(tracker.current_bytes() - before, 4000);
    at::Tensor b = torch::empty({10, 10}, torch::kDouble); // 800 bytes
    EXPECT_EQ(tracker.current_bytes() - before, 4800);
  }
  EXPECT_EQ(tracker.current_bytes(), before);
}

TEST(MemoryTrackerTest, WindowsMeasureThePeakAboveTheirStart) {
  MemoryTracker tracker(torch::kCPU);
  at::Tensor held = torch::empty({256}, torch::kFloat); // live before the window: not counted
  tracker.start_window();
  EXPECT_EQ(tracker.window_peak_bytes(), 0);
  {
    at::Tensor big = torch::empty({1 << 20}, torch::kByte);
    at::Tensor small = torch::empty({1000}, torch::kByte);
    EXPECT_EQ(tracker.window_current_bytes(), (1 << 20) + 1000);
  }
  at::Tensor after = torch::empty({10}, torch::kByte);
  EXPECT_EQ(tracker.window_peak_bytes(), (1 << 20) + 1000);
  EXPECT_EQ(tracker.window_current_bytes(), 10);
  EXPECT_GE(tracker.peak_bytes(), tracker.current_bytes());

  tracker.start_window(); // a new window forgets the old peak
  EXPECT_EQ(tracker.window_peak_bytes(), 0);
}

TEST(MemoryTrackerTest, RawAllocateInterfaceStillWorks) {
  MemoryTracker tracker(torch::kCPU);
  const int64_t before = tracker.current_bytes();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* memory = allocator->raw_allocate(512);
  EXPECT_EQ(tracker.current_bytes() - before, 512);
  allocator->raw_deallocate(memory);
  EXPECT_EQ(tracker.current_bytes(), before);
}

// oneDNN allocates scratch memory through the raw interface and frees it through whichever
// CPU allocator is current then: memory served before the counter was installed must be
// handed to the allocator that served it (in its own process under CTest, this test
// allocates before the install).
TEST(MemoryTrackerTest, MemoryServedBeforeTheCounterIsFreedUncounted) {
  void* early = c10::GetCPUAllocator()->raw_allocate(4096);
  MemoryTracker tracker(torch::kCPU);
  const int64_t before = tracker.current_bytes();
  c10::GetCPUAllocator()->raw_deallocate(early);
  EXPECT_LE(tracker.current_bytes(), before);
  EXPECT_GE(tracker.current_bytes(), before - 4096);
}

TEST(MemoryTrackerTest, UnsupportedDeviceIsAClearError) {
  const torch::Device cuda(torch::kCUDA, 0);
  if (MemoryTracker::supported(cuda)) {
    GTEST_SKIP() << "this build measures CUDA memory";
  }
  try {
    MemoryTracker tracker(cuda);
    FAIL() << "expected largo::Error";
  } catch (const Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("cannot measure the memory of device cuda:0"),
        std::string::npos)
        << error.what();
  }
}

TEST(MemoryTrackerTest, CudaStatistics) {
  const torch::Device cuda(torch::kCUDA, 0);
  if (!MemoryTracker::supported(cuda)) {
    GTEST_SKIP() << "no CUDA device";
  }
  MemoryTracker tracker(cuda);
  tracker.start_window();
  {
    at::Tensor a = torch::empty({1 << 20}, torch::TensorOptions().device(cuda)); // 4 MiB
    EXPECT_GE(tracker.window_current_bytes(), 4 << 20);
  }
  EXPECT_GE(tracker.window_peak_bytes(), 4 << 20);
}

} // namespace
} // namespace largo::memory_tracker_test
