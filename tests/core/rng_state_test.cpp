// Saving and restoring libtorch's CPU generator replays the same random numbers.
#include <largo/core/error.h>
#include <largo/core/rng_state.h>

#include <gtest/gtest.h>

namespace largo::rng_state_test {
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

// A checkpoint keeps every rank's state as a row of one [ranks, n] tensor; each rank restores
// its row, a view into the middle of that storage (which libtorch 2.11's set_state alone
// crashes on).
TEST(RngStateTest, ARowOfSavedStatesReplaysThatRanksDraws) {
  seed_everything(1);
  at::Tensor rank0 = cpu_rng_state();
  seed_everything(2);
  at::Tensor rank1 = cpu_rng_state();
  at::Tensor rank1_first = torch::rand({8});
  const at::Tensor saved = at::stack({rank0, rank1}); // [2, n]
  set_cpu_rng_state(saved[1]);
  EXPECT_TRUE(torch::equal(rank1_first, torch::rand({8})));
}

TEST(RngStateTest, SeedingMatchesPyTorchManualSeed) {
  // Generated with PyTorch (1.13 and 2.11 agree): torch.manual_seed(0); torch.rand(3).
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
} // namespace largo::rng_state_test
