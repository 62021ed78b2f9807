// SimCLR's InfoNCE loss against VISSL's formula (tests/reference/gen_simclr_loss_baselines.py,
// float64), on one process and at 2 ranks with the gradient through the gather; 2 ranks
// against 1 process on the same global batch.
#include <largo/comm/process_group.h>
#include <largo/core/error.h>
#include <largo/models/simclr_info_nce_loss.h>

#include "comm/distributed_test_util.h"
#include "model_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>

namespace largo::models::simclr_info_nce_loss_test {
namespace {

nlohmann::json baseline_case(const std::string& name) {
  return testing::baseline_case("simclr_loss_baselines.json", "gen_simclr_loss_baselines.py", name);
}

at::Tensor matrix(const nlohmann::json& rows) {
  return testing::json_matrix(rows);
}

// float64 on both sides; VISSL's way (exp, masked sums, log of a ratio) and Largo's (a
// logsumexp) differ by rounding only: each row's sum has 2N terms, so 1e-12 relative to the
// largest value (losses of a few units, gradients below 1) leaves a factor 1e3 of room, while
// a wrong positive or a kept self-similarity moves the loss by 1e-2 or more.
constexpr double kTolerance = 1e-12;

void expect_rank_matches(
    const nlohmann::json& rank_case, double temperature, comm::ProcessGroup& group) {
  at::Tensor embeddings = matrix(rank_case.at("embeddings")).requires_grad_();
  const at::Tensor loss = simclr_info_nce_loss(embeddings, group, {temperature});
  loss.backward();
  const double expected_loss = rank_case.at("loss");
  EXPECT_NEAR(loss.item<double>(), expected_loss, kTolerance * std::abs(expected_loss))
      << "rank " << group.rank();
  const at::Tensor expected_gradient = matrix(rank_case.at("gradient_of_sum"));
  const double scale = std::max(1.0, expected_gradient.abs().max().item<double>());
  EXPECT_LE((embeddings.grad() - expected_gradient).abs().max().item<double>(), kTolerance * scale)
      << "rank " << group.rank();
}

TEST(SimclrInfoNceLoss, OneProcessMatchesVissl) {
  for (const char* name : {"one_rank_t0_1", "one_rank_t0_5_unnormalised"}) {
    SCOPED_TRACE(name);
    const nlohmann::json entry = baseline_case(name);
    auto group = comm::ProcessGroup::single_process();
    expect_rank_matches(entry.at("ranks").at(0), entry.at("temperature"), *group);
  }
}

// Each rank's loss is VISSL's for that rank, and the gradient of its embeddings is that of the
// sum over ranks (through the gather's backward); their mean loss and the gradient divided by
// the world size are one process's on the whole batch (the same images in the file's
// one-rank case).
TEST(SimclrInfoNceLoss, TwoRanksMatchVisslAndOneProcess) {
  const nlohmann::json two = baseline_case("two_ranks_t0_1");
  const nlohmann::json one = baseline_case("one_rank_t0_1");
  double mean_loss = 0.0;
  for (const auto& rank_case : two.at("ranks")) {
    mean_loss += rank_case.at("loss").get<double>() / 2.0;
  }
  const double one_loss = one.at("ranks").at(0).at("loss");
  EXPECT_NEAR(mean_loss, one_loss, kTolerance * one_loss);
  // Rank r holds images 3r..3r+2: its rows i (view 0) and 3 + i (view 1) are the one
  // process's rows 3r + i and 6 + 3r + i; the sum of 2 ranks' means is twice the whole mean.
  const at::Tensor one_gradient = matrix(one.at("ranks").at(0).at("gradient_of_sum"));
  for (int64_t rank = 0; rank < 2; ++rank) {
    const at::Tensor summed = matrix(two.at("ranks").at(rank).at("gradient_of_sum"));
    const at::Tensor rows = torch::tensor(
        {3 * rank, 3 * rank + 1, 3 * rank + 2, 6 + 3 * rank, 7 + 3 * rank, 8 + 3 * rank});
    EXPECT_LE(
        (summed / 2 - one_gradient.index_select(0, rows)).abs().max().item<double>(), kTolerance)
        << "rank " << rank;
  }

  largo::testing::run_on_ranks(2, [&](comm::ProcessGroup& group) {
    expect_rank_matches(two.at("ranks").at(group.rank()), two.at("temperature"), group);
  });
}

TEST(SimclrInfoNceLoss, BadShapesAndTemperatureAreErrors) {
  auto group = comm::ProcessGroup::single_process();
  EXPECT_THROW(simclr_info_nce_loss(torch::randn({3, 4}), *group), Error);
  EXPECT_THROW(simclr_info_nce_loss(torch::randn({4}), *group), Error);
  EXPECT_THROW(simclr_info_nce_loss(torch::randn({4, 4}), *group, {0.0}), OptionError);
}

} // namespace
} // namespace largo::models::simclr_info_nce_loss_test
