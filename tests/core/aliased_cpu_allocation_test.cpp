// AliasedCpuAllocation: inside the scope every CPU tensor is a view of one scratch file (what
// one writes, all read), the file is the largest allocation, and the allocator in place
// before comes back when the scope ends. That an estimate of a model built this way equals
// the estimate of the model built whole is tests/parallel/estimate/mesh_memory_estimate_test.
#include <largo/core/aliased_cpu_allocation.h>

#include <largo/core/error.h>
#include <largo/core/memory_tracker.h>
#include <largo/core/resources.h>

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <optional>

namespace largo::aliased_cpu_allocation_test {
namespace {

int64_t page_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t rounded_to_pages(int64_t bytes) {
  return (bytes + page_bytes() - 1) / page_bytes() * page_bytes();
}

TEST(AliasedCpuAllocationTest, EveryTensorInTheScopeSharesOneScratchFile) {
  const AliasedCpuAllocation scope;
  torch::Tensor first = torch::zeros({1000});
  torch::Tensor second = torch::empty({500}, torch::kDouble);
  first.fill_(3.0f);
  // second's 4,000 bytes are first's: eight floats of 3 read as one double each.
  torch::Tensor as_floats = torch::from_blob(second.data_ptr(), {1000}, torch::kFloat);
  EXPECT_TRUE(torch::equal(as_floats, torch::full({1000}, 3.0f)));
  EXPECT_EQ(scope.scratch_bytes(), page_bytes());
}

TEST(AliasedCpuAllocationTest, TheScratchIsTheLargestAllocationRoundedToPages) {
  const AliasedCpuAllocation scope;
  const int64_t mib = int64_t{1} << 20;
  {
    torch::Tensor small = torch::ones({mib / 4}); // 1 MiB
    torch::Tensor large = torch::ones({mib + 1}); // 4 MiB and 4 bytes
    torch::Tensor cast = large.to(torch::kHalf);  // 2 MiB, within the 4
  }
  EXPECT_EQ(scope.scratch_bytes(), rounded_to_pages(4 * mib + 4));
  torch::Tensor empty = torch::empty({0}); // no bytes, no mapping
  EXPECT_EQ(empty.numel(), 0);
}

TEST(AliasedCpuAllocationTest, TheAllocatorBeforeComesBackAndScopeTensorsStayValid) {
  c10::Allocator* before = c10::GetCPUAllocator();
  torch::Tensor from_scope;
  {
    const AliasedCpuAllocation scope;
    EXPECT_NE(c10::GetCPUAllocator(), before);
    from_scope = torch::full({64}, 7.0f);
  }
  EXPECT_EQ(c10::GetCPUAllocator(), before);
  torch::Tensor first = torch::zeros({64});
  torch::Tensor second = torch::ones({64});
  EXPECT_EQ(first.sum().item<float>(), 0.0f) << "tensors after the scope have their own memory";
  EXPECT_EQ(from_scope.sum().item<float>(), 7.0f * 64) << "a scope's tensor outlives it";
  from_scope.resize_({1 << 16}); // its storage grows through the allocator in place now
  from_scope.fill_(1.0f);
  EXPECT_EQ(from_scope.sum().item<float>(), static_cast<float>(1 << 16));
}

// oneDNN takes its scratch buffers through c10's raw interface, which needs the data pointer
// as the DataPtr's context.
TEST(AliasedCpuAllocationTest, TheRawInterfaceAllocatesAndFrees) {
  const AliasedCpuAllocation scope;
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* first = allocator->raw_allocate(10000);
  void* second = allocator->raw_allocate(100);
  static_cast<char*>(first)[0] = 42;
  EXPECT_EQ(static_cast<char*>(second)[0], 42) << "both map the scratch's first page";
  allocator->raw_deallocate(second);
  allocator->raw_deallocate(first);
  EXPECT_EQ(scope.scratch_bytes(), rounded_to_pages(10000));
}

// The pipeline estimate counts a forward's activations with the memory counter, which, when
// first installed inside the scope, wraps the scratch allocator and keeps counting after it.
// One installed before the scope (by a test that ran earlier in this process) does not see
// the scope's allocations, as the header says.
TEST(AliasedCpuAllocationTest, AMemoryCounterInstalledInsideCountsThereAndAfter) {
  const bool installed_before = cpu_memory_counter_installed();
  std::optional<MemoryTracker> tracker;
  {
    const AliasedCpuAllocation scope;
    tracker.emplace(torch::Device(torch::kCPU));
    tracker->start_window();
    torch::Tensor activations = torch::ones({1 << 18}); // 1 MiB
    if (installed_before) {
      EXPECT_EQ(tracker->window_peak_bytes(), 0) << "the scope's allocations bypass it";
    } else {
      EXPECT_GE(tracker->window_peak_bytes(), int64_t{1} << 20);
    }
  }
  tracker->start_window();
  torch::Tensor after = torch::zeros({1 << 18});
  torch::Tensor other = torch::ones({1 << 18});
  EXPECT_EQ(after.sum().item<float>(), 0.0f) << "own memory after the scope";
  EXPECT_GE(tracker->window_peak_bytes(), int64_t{2} << 20) << "counted after the scope";
}

// A counter installed inside a first scope wraps the scratch allocator for good; a second
// scope then replaces the counter and gives it back, and the chain still allocates (it
// looped forever when the scratch forwarded to the counter). When an earlier test installed
// the counter first, it never wraps the scratch and the chain is the plain one.
TEST(AliasedCpuAllocationTest, ASecondScopeAfterACounterWrappedTheFirstStillAllocates) {
  {
    const AliasedCpuAllocation first;
    install_cpu_memory_counter();
    torch::Tensor counted = torch::ones({16});
  }
  {
    const AliasedCpuAllocation second;
    torch::Tensor aliased = torch::ones({16});
    EXPECT_EQ(second.scratch_bytes(), page_bytes());
  }
  torch::Tensor after = torch::ones({1 << 16});
  EXPECT_EQ(after.sum().item<float>(), static_cast<float>(1 << 16));
}

TEST(AliasedCpuAllocationTest, ScopesDoNotNest) {
  const AliasedCpuAllocation scope;
  EXPECT_THROW(AliasedCpuAllocation(), Error);
}

TEST(AliasedCpuAllocationTest, AScratchLargerThanTheMemoryIsRefusedNamingWhatAsked) {
  const AliasedCpuAllocation scope;
  const AllocationContext context("building the model (a test's trunk)");
  try {
    torch::Tensor huge = torch::empty({int64_t{1} << 58}, torch::kByte); // 256 PiB
    FAIL() << "a 256 PiB scratch was allowed";
  } catch (const ResourceError& e) {
    EXPECT_NE(
        std::string(e.what()).find("building the model (a test's trunk) needs"), std::string::npos)
        << e.what();
  }
}

} // namespace
} // namespace largo::aliased_cpu_allocation_test
