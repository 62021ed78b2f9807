// Machine limits and the allocation guard: sizes beyond the memory are refused before any
// work, naming what asked, never by an out-of-memory kill.
#include <largo/core/resources.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

namespace largo::resources_test {
namespace {

std::string resource_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ResourceError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ResourceError";
  return "";
}

TEST(ResourcesTest, MachineFiguresArePlausible) {
  EXPECT_GE(available_cpu_cores(), 1);
  EXPECT_LE(available_cpu_cores(), static_cast<int64_t>(std::thread::hardware_concurrency()));
  EXPECT_GT(available_memory_bytes(), uint64_t{16} << 20);
  EXPECT_EQ(saturating_product({1u << 20, 1u << 20}), uint64_t{1} << 40);
  EXPECT_EQ(saturating_product({uint64_t{1} << 40, uint64_t{1} << 40}), UINT64_MAX);
}

TEST(ResourcesTest, RequireMemoryNamesWhatAsked) {
  EXPECT_NO_THROW(require_memory(1024, "a small thing"));
  const std::string message =
      resource_error([] { require_memory(uint64_t{1} << 60, "MODEL.TRUNK.MLP.HIDDEN_DIMS"); });
  EXPECT_NE(message.find("MODEL.TRUNK.MLP.HIDDEN_DIMS needs 1.00 EiB"), std::string::npos)
      << message;
  EXPECT_NE(message.find("this machine has"), std::string::npos) << message;
  EXPECT_NE(
      resource_error([] { require_memory(UINT64_MAX, "x"); }).find("more than 16 EiB"),
      std::string::npos);
}

TEST(ResourcesTest, GuardRefusesAnAllocationBeyondTheMemoryNamingItsContext) {
  install_allocation_guard();
  ASSERT_TRUE(allocation_guard_installed());
  std::string message = resource_error([] {
    AllocationContext outer("loading the data");
    AllocationContext inner("building the model (MODEL.TRUNK.*)");
    torch::empty({int64_t{1} << 50}, torch::kFloat); // 4 PiB
  });
  EXPECT_NE(message.find("building the model (MODEL.TRUNK.*) needs 4.00 PiB"), std::string::npos)
      << message;
  EXPECT_EQ(AllocationContext::current(), "");
}

TEST(ResourcesTest, GuardLetsOrdinaryAllocationsThrough) {
  install_allocation_guard();
  // Ordinary allocations go through, and are freed through the wrapped allocator.
  torch::Tensor big = torch::full({int64_t{20} << 20}, 2.0f); // 80 MiB: above the threshold
  EXPECT_EQ(big[-1].item<float>(), 2.0f);
}

} // namespace
} // namespace largo::resources_test
