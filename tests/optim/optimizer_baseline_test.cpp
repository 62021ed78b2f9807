// SGD and AdamW replayed against torch.optim (values from tests/reference/gen_optim_baselines.py).
#include "optim_test_util.h"

#include <largo/optim/adamw.h>
#include <largo/optim/sgd.h>

#include <fmt/format.h>

#include <memory>

namespace largo::optim {
namespace {

using testing::close;
using testing::make_params;
using testing::set_grads;

// The update uses the same ATen ops in the same order as torch.optim, so on the same libtorch
// build the parameters come out bitwise equal (checked with a tolerance of 0 against Debian's
// torch 1.13). 1e-12 relative (~4500 ulp) only absorbs a
// different kernel path (another CPU dispatch level, libtorch 2.x); a real mistake (a missing
// bias correction, L2 instead of decoupled decay, dampening on the first step) changes the
// parameters by 1e-4 or more within 200 steps.
constexpr double kRelativeTolerance = 1e-12;

std::unique_ptr<Optimizer>
make_optimizer(const nlohmann::json& spec, const std::vector<at::Tensor>& params) {
  std::vector<ParamGroup> groups;
  for (const auto& group_spec : spec["groups"]) {
    ParamGroup group;
    group.lr = group_spec["lr"];
    group.weight_decay = group_spec["weight_decay"];
    for (int64_t k : group_spec["params"]) {
      group.params.push_back(params[k]);
      group.names.push_back(fmt::format("p{}", k));
    }
    groups.push_back(std::move(group));
  }
  const auto& options = spec["options"];
  if (spec["type"] == "sgd") {
    SGDOptions sgd;
    sgd.momentum = options["momentum"];
    sgd.dampening = options["dampening"];
    sgd.nesterov = options["nesterov"];
    return std::make_unique<SGD>(std::move(groups), sgd);
  }
  AdamWOptions adamw;
  adamw.betas = {options["betas"][0], options["betas"][1]};
  adamw.eps = options["eps"];
  adamw.amsgrad = options["amsgrad"];
  return std::make_unique<AdamW>(std::move(groups), adamw);
}

class OptimizerBaselineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerBaselineTest, MatchesTorchOptim) {
  const nlohmann::json baselines = testing::load_baselines();
  const nlohmann::json* spec = nullptr;
  for (const auto& candidate : baselines.at("optimizers")) {
    if (candidate["name"] == GetParam()) {
      spec = &candidate;
    }
  }
  ASSERT_NE(spec, nullptr) << "no baseline named " << GetParam();

  std::vector<at::Tensor> params =
      make_params((*spec)["param_shapes"].get<std::vector<std::vector<int64_t>>>());
  auto optimizer = make_optimizer(*spec, params);
  EXPECT_EQ(optimizer->type(), (*spec)["type"]);
  const auto& group_specs = (*spec)["groups"];
  const double lr_decay = (*spec)["lr_decay_per_step"];
  const int64_t num_steps = (*spec)["num_steps"];
  ASSERT_GE(num_steps, 200);

  size_t next_record = 0;
  const auto& records = (*spec)["records"];
  for (int64_t step = 1; step <= num_steps; ++step) {
    for (size_t g = 0; g < group_specs.size(); ++g) {
      optimizer->param_groups()[g].lr =
          group_specs[g]["lr"].get<double>() * (1.0 - lr_decay * static_cast<double>(step - 1));
    }
    set_grads(params, step);
    optimizer->step();
    if (next_record < records.size() && records[next_record]["step"] == step) {
      const auto& expected = records[next_record]["params"];
      for (size_t k = 0; k < params.size(); ++k) {
        const at::Tensor flat = params[k].detach().reshape(-1).contiguous();
        const auto* actual = flat.data_ptr<double>();
        ASSERT_EQ(static_cast<size_t>(flat.numel()), expected[k].size());
        for (size_t i = 0; i < expected[k].size(); ++i) {
          const double want = expected[k][i];
          ASSERT_TRUE(close(actual[i], want, kRelativeTolerance))
              << GetParam() << " step " << step << " param " << k << " element " << i << ": got "
              << actual[i] << ", torch.optim gives " << want;
        }
      }
      ++next_record;
    }
  }
  EXPECT_EQ(next_record, records.size()) << "not every recorded step was compared";
  EXPECT_EQ(records.size(), 4U);
}

INSTANTIATE_TEST_SUITE_P(
    Torch,
    OptimizerBaselineTest,
    ::testing::Values(
        "sgd_plain",
        "sgd_momentum_weight_decay",
        "sgd_nesterov",
        "sgd_dampening",
        "adamw_default",
        "adamw_amsgrad_weight_decay"),
    [](const auto& info) { return info.param; });

} // namespace
} // namespace largo::optim
