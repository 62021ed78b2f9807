// Barlow Twins' loss against VISSL's formula (tests/reference/gen_barlow_twins_loss_baselines.py,
// float64, VISSL's collectives played out over simulated ranks), on one process and at 2 ranks:
// every rank's loss and the gradient its own backward gives its embeddings.
#include <largo/comm/process_group.h>
#include <largo/core/error.h>
#include <largo/models/barlow_twins_loss.h>

#include "comm/distributed_test_util.h"
#include "model_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>

namespace largo::models::barlow_twins_loss_test {
namespace {

nlohmann::json baseline_case(const std::string& name) {
  return testing::baseline_case(
      "barlow_twins_loss_baselines.json", "gen_barlow_twins_loss_baselines.py", name);
}

// float64 on both sides and the same operations in the same order but for the sums inside
// ATen's kernels (the batch means, the d x d products over 2n rows, the d^2 squares): each
// is a sum of at most a few dozen terms of order 1, so the two agree to a few 1e-16 relative;
// 1e-12 leaves room for every CPU's summation order, while a wrong normalisation (per view
// instead of both views, the unbiased variance) or a gradient summed over the ranks moves the
// values by 1e-3 or more.
constexpr double kTolerance = 1e-12;

void expect_rank_matches(const nlohmann::json& entry, int rank, comm::ProcessGroup& group) {
  const nlohmann::json& rank_case = entry.at("ranks").at(rank);
  at::Tensor embeddings = testing::json_matrix(rank_case.at("embeddings")).requires_grad_();
  BarlowTwinsLossOptions options;
  options.lambda = entry.at("lambda");
  options.scale_loss = entry.at("scale_loss");
  const at::Tensor loss = barlow_twins_loss(embeddings, group, options);
  loss.backward();
  const double expected_loss = rank_case.at("loss");
  EXPECT_NEAR(loss.item<double>(), expected_loss, kTolerance * std::abs(expected_loss))
      << "rank " << rank;
  const at::Tensor expected_gradient = testing::json_matrix(rank_case.at("gradient"));
  const double scale = std::max(1e-3, expected_gradient.abs().max().item<double>());
  EXPECT_LE((embeddings.grad() - expected_gradient).abs().max().item<double>(), kTolerance * scale)
      << "rank " << rank;
}

TEST(BarlowTwinsLoss, OneProcessMatchesVissl) {
  for (const char* name : {"one_rank", "one_rank_lambda_0_5"}) {
    SCOPED_TRACE(name);
    auto group = comm::ProcessGroup::single_process();
    expect_rank_matches(baseline_case(name), 0, *group);
  }
}

// Both ranks' losses are the one process's on the whole batch (the file's one-rank case holds
// the same images), and each rank's gradient is VISSL's: the rows of the one process's.
TEST(BarlowTwinsLoss, TwoRanksMatchVissl) {
  const nlohmann::json two = baseline_case("two_ranks");
  const double one_loss = baseline_case("one_rank").at("ranks").at(0).at("loss");
  for (const auto& rank_case : two.at("ranks")) {
    EXPECT_NEAR(rank_case.at("loss").get<double>(), one_loss, kTolerance * one_loss);
  }
  largo::testing::run_on_ranks(
      2, [&](comm::ProcessGroup& group) { expect_rank_matches(two, group.rank(), group); });
}

TEST(BarlowTwinsLoss, BadShapesAndOptionsAreErrors) {
  auto group = comm::ProcessGroup::single_process();
  EXPECT_THROW(barlow_twins_loss(torch::randn({3, 4}), *group), Error);
  EXPECT_THROW(barlow_twins_loss(torch::randn({4}), *group), Error);
  BarlowTwinsLossOptions negative;
  negative.lambda = -1.0;
  EXPECT_THROW(barlow_twins_loss(torch::randn({4, 4}), *group, negative), OptionError);
  BarlowTwinsLossOptions zero_scale;
  zero_scale.scale_loss = 0.0;
  EXPECT_THROW(barlow_twins_loss(torch::randn({4, 4}), *group, zero_scale), OptionError);
}

} // namespace
} // namespace largo::models::barlow_twins_loss_test
