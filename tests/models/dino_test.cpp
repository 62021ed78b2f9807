// DINO's head, loss, teacher temperature, teacher momentum and teacher EMA against VISSL's
// code transcribed in PyTorch (tests/reference/gen_dino_baselines.py): the head's initial
// state from the same seed, its scores and gradients, the loss and its center over several
// iterations on one process and on 2 ranks (the center averaged over both), the cosine
// momentum and one EMA step.
//
// The float32 tolerances rest on this: both sides run the same ATen kernels on the same float32
// values, so elementwise operations (exp, GELU, erfinv, the scalings) round alike and only the
// order of reductions may differ (matmuls, softmax sums, means, the all-reduce). A sum of L
// terms in another order differs by at most ~L·u of the sum of magnitudes (u = 2^-24 = 6e-8).
#include <largo/comm/process_group.h>
#include <largo/core/error.h>
#include <largo/models/dino_head.h>
#include <largo/models/dino_loss.h>
#include <largo/models/dino_teacher_momentum.h>
#include <largo/models/dino_teacher_update.h>

#include "comm/distributed_test_util.h"
#include "model_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

namespace largo::models::dino_test {
namespace {

nlohmann::json baseline_case(const std::string& name) {
  return testing::baseline_case("dino_baselines.json", "gen_dino_baselines.py", name);
}

void flatten_into(const nlohmann::json& value, std::vector<double>& out) {
  if (value.is_array()) {
    for (const auto& item : value) {
      flatten_into(item, out);
    }
  } else {
    out.push_back(value.get<double>());
  }
}

// A nested JSON list (or number) as a tensor of `like`'s shape and dtype.
at::Tensor json_like(const nlohmann::json& value, const at::Tensor& like) {
  std::vector<double> values;
  flatten_into(value, values);
  return torch::tensor(values, torch::kFloat64).reshape(like.sizes()).to(like.dtype());
}

// A JSON list of rows as float32 (the reference's dtype).
at::Tensor rows(const nlohmann::json& value) {
  return testing::json_matrix(value).to(at::kFloat);
}

double max_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

double max_abs(const at::Tensor& a) {
  return a.to(at::kDouble).abs().max().item<double>();
}

DinoHeadOptions head_options(const nlohmann::json& json) {
  DinoHeadOptions options;
  options.in_dim = json.at("in_dim");
  options.num_clusters = json.at("num_clusters");
  options.use_bn = json.value("use_bn", false);
  options.normalize_last_layer = json.value("normalize_last_layer", true);
  options.num_layers = json.value("num_layers", int64_t{3});
  options.hidden_dim = json.value("hidden_dim", int64_t{2048});
  options.bottleneck_dim = json.value("bottleneck_dim", int64_t{256});
  return options;
}

// The module's parameters and buffers by name (its state dict's names).
std::vector<std::pair<std::string, at::Tensor>> state_of(torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : module.named_parameters()) {
    state.emplace_back(item.key(), item.value());
  }
  for (const auto& item : module.named_buffers()) {
    state.emplace_back(item.key(), item.value());
  }
  return state;
}

// Every tensor of the module set from the reference's state dict; the names must be VISSL's.
void load_state(torch::nn::Module& module, const nlohmann::json& state) {
  torch::NoGradGuard no_grad;
  std::set<std::string> names;
  for (auto& [name, tensor] : state_of(module)) {
    ASSERT_TRUE(state.contains(name)) << name << " is not one of VISSL's names";
    tensor.copy_(json_like(state.at(name), tensor));
    names.insert(name);
  }
  EXPECT_EQ(names.size(), state.size()) << "VISSL's head has tensors this one lacks";
}

void expect_state_near(torch::nn::Module& module, const nlohmann::json& state, double tolerance) {
  for (auto& [name, tensor] : state_of(module)) {
    EXPECT_LE(max_abs_difference(tensor, json_like(state.at(name), tensor)), tolerance) << name;
  }
}

const char* const kHeadCases[] = {"head_three_layers", "head_bn_trained_norm", "head_one_layer"};

// The same generator, the same draws in the same order (nn.Linear's default init of every MLP
// layer, then VISSL's trunc_normal_ over them, then the prototypes' Kaiming uniform) and the
// same elementwise kernels (uniform_, erfinv_): equal values. 1e-7 admits one float32 rounding
// of values below 1; a draw out of order or VISSL's bounds taken as ±2 std move values by 1e-2.
TEST(DinoHead, StartsAsVisslsFromTheSameSeed) {
  for (const char* name : kHeadCases) {
    SCOPED_TRACE(name);
    const nlohmann::json entry = baseline_case(name);
    torch::manual_seed(entry.at("seed").get<uint64_t>());
    DinoHead head(head_options(entry.at("options")));
    EXPECT_EQ(state_of(*head).size(), entry.at("initial").size());
    expect_state_near(*head, entry.at("initial"), 1e-7);
  }
}

// Scores |s| <= 1 (unit embedding against unit rows). Each of the <= 4 matmuls (L <= 8 terms)
// may sum in another order: ~L·u = 5e-7 relative each, 2e-6 through the chain, which the
// normalisations keep relative; the gradients retrace the same chain transposed. 1e-5 relative
// to the largest value leaves ~5x; a weight_g not fixed to 1, a missing normalisation or a
// ReLU for GELU moves the scores by 1e-2 or more.
constexpr double kHeadTolerance = 1e-5;

TEST(DinoHead, ForwardAndGradientsMatchVissl) {
  for (const char* name : kHeadCases) {
    SCOPED_TRACE(name);
    const nlohmann::json entry = baseline_case(name);
    DinoHead head(head_options(entry.at("options")));
    load_state(*head, entry.at("initial"));
    const at::Tensor input = rows(entry.at("input")).requires_grad_();
    const at::Tensor scores = head->forward(input);
    (scores * rows(entry.at("weights"))).sum().backward();
    const at::Tensor expected_scores = rows(entry.at("scores"));
    EXPECT_LE(
        max_abs_difference(scores, expected_scores), kHeadTolerance * max_abs(expected_scores));
    const at::Tensor input_gradient = rows(entry.at("input_gradient"));
    EXPECT_LE(
        max_abs_difference(input.grad(), input_gradient), kHeadTolerance * max_abs(input_gradient));
    const at::Tensor v_gradient = rows(entry.at("weight_v_gradient"));
    EXPECT_LE(
        max_abs_difference(head->prototypes()->weight_v.grad(), v_gradient),
        kHeadTolerance * max_abs(v_gradient));
    // BatchNorm's running statistics after the training-mode forward; parameters unchanged.
    expect_state_near(*head, entry.at("final_state"), kHeadTolerance);
  }
}

TEST(DinoHead, FixedNormAndOptionsAreChecked) {
  DinoHeadOptions options;
  options.in_dim = 4;
  options.num_clusters = 3;
  options.hidden_dim = 5;
  options.bottleneck_dim = 2;
  DinoHead fixed(options);
  EXPECT_FALSE(fixed->prototypes()->weight_g.requires_grad());
  EXPECT_TRUE(fixed->prototypes()->weight_g.eq(1).all().item<bool>());
  options.normalize_last_layer = false;
  EXPECT_TRUE(DinoHead(options)->prototypes()->weight_g.requires_grad());
  for (auto bad :
       {&DinoHeadOptions::in_dim,
        &DinoHeadOptions::num_clusters,
        &DinoHeadOptions::num_layers,
        &DinoHeadOptions::hidden_dim,
        &DinoHeadOptions::bottleneck_dim}) {
    DinoHeadOptions wrong = options;
    wrong.*bad = 0;
    EXPECT_THROW(DinoHead{wrong}, OptionError);
  }
}

DinoLossOptions loss_options(const nlohmann::json& json) {
  DinoLossOptions options;
  options.student_temp = json.at("student_temp");
  options.teacher_temp_min = json.at("teacher_temp_min");
  options.teacher_temp_max = json.at("teacher_temp_max");
  options.teacher_temp_warmup_iters = json.at("teacher_temp_warmup_iters");
  options.center_momentum = json.at("center_momentum");
  options.num_crops = json.at("num_crops");
  options.crops_for_teacher = json.at("crops_for_teacher").get<std::vector<int64_t>>();
  options.output_dim = json.at("output_dim");
  return options;
}

// Student logits up to ~40 (scores of 4 / 0.1), teacher arguments up to ~300 ((t - c) / 0.04):
// equal elementwise on both sides, so the reductions decide: each softmax / log-softmax sums 6
// terms, each term a mean of <= 3 images, the loss the mean of 6 terms: ~15·u = 1e-6 relative
// on the loss and its gradient; the center sums <= 4 rows per rank and 2 ranks (values <= 15)
// then 0.1 of it per step: 1e-6 absolute over 5 steps. Carried into the next step's teacher
// argument that is 1e-6 / 0.04 = 2.5e-5 absolute inside an exp, 2.5e-5 relative on targets
// already near one-hot. Hence 1e-4 relative on losses and gradients, 2e-6 absolute on the
// center. A center not averaged over ranks, averaged over the wrong count, taken after the
// softmax or updated before the loss moves losses by 1e-1 or more.
constexpr double kLossRelativeTolerance = 1e-4;
constexpr double kCenterTolerance = 2e-6;

void run_loss_like_reference(const nlohmann::json& entry, comm::ProcessGroup& group) {
  const DinoLossOptions options = loss_options(entry.at("options"));
  DinoLoss loss(options);
  const int64_t n = entry.at("n_per_rank");
  const int64_t student_rows = options.num_crops * n;
  const auto teacher_rows = static_cast<int64_t>(options.crops_for_teacher.size()) * n;
  const auto& steps = entry.at("steps");
  for (size_t step = 0; step < steps.size(); ++step) {
    SCOPED_TRACE(fmt::format("iteration {}", step));
    const auto& s = steps[step];
    const at::Tensor student =
        rows(s.at("student")).narrow(0, group.rank() * student_rows, student_rows).requires_grad_();
    const at::Tensor teacher =
        rows(s.at("teacher")).narrow(0, group.rank() * teacher_rows, teacher_rows);
    EXPECT_DOUBLE_EQ(
        dino_teacher_temperature(options, static_cast<int64_t>(step)),
        s.at("teacher_temp").get<double>());
    const at::Tensor value = loss.forward(student, teacher, static_cast<int64_t>(step), group);
    value.backward();
    const double expected = s.at("losses")[group.rank()];
    EXPECT_NEAR(value.item<double>(), expected, kLossRelativeTolerance * std::abs(expected));
    EXPECT_LE(max_abs_difference(loss.center(), rows(s.at("center"))), kCenterTolerance);
    const at::Tensor gradient =
        rows(s.at("student_gradient")).narrow(0, group.rank() * student_rows, student_rows);
    EXPECT_LE(
        max_abs_difference(student.grad(), gradient), kLossRelativeTolerance * max_abs(gradient));
  }
}

TEST(DinoLoss, MatchesVisslOverIterationsOnOneProcess) {
  auto group = comm::ProcessGroup::single_process();
  run_loss_like_reference(baseline_case("loss_one_rank"), *group);
}

// Each rank its own images: its loss over them, the center the same on both ranks and the
// mean over all 2 x 4 teacher rows (VISSL's all_reduce / (rows x world)).
TEST(DinoLoss, TwoRanksAverageTheCenterLikeVissl) {
  const nlohmann::json entry = baseline_case("loss_two_ranks");
  largo::testing::run_on_ranks(
      2, [&](comm::ProcessGroup& group) { run_loss_like_reference(entry, group); });
}

// torch.linspace fills its two halves from either end (start + i·step, end - (n-1-i)·step), so
// the values near the middle and the last warm-up iteration are where a formula of one's own
// would round otherwise; the same float32 kernel gives the same values.
TEST(DinoLoss, TeacherTemperatureIsVisslsScheduleAtItsDefaults) {
  const nlohmann::json entry = baseline_case("teacher_temperature");
  DinoLossOptions options;
  options.teacher_temp_min = entry.at("teacher_temp_min");
  options.teacher_temp_max = entry.at("teacher_temp_max");
  options.teacher_temp_warmup_iters = entry.at("teacher_temp_warmup_iters");
  for (const auto& point : entry.at("points")) {
    EXPECT_EQ(
        dino_teacher_temperature(options, point.at("iteration")),
        point.at("teacher_temp").get<double>())
        << point.dump();
  }
}

TEST(DinoLoss, TeacherTemperatureEdgesStateAndChecks) {
  DinoLossOptions options;
  options.teacher_temp_warmup_iters = 0; // no warm-up: the max from iteration 0
  EXPECT_EQ(dino_teacher_temperature(options, 0), static_cast<double>(0.07f));
  options.teacher_temp_warmup_iters = 1; // torch.linspace(min, max, 1) is [min]
  EXPECT_EQ(dino_teacher_temperature(options, 0), static_cast<double>(0.04f));
  options.output_dim = 3;
  options.num_crops = 3;
  DinoLoss loss(options);
  auto group = comm::ProcessGroup::single_process();
  loss.forward(torch::randn({6, 3}), torch::randn({4, 3}), 0, *group);
  DinoLoss restored(options);
  restored.load_state_dict(loss.state_dict());
  EXPECT_TRUE(restored.center().equal(loss.center()));
  EXPECT_THROW(restored.load_state_dict({{"center", torch::zeros({1, 4})}}), CheckpointError);
  EXPECT_THROW(loss.forward(torch::randn({5, 3}), torch::randn({4, 3}), 0, *group), Error);
  EXPECT_THROW(loss.forward(torch::randn({6, 3}), torch::randn({2, 3}), 0, *group), Error);
  for (auto field :
       {&DinoLossOptions::student_temp,
        &DinoLossOptions::teacher_temp_min,
        &DinoLossOptions::teacher_temp_max}) {
    DinoLossOptions bad = options;
    bad.*field = 0.0;
    EXPECT_THROW(DinoLoss{bad}, OptionError);
  }
  DinoLossOptions bad = options;
  bad.crops_for_teacher = {};
  EXPECT_THROW(DinoLoss{bad}, OptionError);
  bad = options;
  bad.center_momentum = 1.5;
  EXPECT_THROW(DinoLoss{bad}, OptionError);
}

// The same double expression in the same order, cos from the same libm as Python's math.cos:
// equal to a few ulps (EXPECT_DOUBLE_EQ's 4).
TEST(DinoTeacherMomentum, IsVisslsCosine) {
  const nlohmann::json momentum = baseline_case("momentum"); // outlives the loop's range
  for (const auto& point : momentum.at("points")) {
    EXPECT_DOUBLE_EQ(
        dino_teacher_momentum(point.at("base"), point.at("iteration"), point.at("max_iteration")),
        point.at("momentum").get<double>())
        << point.dump();
  }
  EXPECT_THROW(dino_teacher_momentum(1.5, 0, 10), OptionError);
  EXPECT_THROW(dino_teacher_momentum(0.996, 0, 0), OptionError);
}

// Per element the same two float32 roundings as VISSL's mul_ then add_ of (1 - m) * p: equal,
// or at worst a result one float32 ulp apart for values in [1, 2) (weight_g, BatchNorm's weight),
// 1.2e-7; 2.4e-7 allows two. The parameters move by (1 - m)·|p_s - p_t| ~ 1e-4, so a skipped or
// doubled update shows; buffers (BatchNorm's running statistics) are not touched.
TEST(DinoTeacherUpdate, OneStepMatchesVissl) {
  const nlohmann::json entry = baseline_case("ema");
  const DinoHeadOptions options = head_options(entry.at("options"));
  DinoHead student(options);
  DinoHead teacher(options);
  load_state(*student, entry.at("student"));
  load_state(*teacher, entry.at("teacher"));
  update_dino_teacher(*teacher, *student, entry.at("momentum").get<double>());
  expect_state_near(*teacher, entry.at("updated_teacher"), 2.4e-7);
  DinoHeadOptions other = options;
  other.num_layers = 2;
  DinoHead mismatched(other);
  EXPECT_THROW(update_dino_teacher(*mismatched, *student, 0.5), Error);
  EXPECT_THROW(update_dino_teacher(*teacher, *student, 1.5), OptionError);
}

} // namespace
} // namespace largo::models::dino_test
