// run_in_shard_random_stream (core/shard_random_stream.h): two ranks with the same CPU
// generator state, simulated in one process by restoring it, draw different numbers in
// different streams and the same in the same stream, and leave the region with the CPU
// generator where one draw leaves it, however much each drew inside (also when it throws);
// on a GPU the region draws from the CUDA generator, which it leaves where it found it.
#include <largo/core/rng_state.h>
#include <largo/core/shard_random_stream.h>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <stdexcept>

namespace largo::shard_random_stream_test {
namespace {

// What `stream` draws in its region (`count` numbers) and the CPU generator's next draws after.
std::pair<at::Tensor, at::Tensor> draws(const at::Tensor& start, int64_t stream, int64_t count) {
  set_cpu_rng_state(start);
  at::Tensor inside = run_in_shard_random_stream(
      stream, at::Device(at::kCPU), [count] { return at::rand({count}, at::kDouble); });
  return {inside, at::rand({8}, at::kDouble)};
}

TEST(ShardRandomStream, StreamsDifferInsideAndAgreeAfter) {
  torch::manual_seed(3);
  const at::Tensor start = cpu_rng_state();
  const auto [stream0, after0] = draws(start, 0, 16);
  const auto [stream1, after1] = draws(start, 1, 1000); // another part's size: more draws
  const auto [again0, after_again] = draws(start, 0, 16);
  EXPECT_FALSE(at::equal(stream0, stream1.narrow(0, 0, 16)));
  EXPECT_TRUE(at::equal(stream0, again0)); // the same state and stream: the same numbers
  EXPECT_TRUE(at::equal(after0, after1));  // the shared stream is where both leave it
  EXPECT_TRUE(at::equal(after0, after_again));
  // ... which is one draw after the start, not where the region's own draws would leave it.
  set_cpu_rng_state(start);
  at::Tensor without_region = at::rand({8}, at::kDouble);
  EXPECT_FALSE(at::equal(after0, without_region));
  EXPECT_FALSE(at::equal(stream0, without_region.narrow(0, 0, 8)));
}

TEST(ShardRandomStream, GeneratorIsRestoredWhenTheRegionThrows) {
  torch::manual_seed(4);
  const at::Tensor start = cpu_rng_state();
  const at::Tensor after = draws(start, 2, 4).second;
  set_cpu_rng_state(start);
  EXPECT_THROW(
      run_in_shard_random_stream(
          2,
          at::Device(at::kCPU),
          []() -> at::Tensor {
            at::rand({100});
            throw std::runtime_error("region failed");
          }),
      std::runtime_error);
  EXPECT_TRUE(at::equal(at::rand({8}, at::kDouble), after));
}

// On CUDA the region reseeds the device's generator (a seed and an offset into Philox's
// stream) and puts it back: the streams differ inside, and the CUDA generator's next draws
// after the region are the ones it would have drawn without it.
TEST(ShardRandomStream, CudaStreamsDifferInsideAndTheCudaGeneratorIsRestored) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  const at::Device cuda(at::kCUDA, 0);
  torch::manual_seed(5); // seeds the CUDA generator too
  at::Generator cuda_generator = at::globalContext().defaultGenerator(cuda);
  const at::Tensor cpu_start = cpu_rng_state();
  const at::Tensor cuda_start = cuda_generator.get_state();
  auto region_on_cuda = [&](int64_t stream) {
    set_cpu_rng_state(cpu_start);
    return run_in_shard_random_stream(
        stream, cuda, [&] { return at::rand({64}, at::TensorOptions(cuda)).cpu(); });
  };
  const at::Tensor stream0 = region_on_cuda(0);
  const at::Tensor stream1 = region_on_cuda(1);
  EXPECT_FALSE(at::equal(stream0, stream1));
  EXPECT_TRUE(at::equal(stream0, region_on_cuda(0)));
  const at::Tensor after = at::rand({64}, at::TensorOptions(cuda)).cpu();
  cuda_generator.set_state(cuda_start);
  const at::Tensor without_region = at::rand({64}, at::TensorOptions(cuda)).cpu();
  EXPECT_TRUE(at::equal(after, without_region));
  EXPECT_FALSE(at::equal(stream0, without_region));
}

} // namespace
} // namespace largo::shard_random_stream_test
