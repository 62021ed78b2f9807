// Learning-rate schedules: PyTorch's lr_scheduler values, ClassyVision's boundary rules,
// validation messages, and VISSL's automatic scaling.
#include "optim_test_util.h"

#include <largo/core/error.h>
#include <largo/optim/lr_schedule.h>

#include <cmath>
#include <numbers>

namespace largo::optim::lr_schedule_test {
namespace {

using testing::expect_config_error;

ScheduleOptions schedule_from_json(const nlohmann::json& j) {
  ScheduleOptions options;
  options.name = j.at("name");
  options.value = j.value("value", options.value);
  options.start_value = j.value("start_value", options.start_value);
  options.end_value = j.value("end_value", options.end_value);
  options.values = j.value("values", options.values);
  options.milestones = j.value("milestones", options.milestones);
  options.num_epochs = j.value("num_epochs", options.num_epochs);
  options.lengths = j.value("lengths", options.lengths);
  options.interval_scaling = j.value("interval_scaling", options.interval_scaling);
  options.update_interval = j.value("update_interval", options.update_interval);
  options.base_value = j.value("base_value", options.base_value);
  options.power = j.value("power", options.power);
  options.num_decays = j.value("num_decays", options.num_decays);
  options.gamma = j.value("gamma", options.gamma);
  options.restart_interval_length =
      j.value("restart_interval_length", options.restart_interval_length);
  options.wave_type = j.value("wave_type", options.wave_type);
  options.lr_multiplier = j.value("lr_multiplier", options.lr_multiplier);
  options.is_adaptive = j.value("is_adaptive", options.is_adaptive);
  options.warmup_interval_length =
      j.value("warmup_interval_length", options.warmup_interval_length);
  for (const auto& sub : j.value("schedulers", nlohmann::json::array())) {
    options.schedulers.push_back(schedule_from_json(sub));
  }
  return options;
}

// The schedule named `name` in `baselines` gives its "lrs" at every step's `where` within
// `tolerance` (relative above 1, absolute below); `reference` names what made them.
void expect_schedule_matches(
    const nlohmann::json& baselines,
    const std::string& name,
    double tolerance,
    const char* reference) {
  const nlohmann::json* spec = nullptr;
  for (const auto& candidate : baselines.at("schedules")) {
    if (candidate["name"] == name) {
      spec = &candidate;
    }
  }
  ASSERT_NE(spec, nullptr) << "no baseline named " << name;
  const ScheduleOptions options = schedule_from_json((*spec)["options"]);
  const auto schedule = make_schedule(options);
  const int64_t num_epochs = (*spec)["num_epochs"];
  const int64_t iterations_per_epoch = (*spec)["iterations_per_epoch"];
  const std::vector<double> expected = (*spec)["lrs"];
  ASSERT_EQ(static_cast<int64_t>(expected.size()), num_epochs * iterations_per_epoch);
  for (size_t t = 0; t < expected.size(); ++t) {
    const auto step = static_cast<int64_t>(t);
    const double where = where_for(
        step / iterations_per_epoch,
        step % iterations_per_epoch,
        iterations_per_epoch,
        num_epochs,
        options.update_interval);
    EXPECT_TRUE(testing::close(schedule->value_at(where), expected[t], tolerance))
        << name << " step " << t << ": got " << schedule->value_at(where) << ", " << reference
        << " gives " << expected[t];
  }
}

class ScheduleBaselineTest : public ::testing::TestWithParam<std::string> {};

// torch's schedulers update the lr recursively (lr_t from lr_{t-1}), which drifts from the
// closed form by a few ulps per step; 1e-12 relative covers 100 steps of that, while a
// wrong `where` (off by one step) changes the values by 1e-4 or more.
TEST_P(ScheduleBaselineTest, MatchesTorchLrScheduler) {
  expect_schedule_matches(testing::load_baselines(), GetParam(), 1e-12, "torch");
}

INSTANTIATE_TEST_SUITE_P(
    Torch,
    ScheduleBaselineTest,
    ::testing::Values("cosine", "multistep", "linear", "warmup_cosine"),
    [](const auto& info) { return info.param; });

class VisslScheduleBaselineTest : public ::testing::TestWithParam<std::string> {};

// Closed forms in float64 on both sides, a handful of operations and libm calls each
// (agreement to ~1e-15); 1e-12 (absolute below 1) leaves room for sqrt against
// pow(x, 0.5) and contracted multiply-adds, while a restart or decay taken one step early or
// late changes a value by more than 1e-3.
TEST_P(VisslScheduleBaselineTest, MatchesVisslsFormulas) {
  expect_schedule_matches(
      testing::load_baselines("vissl_schedule_baselines.json", "gen_vissl_schedule_baselines.py"),
      GetParam(),
      1e-12,
      "the reference");
}

INSTANTIATE_TEST_SUITE_P(
    Vissl,
    VisslScheduleBaselineTest,
    ::testing::Values(
        "polynomial_power_2",
        "polynomial_power_0_9",
        "step_with_fixed_gamma",
        "step_with_fixed_gamma_5",
        "cosine_warm_restart_half",
        "cosine_warm_restart_half_uneven",
        "cosine_warm_restart_full",
        "cosine_warm_restart_half_adaptive",
        "cosine_warm_restart_full_adaptive",
        "inverse_sqrt",
        "inverse_sqrt_no_warmup"),
    [](const auto& info) { return info.param; });

ScheduleOptions named(const std::string& name) {
  ScheduleOptions options;
  options.name = name;
  return options;
}

TEST(LrSchedule, ClosedForms) {
  auto constant = named("constant");
  constant.value = 0.7;
  EXPECT_EQ(make_schedule(constant)->value_at(0.42), 0.7);

  auto linear = named("linear");
  linear.start_value = 0.1;
  linear.end_value = 0.5;
  EXPECT_DOUBLE_EQ(make_schedule(linear)->value_at(0.25), 0.2);
  EXPECT_DOUBLE_EQ(make_schedule(linear)->value_at(1.0), 0.5);

  auto cosine = named("cosine");
  cosine.start_value = 0.4;
  cosine.end_value = 0.0;
  const auto cos_schedule = make_schedule(cosine);
  EXPECT_DOUBLE_EQ(cos_schedule->value_at(0.0), 0.4);
  EXPECT_NEAR(cos_schedule->value_at(0.5), 0.2, 1e-15);
  EXPECT_NEAR(cos_schedule->value_at(1.0), 0.0, 1e-15);
  EXPECT_NEAR(cos_schedule->value_at(0.25), 0.2 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);

  EXPECT_THROW(cos_schedule->value_at(1.5), largo::Error);
  EXPECT_THROW(cos_schedule->value_at(-0.1), largo::Error);
}

TEST(LrSchedule, StepAndMultistepBoundaries) {
  auto step = named("step");
  step.values = {1.0, 2.0, 3.0};
  const auto step_schedule = make_schedule(step);
  EXPECT_EQ(step_schedule->value_at(0.0), 1.0);
  EXPECT_EQ(step_schedule->value_at(0.3333), 1.0);
  EXPECT_EQ(step_schedule->value_at(30.0 / 90.0), 2.0); // boundary reached exactly
  EXPECT_EQ(step_schedule->value_at(0.999), 3.0);
  EXPECT_EQ(step_schedule->value_at(1.0), 3.0); // clamped to the last value

  auto multistep = named("multistep"); // defaults: values 0.1/0.01/0.001, milestones 30, 60
  const auto multistep_schedule = make_schedule(multistep);
  EXPECT_EQ(multistep_schedule->value_at(where_for(29, 0, 1, 90, "epoch")), 0.1);
  EXPECT_EQ(multistep_schedule->value_at(where_for(30, 0, 1, 90, "epoch")), 0.01);
  EXPECT_EQ(multistep_schedule->value_at(where_for(59, 0, 1, 90, "epoch")), 0.01);
  EXPECT_EQ(multistep_schedule->value_at(where_for(60, 0, 1, 90, "epoch")), 0.001);
  EXPECT_EQ(multistep_schedule->value_at(1.0), 0.001);
  // Per-step updates still change value at whole epochs.
  EXPECT_EQ(multistep_schedule->value_at(where_for(29, 99, 100, 90, "step")), 0.1);
  EXPECT_EQ(multistep_schedule->value_at(where_for(30, 0, 100, 90, "step")), 0.01);

  // No milestones: evenly spaced over num_epochs (ceil(10 / 4) = 3 → 3, 6, 9).
  multistep.milestones.clear();
  multistep.values = {4.0, 3.0, 2.0, 1.0};
  multistep.num_epochs = 10;
  const auto even = make_schedule(multistep);
  EXPECT_EQ(even->value_at(0.25), 4.0);
  EXPECT_EQ(even->value_at(0.3), 3.0);
  EXPECT_EQ(even->value_at(0.6), 2.0);
  EXPECT_EQ(even->value_at(0.95), 1.0);
}

TEST(LrSchedule, CompositeRescaledAndFixed) {
  auto composite = named("composite");
  auto warmup = named("linear");
  warmup.start_value = 0.0;
  warmup.end_value = 1.0;
  auto decay = named("linear");
  decay.start_value = 1.0;
  decay.end_value = 0.0;
  composite.schedulers = {warmup, decay};
  composite.lengths = {0.2, 0.8};
  const auto rescaled = make_schedule(composite);
  EXPECT_DOUBLE_EQ(rescaled->value_at(0.1), 0.5);
  EXPECT_DOUBLE_EQ(rescaled->value_at(0.2), 1.0); // the second schedule starts at its 0
  EXPECT_DOUBLE_EQ(rescaled->value_at(0.6), 0.5);
  EXPECT_DOUBLE_EQ(rescaled->value_at(1.0), 0.0);

  composite.interval_scaling = {"rescaled", "fixed"};
  const auto fixed = make_schedule(composite);
  EXPECT_DOUBLE_EQ(fixed->value_at(0.1), 0.5);
  EXPECT_DOUBLE_EQ(fixed->value_at(0.6), 0.4); // the decay sees the global progress
}

TEST(LrSchedule, WhereFor) {
  EXPECT_DOUBLE_EQ(where_for(3, 7, 10, 12, "epoch"), 0.25);
  EXPECT_DOUBLE_EQ(where_for(3, 5, 10, 10, "step"), 0.35);
  EXPECT_EQ(where_for(0, 0, 10, 10, "step"), 0.0);
  EXPECT_THROW(where_for(0, 0, 10, 10, "iteration"), ConfigError);
  EXPECT_THROW(where_for(0, 0, 10, 0, "epoch"), ConfigError);
}

TEST(LrSchedule, Validation) {
  expect_config_error(
      [] { make_schedule(named("cosine_annealing")); },
      {"ScheduleOptions.name", "cosine_annealing", "multistep", "composite"});
  auto multistep = named("multistep");
  multistep.milestones = {30};
  expect_config_error(
      [&] { make_schedule(multistep); }, {"ScheduleOptions.milestones", "1 entries", "has 3"});
  multistep.milestones = {60, 30};
  expect_config_error([&] { make_schedule(multistep); }, {"strictly increasing"});
  multistep.milestones = {30, 90};
  expect_config_error([&] { make_schedule(multistep); }, {"num_epochs = 90"});

  auto composite = named("composite");
  composite.schedulers = {named("constant"), named("cosine")};
  composite.lengths = {0.5, 0.4};
  expect_config_error([&] { make_schedule(composite); }, {"lengths", "sum to 0.9"});
  composite.lengths = {0.5, 0.5};
  composite.interval_scaling = {"rescaled", "stretched"};
  expect_config_error([&] { make_schedule(composite); }, {"interval_scaling[1]", "stretched"});
  composite.interval_scaling.clear();
  composite.schedulers[1] = named("poly");
  expect_config_error(
      [&] { make_schedule(composite, "OPTIMIZER.param_schedulers.lr_head"); },
      {"OPTIMIZER.param_schedulers.lr_head.schedulers[1].name", "poly"});
  auto bad_interval = named("constant");
  bad_interval.update_interval = "iteration";
  expect_config_error([&] { make_schedule(bad_interval); }, {"update_interval", "iteration"});
}

TEST(LrSchedule, VisslSchedulesValidateTheirFields) {
  auto polynomial = named("polynomial");
  polynomial.power = -1.0;
  expect_config_error([&] { make_schedule(polynomial); }, {"ScheduleOptions.power = -1", ">= 0"});
  auto step = named("step_with_fixed_gamma");
  step.num_decays = 0;
  expect_config_error([&] { make_schedule(step); }, {"ScheduleOptions.num_decays = 0", "> 0"});
  step.num_decays = 2;
  step.gamma = 0.0;
  expect_config_error([&] { make_schedule(step); }, {"ScheduleOptions.gamma = 0", "> 0"});
  step.gamma = 0.5;
  step.base_value = -0.1;
  expect_config_error([&] { make_schedule(step); }, {"ScheduleOptions.base_value = -0.1"});
  auto restart = named("cosine_warm_restart");
  restart.restart_interval_length = 1.5;
  expect_config_error([&] { make_schedule(restart); }, {"restart_interval_length = 1.5", "(0, 1]"});
  restart.restart_interval_length = 0.0;
  expect_config_error([&] { make_schedule(restart); }, {"restart_interval_length = 0"});
  restart.restart_interval_length = 0.5;
  restart.wave_type = "quarter";
  expect_config_error([&] { make_schedule(restart); }, {"wave_type = quarter", "half or full"});
  restart.wave_type = "full";
  restart.lr_multiplier = 0.0;
  expect_config_error([&] { make_schedule(restart); }, {"lr_multiplier = 0"});
  auto inverse_sqrt = named("inverse_sqrt");
  inverse_sqrt.warmup_interval_length = 1.5;
  expect_config_error([&] { make_schedule(inverse_sqrt); }, {"warmup_interval_length = 1.5"});
}

AutoLrScaling auto_scaling(const std::string& type = "linear") {
  AutoLrScaling scaling;
  scaling.auto_scale = true;
  scaling.base_value = 0.1;
  scaling.base_lr_batch_size = 256;
  scaling.scaling_type = type;
  return scaling;
}

TEST(AutoLrScaling, SimpleSchedules) {
  auto constant = named("constant");
  apply_auto_lr_scaling(constant, auto_scaling(), 1024, 256);
  EXPECT_DOUBLE_EQ(constant.value, 0.4);

  constant = named("constant");
  apply_auto_lr_scaling(constant, auto_scaling("sqrt"), 1024, 256);
  EXPECT_DOUBLE_EQ(constant.value, 0.2);

  auto multistep = named("multistep"); // 0.1, 0.01, 0.001
  apply_auto_lr_scaling(multistep, auto_scaling(), 2048, 256);
  ASSERT_EQ(multistep.values.size(), 3U);
  EXPECT_DOUBLE_EQ(multistep.values[0], 0.8);
  EXPECT_DOUBLE_EQ(multistep.values[1], 0.08);
  EXPECT_DOUBLE_EQ(multistep.values[2], 0.008);

  auto cosine = named("cosine");
  cosine.start_value = 0.1;
  cosine.end_value = 0.001;
  apply_auto_lr_scaling(cosine, auto_scaling(), 512, 512);
  EXPECT_DOUBLE_EQ(cosine.start_value, 0.2);
  EXPECT_DOUBLE_EQ(cosine.end_value, 0.002);

  auto linear = named("linear");
  linear.start_value = 0.0;
  apply_auto_lr_scaling(linear, auto_scaling(), 512, 512);
  EXPECT_DOUBLE_EQ(linear.end_value, 0.2);
  EXPECT_EQ(linear.start_value, 0.0);

  auto untouched = named("constant");
  AutoLrScaling off = auto_scaling();
  off.auto_scale = false;
  apply_auto_lr_scaling(untouched, off, 4096, 256);
  EXPECT_EQ(untouched.value, 0.1);

  expect_config_error(
      [&] { apply_auto_lr_scaling(untouched, auto_scaling("cubic"), 512, 512); },
      {"AutoLrScaling::scaling_type", "cubic"});
}

// VISSL's rules for the schedules it adds (vissl/utils/hydra_config.py): the value that
// the schedule starts from becomes lr*; a polynomial schedule has no rule.
TEST(AutoLrScaling, VisslSchedules) {
  auto step = named("step_with_fixed_gamma");
  apply_auto_lr_scaling(step, auto_scaling(), 1024, 256);
  EXPECT_DOUBLE_EQ(step.base_value, 0.4);
  EXPECT_EQ(step.gamma, 0.1);

  auto inverse_sqrt = named("inverse_sqrt");
  apply_auto_lr_scaling(inverse_sqrt, auto_scaling(), 1024, 256);
  EXPECT_DOUBLE_EQ(inverse_sqrt.start_value, 0.4);

  auto restart = named("cosine_warm_restart");
  restart.start_value = 0.2;
  restart.end_value = 0.002;
  apply_auto_lr_scaling(restart, auto_scaling(), 1024, 256);
  EXPECT_DOUBLE_EQ(restart.start_value, 0.4);
  EXPECT_DOUBLE_EQ(restart.end_value, 0.004); // keeps its ratio to start_value

  auto polynomial = named("polynomial");
  expect_config_error(
      [&] { apply_auto_lr_scaling(polynomial, auto_scaling(), 1024, 256); },
      {"polynomial", "auto_scale"});
}

ScheduleOptions warmup_cosine() {
  auto composite = named("composite");
  composite.update_interval = "step";
  auto warmup = named("linear");
  warmup.start_value = 0.01;
  warmup.end_value = 0.1;
  auto cosine = named("cosine");
  cosine.start_value = 0.1;
  cosine.end_value = 0.0001;
  composite.schedulers = {warmup, cosine};
  composite.lengths = {0.1, 0.9};
  return composite;
}

TEST(AutoLrScaling, CompositeWarmupOnSeveralNodes) {
  // 4 nodes x 256: lr* = 0.4; the warm-up starts at the one-node lr 0.1.
  auto composite = warmup_cosine();
  apply_auto_lr_scaling(composite, auto_scaling(), 1024, 256);
  ASSERT_EQ(composite.name, "composite");
  ASSERT_EQ(composite.schedulers.size(), 2U);
  EXPECT_DOUBLE_EQ(composite.schedulers[0].start_value, 0.1);
  EXPECT_DOUBLE_EQ(composite.schedulers[0].end_value, 0.4);
  EXPECT_DOUBLE_EQ(composite.schedulers[1].start_value, 0.4);
  EXPECT_DOUBLE_EQ(composite.schedulers[1].end_value, 0.0004);
  EXPECT_EQ(composite.lengths, (std::vector<double>{0.1, 0.9}));
  EXPECT_NO_THROW(make_schedule(composite));
}

TEST(AutoLrScaling, CompositeWarmupDroppedOnOneNode) {
  // One node of 768 (3 x 256): the warm-up would start at lr* = 0.3 itself, so it goes, and
  // the cosine alone replaces the composite (keeping the composite's update interval).
  auto composite = warmup_cosine();
  apply_auto_lr_scaling(composite, auto_scaling(), 768, 768);
  EXPECT_EQ(composite.name, "cosine");
  EXPECT_DOUBLE_EQ(composite.start_value, 0.3);
  EXPECT_DOUBLE_EQ(composite.end_value, 0.0003);
  EXPECT_EQ(composite.update_interval, "step");

  // With two schedules left, they are stretched to cover training.
  composite = warmup_cosine();
  composite.schedulers.push_back(named("constant"));
  composite.lengths = {0.2, 0.6, 0.2};
  composite.interval_scaling = {"rescaled", "fixed", "rescaled"};
  apply_auto_lr_scaling(composite, auto_scaling(), 768, 768);
  ASSERT_EQ(composite.name, "composite");
  ASSERT_EQ(composite.schedulers.size(), 2U);
  EXPECT_EQ(composite.schedulers[0].name, "cosine");
  EXPECT_DOUBLE_EQ(composite.lengths[0], 0.75);
  EXPECT_DOUBLE_EQ(composite.lengths[1], 0.25);
  EXPECT_EQ(composite.interval_scaling, (std::vector<std::string>{"fixed", "rescaled"}));
  EXPECT_DOUBLE_EQ(composite.schedulers[1].value, 0.3);

  // sqrt scaling on one node: lr* = 0.1 * sqrt(3) differs from the linear start 0.3: kept.
  composite = warmup_cosine();
  apply_auto_lr_scaling(composite, auto_scaling("sqrt"), 768, 768);
  ASSERT_EQ(composite.name, "composite");
  EXPECT_DOUBLE_EQ(composite.schedulers[0].start_value, 0.3);
  EXPECT_DOUBLE_EQ(composite.schedulers[0].end_value, 0.1 * std::sqrt(3.0));
}

} // namespace
} // namespace largo::optim::lr_schedule_test
