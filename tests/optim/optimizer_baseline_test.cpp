// SGD, Adam, AdamW, RMSprop, LAMB, LARC (around SGD, AdamW and LAMB) and LARS replayed for 200
// steps against PyTorch (values from tests/reference/gen_optim_baselines.py: torch.optim for
// SGD, Adam, AdamW and RMSprop, tests/reference/reference_optimizers.py for LAMB, Apex's LARC
// and VISSL's LARS), Adam and RMSprop also for 20 steps in float32,
// each through both update paths: the fused CPU pass and the _foreach path (LARS has only
// the latter). Built with make_optimizer, so the
// factory is exercised too. Also global-norm clipping against torch.nn.utils.clip_grad_norm_.
#include "optim_test_util.h"

#include <largo/optim/grad_clipping.h>
#include <largo/optim/optimizer_factory.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <memory>

namespace largo::optim::optimizer_baseline_test {
namespace {

using testing::close;
using testing::initial_param;
using testing::sin_term;

// Tolerances, relative to max(1, |expected|), float64 parameters after 50..200 steps.
//
// _foreach path of SGD and AdamW: the same ATen ops in the same order as torch.optim, so on
// the same libtorch build the parameters are bitwise equal (checked with a tolerance of 0
// against Debian's torch 1.13); 1e-12 (~4500 ulp) only absorbs another kernel path (another
// CPU dispatch level, libtorch 2.x). A real mistake (a missing bias correction, L2 instead of
// decoupled decay, dampening on the first step) moves the parameters by 1e-4 or more.
constexpr double kSameOpsTolerance = 1e-12;
// Fused CPU pass of SGD and AdamW: the same expressions per element, but ATen's vectorized
// kernels round `a + alpha * b` once (a fused multiply-add on AVX2) where the fused pass
// rounds twice, so elements differ by an ulp now and then and the differences accumulate
// over 200 steps (measured on this machine: at most 3.8e-15); 1e-13 keeps a margin of 25.
constexpr double kFusedTolerance = 1e-13;
// LAMB and LARC, both paths: besides that rounding, the norms are sums in another order
// (chunked float64 partial sums instead of ATen's norm kernel), so trust ratios differ in
// the last bits (measured: at most 1.5e-15). 1e-13 is still 10^9 times smaller than the
// effect of a wrong branch (decay applied to a zero-gradient parameter, an excluded
// parameter scaled, clip mode ignored, a missing trust ratio: >= 1e-4 within 50 steps).
//
// LARS takes this tolerance too, by the same derivation: its ops are VISSL's, in its order,
// except ||p|| and ||dp||, which Largo sums in another order. A sum of n <= 12 float64
// squares is off by at most ~n ulp, so q = eta ||p|| / ||dp|| is off by at most ~3e-15
// relative, and each step's move by as much of itself; a parameter's error is then at most
// that times the sum of |move| over the run (errors fed back through later norms are of
// the same order): at most 2.1 for an adapted parameter in these cases (lars_zero_norms),
// so <= 7e-15, 1e-13 leaving a margin of 15. A wrong branch (q applied to an excluded
// parameter, eta ||p|| / 0, decay left out) moves a parameter by >= 1e-3 (the smallest
// change over a run, lars_default's, is 7e-3).
constexpr double kNormTolerance = 1e-13;
// Adam and RMSprop take kSameOpsTolerance and kFusedTolerance by the same derivation as
// AdamW and SGD: their _foreach paths are torch.optim's ops in its order, their fused passes
// the same expressions per element.
//
// float32 (Adam and RMSprop, 20 steps), at float32's unit roundoff u = 2^-24 = 6.0e-8. One
// step moves a parameter by Delta, |Delta| <= 0.03 in these cases (RMSprop's first step: lr
// 2e-3 times at most 1 / sqrt(1 - alpha) = 3.2, times 1 / (1 - momentum) = 2 with momentum;
// Adam's at most about lr = 1e-2). Two float32 implementations of the same expressions
// (PyTorch's vectorized kernels and Largo's fused pass or _foreach ops: a fused multiply-add,
// lerp's other form) compute Delta to within 2 k u |Delta| (k <= 10 rounded operations per
// element, doubled for the state's rounding carried from earlier steps) and may round p +
// Delta to neighbouring floats, 1 ulp <= 2 u |p| with |p| <= 0.75. A parameter's difference
// feeds back only through the gradient and the decay (0.05 p each): negligible. Over N = 20
// steps at most N (2 u 0.75 + 2 k u 0.03) = 2.5e-6: 5e-6 allowed (float32 PyTorch itself is
// 1.4e-7 from float64 PyTorch here). A real mistake moves a parameter by >= 1e-4 within 20
// steps (RMSprop's decay left out: 1.1e-4; Adam's L2 decay taken as decoupled: 5.9e-3;
// centered or momentum ignored: > 0.06).
constexpr double kFloat32Tolerance = 5e-6;

struct Case {
  std::string name;
  bool fused = true;
};

std::string case_label(const ::testing::TestParamInfo<Case>& info) {
  return info.param.name + (info.param.fused ? "_fused" : "_foreach");
}

OptimizerSpec spec_from(const nlohmann::json& json, bool fused) {
  OptimizerSpec spec;
  const std::string type = json["type"];
  spec.name = type == "larc" ? json["inner"].get<std::string>() : type;
  const auto& options = json["options"];
  if (spec.name == "sgd") {
    spec.sgd.momentum = options["momentum"];
    spec.sgd.dampening = options["dampening"];
    spec.sgd.nesterov = options["nesterov"];
  } else if (spec.name == "adam" || spec.name == "adamw") {
    AdamOptions& adam = spec.name == "adam" ? spec.adam : spec.adamw;
    adam.betas = {options["betas"][0], options["betas"][1]};
    adam.eps = options["eps"];
    adam.amsgrad = options["amsgrad"];
  } else if (spec.name == "rmsprop") {
    spec.rmsprop.alpha = options["alpha"];
    spec.rmsprop.eps = options["eps"];
    spec.rmsprop.momentum = options["momentum"];
    spec.rmsprop.centered = options["centered"];
  } else if (spec.name == "lars") {
    spec.lars.momentum = options["momentum"];
    spec.lars.eta = options["eta"];
    // As the trainer fills it for OPTIMIZER.exclude_bias_and_norm: the 1-D parameters.
    const auto shapes = json["param_shapes"].get<std::vector<std::vector<int64_t>>>();
    for (size_t k = 0; k < shapes.size(); ++k) {
      if (options["exclude_bias_and_norm"].get<bool>() && shapes[k].size() == 1) {
        spec.lars.excluded_from_adaptation.insert(fmt::format("p{}", k));
      }
    }
  } else {
    spec.lamb.betas = {options["betas"][0], options["betas"][1]};
    spec.lamb.eps = options["eps"];
  }
  spec.sgd.fused = spec.adam.fused = spec.adamw.fused = spec.rmsprop.fused = fused;
  spec.lamb.fused = spec.larc.fused = fused;
  if (type == "larc") {
    spec.use_larc = true;
    spec.larc.trust_coefficient = json["larc"]["trust_coefficient"];
    spec.larc.clip = json["larc"]["clip"];
    spec.larc.eps = json["larc"]["eps"];
    for (int64_t k : json.value("excluded_params", std::vector<int64_t>{})) {
      spec.larc.excluded_from_adaptation.insert(fmt::format("p{}", k));
    }
  }
  return spec;
}

class OptimizerBaselineTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerBaselineTest, MatchesPyTorch) {
  const Case& test_case = GetParam();
  const nlohmann::json baselines = testing::load_baselines();
  const nlohmann::json* spec = nullptr;
  for (const auto& candidate : baselines.at("optimizers")) {
    if (candidate["name"] == test_case.name) {
      spec = &candidate;
    }
  }
  ASSERT_NE(spec, nullptr) << "no baseline named " << test_case.name;

  const auto shapes = (*spec)["param_shapes"].get<std::vector<std::vector<int64_t>>>();
  const auto zero_init = spec->value("zero_init_params", std::vector<int64_t>{});
  const auto zero_grad = spec->value("zero_grad_params", std::vector<int64_t>{});
  auto listed = [](const std::vector<int64_t>& list, size_t k) {
    return std::find(list.begin(), list.end(), static_cast<int64_t>(k)) != list.end();
  };
  // Computed in float64, then rounded to the case's dtype, as the Python side does.
  const bool float32 = spec->value("dtype", "float64") == "float32";
  const auto dtype = float32 ? torch::kFloat32 : torch::kFloat64;
  std::vector<at::Tensor> params;
  for (size_t k = 0; k < shapes.size(); ++k) {
    at::Tensor p = listed(zero_init, k) ? torch::zeros(shapes[k], torch::kFloat64)
                                        : initial_param(static_cast<int64_t>(k), shapes[k]);
    params.push_back(p.to(dtype).requires_grad_());
  }
  std::vector<ParamGroup> groups;
  for (const auto& group_spec : (*spec)["groups"]) {
    ParamGroup group;
    group.lr = group_spec["lr"];
    group.weight_decay = group_spec["weight_decay"];
    for (int64_t k : group_spec["params"]) {
      group.params.push_back(params[static_cast<size_t>(k)]);
      group.names.push_back(fmt::format("p{}", k));
    }
    groups.push_back(std::move(group));
  }
  auto optimizer = make_optimizer(std::move(groups), spec_from(*spec, test_case.fused));
  const std::string type = (*spec)["type"];
  EXPECT_EQ(optimizer->type(), type == "larc" ? (*spec)["inner"].get<std::string>() : type);
  const bool norms = type == "larc" || type == "lamb" || type == "lars";
  const double tolerance = float32 ? kFloat32Tolerance
                           : norms ? kNormTolerance
                                   : (test_case.fused ? kFusedTolerance : kSameOpsTolerance);

  const auto& group_specs = (*spec)["groups"];
  const double lr_decay = (*spec)["lr_decay_per_step"];
  const int64_t num_steps = (*spec)["num_steps"];
  ASSERT_GE(num_steps, float32 ? 20 : 200);
  size_t next_record = 0;
  double worst = 0.0; // largest relative deviation seen, reported below
  const auto& records = (*spec)["records"];
  for (int64_t step = 1; step <= num_steps; ++step) {
    for (size_t g = 0; g < group_specs.size(); ++g) {
      optimizer->param_groups()[g].lr =
          group_specs[g]["lr"].get<double>() * (1.0 - lr_decay * static_cast<double>(step - 1));
    }
    for (size_t k = 0; k < params.size(); ++k) {
      params[k].mutable_grad() =
          listed(zero_grad, k)
              ? torch::zeros_like(params[k])
              : params[k].detach() * 0.05 +
                    sin_term(step, static_cast<int64_t>(k), params[k].sizes()).to(dtype);
    }
    optimizer->step();
    if (next_record < records.size() && records[next_record]["step"] == step) {
      const auto& expected = records[next_record]["params"];
      for (size_t k = 0; k < params.size(); ++k) {
        const at::Tensor flat = params[k].detach().to(torch::kFloat64).reshape(-1).contiguous();
        const auto* actual = flat.data_ptr<double>();
        ASSERT_EQ(static_cast<size_t>(flat.numel()), expected[k].size());
        for (size_t i = 0; i < expected[k].size(); ++i) {
          const double want = expected[k][i];
          worst = std::max(worst, std::abs(actual[i] - want) / std::max(1.0, std::abs(want)));
          ASSERT_TRUE(close(actual[i], want, tolerance))
              << test_case.name << " step " << step << " param " << k << " element " << i
              << ": got " << actual[i] << ", PyTorch gives " << want;
        }
      }
      ++next_record;
    }
  }
  EXPECT_EQ(next_record, records.size()) << "not every recorded step was compared";
  EXPECT_EQ(records.size(), 4U);
  RecordProperty("largest_relative_deviation", fmt::format("{:.3g}", worst));
  std::cout << test_case.name << (test_case.fused ? " fused" : " foreach")
            << ": largest relative deviation from PyTorch " << worst << "\n";
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* name :
       {"sgd_plain",
        "sgd_momentum_weight_decay",
        "sgd_nesterov",
        "sgd_dampening",
        "adamw_default",
        "adamw_amsgrad_weight_decay",
        "adam_default",
        "adam_amsgrad_weight_decay",
        "adam_small_beta1",
        "rmsprop_default",
        "rmsprop_vissl_defaults",
        "rmsprop_centered_momentum_weight_decay",
        "adam_amsgrad_weight_decay_float32",
        "rmsprop_centered_momentum_weight_decay_float32",
        "lamb_default",
        "lamb_weight_decay",
        "lamb_zero_norm",
        "larc_sgd_clip",
        "larc_sgd_scale",
        "larc_sgd_zero_norms",
        "larc_sgd_excluded",
        "larc_adamw_scale",
        "larc_lamb_clip"}) {
    cases.push_back({name, true});
    cases.push_back({name, false});
  }
  // One path: labelled _foreach, which it is.
  for (const char* name : {"lars_default", "lars_excluded_weight_decay", "lars_zero_norms"}) {
    cases.push_back({name, false});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(PyTorch, OptimizerBaselineTest, ::testing::ValuesIn(all_cases()), case_label);

// clip_grad_norm against torch.nn.utils.clip_grad_norm_: the total norm and the clipped
// gradients. PyTorch takes the norm of per-tensor norms, Largo one sum of |g|^p over all
// elements (what sharded partial sums need): the same value up to rounding, 1e-13 relative.
TEST(GradClipping, MatchesTorchClipGradNorm) {
  const nlohmann::json baselines = testing::load_baselines();
  ASSERT_GE(baselines.at("clipping").size(), 5U);
  for (const auto& c : baselines.at("clipping")) {
    const auto shapes = c["param_shapes"].get<std::vector<std::vector<int64_t>>>();
    const double norm_type = c["norm_type"].is_string() ? std::numeric_limits<double>::infinity()
                                                        : c["norm_type"].get<double>();
    for (bool cpu_kernel : {true, false}) {
      std::vector<at::Tensor> params;
      for (size_t k = 0; k < shapes.size(); ++k) {
        const auto kk = static_cast<int64_t>(k);
        at::Tensor grad = (initial_param(kk, shapes[k]) * 0.05 + sin_term(c["step"], kk, shapes[k])) *
            c["grad_scale"].get<double>();
        if (!cpu_kernel) { // a strided (not dense) view takes the ATen path
          grad = at::stack({grad, grad}, -1).select(-1, 0);
        }
        params.push_back(torch::zeros(shapes[k], torch::kFloat64).requires_grad_());
        params.back().mutable_grad() = grad;
      }
      const double total = clip_grad_norm(params, c["max_norm"], norm_type);
      EXPECT_TRUE(close(total, c["total_norm"], 1e-13)) << c["name"] << ": " << total;
      for (size_t k = 0; k < params.size(); ++k) {
        const at::Tensor flat = params[k].grad().reshape(-1).contiguous();
        for (int64_t i = 0; i < flat.numel(); ++i) {
          const double want = c["clipped"][k][static_cast<size_t>(i)];
          ASSERT_TRUE(close(flat[i].item<double>(), want, 1e-13))
              << c["name"] << " param " << k << " element " << i;
        }
      }
    }
  }
}

} // namespace
} // namespace largo::optim::optimizer_baseline_test
