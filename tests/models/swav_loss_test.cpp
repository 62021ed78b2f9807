// SwAV's loss against a transcription of VISSL's (tests/reference/gen_swav_loss_baselines.py):
// float32 and double-precision Sinkhorn, a queue, hard assignments; 2 ranks against 1 process.
#include <largo/comm/process_group.h>
#include <largo/core/error.h>
#include <largo/models/swav_loss.h>

#include "comm/distributed_test_util.h"
#include "model_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>

namespace largo::models::swav_loss_test {
namespace {

nlohmann::json baseline_case(const std::string& name) {
  return testing::baseline_case("swav_loss_baselines.json", "gen_swav_loss_baselines.py", name);
}

// The file's float32 values, exactly (each was a float32 before it was written as a double).
at::Tensor float_matrix(const nlohmann::json& rows) {
  return testing::json_matrix(rows).to(torch::kFloat32);
}

SwavLossOptions options_of(const nlohmann::json& entry) {
  const nlohmann::json& o = entry.at("options");
  SwavLossOptions options;
  options.temperature = o.at("temperature");
  options.epsilon = o.at("epsilon");
  options.num_iters = o.at("num_iters");
  options.num_crops = o.at("num_crops");
  options.crops_for_assign = o.at("crops_for_assign").get<std::vector<int64_t>>();
  options.use_double_precision = o.at("use_double_precision");
  return options;
}

// The assignments and the loss are float32 in VISSL's code and here (also with double-precision
// Sinkhorn), computed by the same ATen kernels; what may differ is the order of a few float32
// sums (Sinkhorn's row and column sums over at most 14 entries, 3 iterations; the loss's sums
// over K ≤ 7 prototypes and n ≤ 8 images): a few dozen roundings of 2^-24 (6e-8) each, so
// 1e-5 relative to max(1, |value|) bounds it with room, while a wrong assignment or a missed
// crop changes the loss by 1e-2 or more.
constexpr double kTolerance = 1e-5;

double max_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

struct LossAndGradient {
  double loss;
  at::Tensor gradient;
};

LossAndGradient
run(const at::Tensor& scores_value,
    comm::ProcessGroup& group,
    const SwavLossOptions& options,
    const std::vector<at::Tensor>& queue,
    bool hard) {
  at::Tensor scores = scores_value.clone().requires_grad_();
  at::Tensor loss = swav_loss(scores, group, options, queue, hard);
  loss.backward();
  return {loss.item<double>(), scores.grad()};
}

TEST(SwavLoss, OneProcessMatchesVissl) {
  for (const char* name : {"two_crops", "four_crops_double_with_queue", "three_crops_hard"}) {
    SCOPED_TRACE(name);
    const nlohmann::json entry = baseline_case(name);
    std::vector<at::Tensor> queue;
    for (const auto& scores : entry.at("queue_scores")) {
      queue.push_back(float_matrix(scores));
    }
    auto group = comm::ProcessGroup::single_process();
    const LossAndGradient result =
        run(float_matrix(entry.at("scores")),
            *group,
            options_of(entry),
            queue,
            entry.at("hard_assignment"));
    const double expected = entry.at("loss");
    EXPECT_NEAR(result.loss, expected, kTolerance * std::max(1.0, std::abs(expected)));
    const at::Tensor expected_gradient = float_matrix(entry.at("gradient"));
    EXPECT_LE(
        max_difference(result.gradient, expected_gradient),
        kTolerance * std::max(1.0, expected_gradient.abs().max().item<double>()));
  }
}

// Rank r holds images [h r, h (r + 1)) of every crop (h = n / 2). Sinkhorn's sums and the
// maximum score are all-reduced, so its assignments are the one process's: the ranks' mean
// loss is the one process's, and each rank's gradient (over its own images only) is twice the
// one process's rows (a mean over half the images).
TEST(SwavLoss, TwoRanksEqualOneProcess) {
  for (const char* name : {"two_crops", "three_crops_hard"}) {
    SCOPED_TRACE(name);
    const nlohmann::json entry = baseline_case(name);
    const SwavLossOptions options = options_of(entry);
    const bool hard = entry.at("hard_assignment");
    const at::Tensor scores = float_matrix(entry.at("scores"));
    auto single = comm::ProcessGroup::single_process();
    const LossAndGradient whole = run(scores, *single, options, {}, hard);
    const int64_t images = scores.size(0) / options.num_crops;
    ASSERT_EQ(images % 2, 0) << "the case's images must split evenly over 2 ranks";
    const int64_t half = images / 2;
    auto rows_of = [&](int64_t rank) {
      std::vector<int64_t> rows;
      for (int64_t crop = 0; crop < options.num_crops; ++crop) {
        for (int64_t i = 0; i < half; ++i) {
          rows.push_back(crop * images + rank * half + i);
        }
      }
      return torch::tensor(rows);
    };
    largo::testing::run_on_ranks(2, [&](comm::ProcessGroup& group) {
      const at::Tensor rows = rows_of(group.rank());
      const LossAndGradient part = run(scores.index_select(0, rows), group, options, {}, hard);
      at::Tensor mean_loss = torch::tensor({part.loss / 2}, torch::kFloat64);
      group.all_reduce(mean_loss);
      EXPECT_NEAR(mean_loss.item<double>(), whole.loss, kTolerance * std::max(1.0, whole.loss));
      EXPECT_LE(
          max_difference(part.gradient / 2, whole.gradient.index_select(0, rows)), kTolerance);
    });
  }
}

TEST(SwavLoss, BadOptionsAndShapesAreErrors) {
  auto group = comm::ProcessGroup::single_process();
  const at::Tensor scores = torch::randn({8, 3});
  SwavLossOptions options;
  options.crops_for_assign = {0, 2};
  EXPECT_THROW(swav_loss(scores, *group, options), OptionError);
  options = {};
  options.epsilon = 0;
  EXPECT_THROW(swav_loss(scores, *group, options), OptionError);
  options = {};
  options.num_crops = 3; // 8 rows are not 3 crops
  EXPECT_THROW(swav_loss(scores, *group, options), Error);
  EXPECT_THROW(swav_loss(scores, *group, {}, {torch::randn({2, 3})}), Error); // 1 queue, 2 crops
}

} // namespace
} // namespace largo::models::swav_loss_test
