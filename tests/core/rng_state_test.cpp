// Saving and restoring libtorch's CPU generator replays the same random numbers.
#include <largo/core/error.h>
#include <largo/core/rng_state.h>

#include <gtest/gtest.h>

namespace largo {
namespace {

TEST(RngStateTest, RestoredStateReplaysTheSameDraws) {
  seed_everything(123);
  at::Tensor state = cpu_rng_state();
  at::Tensor first = torch::rand({16});
  at::Tensor dropout_mask = torch::dropout(torch::ones({32}), 0.5, /*train=*/true);
  set_cpu_rng_state(state);
  EXPECT_TRUE(torch::equal(first, torch::rand({16})));
  EXPECT_TRUE(torch::equal(dropout_mask, torch::dropout(torch::ones({32}), 0.5, true)));
}

TEST(RngStateTest, SeedingMatchesPyTorchManualSeed) {
  // Generated with /usr/bin/python3 (torch 1.13): torch.manual_seed(0); torch.rand(3).
  // Same generator, same seed: the C++ draws must be the same floats.
  seed_everything(0);
  at::Tensor values = torch::rand({3});
  EXPECT_FLOAT_EQ(values[0].item<float>(), 0.49625658988952637f);
  EXPECT_FLOAT_EQ(values[1].item<float>(), 0.7682217955589294f);
  EXPECT_FLOAT_EQ(values[2].item<float>(), 0.08847743272781372f);
}

TEST(RngStateTest, RejectsAStateThatIsNotOne) {
  EXPECT_THROW(set_cpu_rng_state(torch::zeros({4}, torch::kFloat)), CheckpointError);
}

} // namespace
} // namespace largo
