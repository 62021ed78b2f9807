#include "optimizer_schedule_config.h"

#include "config_checks.h"

#include <largo/optim/lr_schedule.h>
#include <largo/optim/param_groups.h>
#include <largo/train/option_keys.h>

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace largo::train {
namespace {

optim::AutoLrScaling auto_scaling_from(const Config& config, const std::string& prefix) {
  optim::AutoLrScaling scaling;
  scaling.auto_scale = config.get_bool(prefix + ".auto_scale");
  scaling.base_value = non_negative(config, prefix + ".base_value");
  scaling.base_lr_batch_size = positive_int(config, prefix + ".base_lr_batch_size");
  scaling.scaling_type = config.get_string(prefix + ".scaling_type");
  require(
      scaling.scaling_type == "linear" || scaling.scaling_type == "sqrt",
      prefix + ".scaling_type",
      scaling.scaling_type,
      "linear or sqrt");
  return scaling;
}

// Sub-schedules of a composite are not in the defaults' tree, so the config layer cannot
// check their keys: a misspelled start_value would be ignored without a word.
void check_schedule_keys(const YAML::Node& node, const std::string& key) {
  static const std::vector<std::string> known = {
      "name",
      "update_interval",
      "value",
      "start_value",
      "end_value",
      "values",
      "milestones",
      "lengths",
      "interval_scaling",
      "schedulers",
      "auto_lr_scaling",
      "base_value",
      "power",
      "num_decays",
      "gamma",
      "num_epochs",
      "restart_interval_length",
      "wave_type",
      "lr_multiplier",
      "is_adaptive",
      "warmup_interval_length"};
  for (const auto& entry : node) {
    const std::string name = entry.first.as<std::string>();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string closest = known.front();
      for (const auto& candidate : known) {
        if (edit_distance(candidate, name) < edit_distance(closest, name)) {
          closest = candidate;
        }
      }
      throw ConfigError(fmt::format(
          "unknown config key {}.{}; did you mean {}.{}?", key, abbreviate(name), key, closest));
    }
  }
}

// The fields of the schedules VISSL adds (polynomial, step_with_fixed_gamma,
// cosine_warm_restart, inverse_sqrt); the library validates their values.
void read_vissl_schedule_fields(
    const YAML::Node& node,
    const std::string& key,
    int64_t num_epochs,
    optim::ScheduleOptions& schedule) {
  auto number = [&](const char* name, double& field) {
    if (node[name]) {
      field = yaml_to_double(node[name], key + "." + name);
    }
  };
  number("base_value", schedule.base_value);
  number("power", schedule.power);
  number("gamma", schedule.gamma);
  number("restart_interval_length", schedule.restart_interval_length);
  number("lr_multiplier", schedule.lr_multiplier);
  number("warmup_interval_length", schedule.warmup_interval_length);
  if (node["num_decays"]) {
    schedule.num_decays = yaml_to_int(node["num_decays"], key + ".num_decays");
  }
  if (node["wave_type"]) {
    require(node["wave_type"].IsScalar(), key + ".wave_type", "(not a name)", "half or full");
    schedule.wave_type = node["wave_type"].Scalar();
  }
  if (node["is_adaptive"]) {
    schedule.is_adaptive = yaml_to_bool(node["is_adaptive"], key + ".is_adaptive");
  }
  // ClassyVision's step_with_fixed_gamma takes num_epochs and only checks it: the decays are
  // spread over the whole run. Here the run is OPTIMIZER.num_epochs, so another value would
  // say something the run does not do.
  if (node["num_epochs"] && !node["num_epochs"].IsNull()) {
    const int64_t given = yaml_to_int(node["num_epochs"], key + ".num_epochs");
    require(
        given == num_epochs,
        key + ".num_epochs",
        std::to_string(given),
        fmt::format(
            "OPTIMIZER.num_epochs ({}), over which the schedule runs; or remove it", num_epochs));
  }
}

// A schedule node (param_schedulers.lr or one entry of its `schedulers` list). Missing
// keys keep the ScheduleOptions defaults, so composite entries can be short.
optim::ScheduleOptions
schedule_from(const YAML::Node& node, const std::string& key, int64_t num_epochs) {
  optim::ScheduleOptions schedule;
  schedule.num_epochs = num_epochs;
  if (!node.IsMap()) {
    throw config_error(key, "(not a map)", "a schedule map with a 'name'");
  }
  auto child_key = [&](const char* name) { return key + "." + name; };
  check_schedule_keys(node, key);
  auto number_list = [&](const char* name) {
    std::vector<double> values;
    for (const auto& element : node[name]) {
      values.push_back(yaml_to_double(element, child_key(name)));
    }
    return values;
  };
  if (node["name"]) {
    require(
        node["name"].IsScalar(),
        child_key("name"),
        "(not a name)",
        "a schedule name such as cosine or multistep");
    schedule.name = node["name"].Scalar();
  }
  if (node["update_interval"]) {
    schedule.update_interval = node["update_interval"].Scalar();
    require(
        schedule.update_interval == "epoch" || schedule.update_interval == "step",
        child_key("update_interval"),
        schedule.update_interval,
        "epoch or step");
  }
  if (node["value"]) {
    schedule.value = yaml_to_double(node["value"], child_key("value"));
  }
  if (node["start_value"]) {
    schedule.start_value = yaml_to_double(node["start_value"], child_key("start_value"));
  }
  if (node["end_value"]) {
    schedule.end_value = yaml_to_double(node["end_value"], child_key("end_value"));
  }
  if (node["values"]) {
    schedule.values = number_list("values");
  }
  if (node["milestones"]) {
    schedule.milestones.clear();
    for (const auto& element : node["milestones"]) {
      schedule.milestones.push_back(yaml_to_int(element, child_key("milestones")));
    }
  }
  if (node["lengths"]) {
    schedule.lengths = number_list("lengths");
  }
  if (node["interval_scaling"]) {
    schedule.interval_scaling.clear();
    for (const auto& element : node["interval_scaling"]) {
      require(
          element.IsScalar() && (element.Scalar() == "rescaled" || element.Scalar() == "fixed"),
          child_key("interval_scaling"),
          "(given)",
          "a list of rescaled / fixed");
      schedule.interval_scaling.push_back(element.Scalar());
    }
  }
  if (node["schedulers"]) {
    const YAML::Node list = node["schedulers"];
    for (size_t i = 0; i < list.size(); ++i) {
      schedule.schedulers.push_back(
          schedule_from(list[i], fmt::format("{}.schedulers[{}]", key, i), num_epochs));
    }
  }
  read_vissl_schedule_fields(node, key, num_epochs, schedule);
  return schedule;
}

// OPTIMIZER.param_schedulers.weight_decay (or weight_decay_head): VISSL's schedule of the
// decayed groups' weight decay, any of the lr schedules; absent ({}) keeps the constant. VISSL
// scales only lr to the batch size.
std::optional<optim::ScheduleOptions>
weight_decay_schedule_from(const Config& config, const std::string& key, int64_t num_epochs) {
  const YAML::Node node = config.node(key);
  require(node.IsMap(), key, "(not a map)", "a schedule map such as lr's, or {} for none");
  if (node.size() == 0) {
    return std::nullopt;
  }
  require(
      !node["auto_lr_scaling"],
      key + ".auto_lr_scaling",
      "(given)",
      "absent: VISSL scales the learning rate to the batch size, not the weight decay");
  optim::ScheduleOptions schedule = schedule_from(node, key, num_epochs);
  rethrow_with_yaml_keys([&] { optim::make_schedule(schedule, key); });
  return schedule;
}

// VISSL's dino constructor reads none of the default constructor's keys (its rule decides
// what is decayed) and gives every group the lr schedule: a key set to ask for something else
// is refused rather than dropped. False is what the rule does for biases and norm layers, so
// VISSL's DINO configs, which write regularize_bn and regularize_bias False, load.
void refuse_what_dino_groups_ignore(const Config& config) {
  const std::string because = "False with param_group_constructor dino, which decays neither "
                              "biases nor parameters named norm and takes no head settings";
  for (const char* key :
       {"OPTIMIZER.regularize_bn",
        "OPTIMIZER.regularize_bias",
        "OPTIMIZER.head_optimizer_params.use_different_lr",
        "OPTIMIZER.head_optimizer_params.use_different_wd"}) {
    require(!(config.given(key) && config.get_bool(key)), key, "True", because);
  }
  require(
      config.get_string_list("OPTIMIZER.non_regularized_parameters").empty(),
      "OPTIMIZER.non_regularized_parameters",
      "(a list)",
      "[] with param_group_constructor dino, whose rule decides what is decayed");
  require(
      config.node("OPTIMIZER.param_schedulers.weight_decay_head").size() == 0,
      "OPTIMIZER.param_schedulers.weight_decay_head",
      "(a schedule)",
      "absent with param_group_constructor dino (its groups hold the head too: schedule "
      "param_schedulers.weight_decay)");
}

// construct_single_param_group_only puts model.parameters() in one decayed group before VISSL's
// default constructor reads any of its other keys: a key set to ask for something else is
// refused. VISSL's configs that turn it on write regularize_bn False and regularize_bias True,
// its defaults, which load (they decide nothing then, as in VISSL); regularize_bn True (SEER's
// regnet10B.yaml over swav_8node_resnet.yaml) says what the one group does, and loads too.
void refuse_what_the_single_group_ignores(const Config& config) {
  const std::string because =
      "VISSL's default with construct_single_param_group_only, whose one group decays every "
      "parameter and takes no head settings";
  require(
      config.get_bool("OPTIMIZER.regularize_bias"), "OPTIMIZER.regularize_bias", "False", because);
  for (const char* key :
       {"OPTIMIZER.head_optimizer_params.use_different_lr",
        "OPTIMIZER.head_optimizer_params.use_different_wd"}) {
    require(!config.get_bool(key), key, "True", because);
  }
  require(
      config.get_string_list("OPTIMIZER.non_regularized_parameters").empty(),
      "OPTIMIZER.non_regularized_parameters",
      "(a list)",
      "[] with construct_single_param_group_only, whose one group decays every parameter");
  require(
      config.node("OPTIMIZER.param_schedulers.weight_decay_head").size() == 0,
      "OPTIMIZER.param_schedulers.weight_decay_head",
      "(a schedule)",
      "absent with construct_single_param_group_only (its one group holds the head too: "
      "schedule param_schedulers.weight_decay)");
}

// OPTIMIZER.param_group_constructor and the keys of the default constructor.
void param_group_options_from(const Config& config, OptimizerOptions& optimizer) {
  auto& groups = optimizer.param_groups;
  groups.weight_decay = optimizer.weight_decay;
  groups.regularize_bn = config.get_bool("OPTIMIZER.regularize_bn");
  groups.regularize_bias = config.get_bool("OPTIMIZER.regularize_bias");
  groups.non_regularized_parameters =
      config.get_string_list("OPTIMIZER.non_regularized_parameters");
  groups.use_different_wd = config.get_bool("OPTIMIZER.head_optimizer_params.use_different_wd");
  groups.head_weight_decay = non_negative(config, "OPTIMIZER.head_optimizer_params.weight_decay");
  const bool single_group = config.get_bool("OPTIMIZER.construct_single_param_group_only");
  if (config.get_string("OPTIMIZER.param_group_constructor") == "dino") {
    groups.rule = optim::ParamGroupRule::kDino;
    refuse_what_dino_groups_ignore(config);
    require( // VISSL's dino constructor does not read it
        !single_group,
        "OPTIMIZER.construct_single_param_group_only",
        "True",
        "False with param_group_constructor dino, which makes its own two groups");
  } else if (single_group) {
    groups.rule = optim::ParamGroupRule::kSingle;
    refuse_what_the_single_group_ignores(config);
  }
}

} // namespace

// OPTIMIZER's epochs, parameter groups and schedules.
void optimizer_schedule_from(const Config& config, TrainerOptions& options) {
  auto& optimizer = options.optimizer;
  optimizer.num_epochs = positive_int(config, "OPTIMIZER.num_epochs");
  param_group_options_from(config, optimizer);
  const std::string schedulers = "OPTIMIZER.param_schedulers.";
  optimizer.lr =
      schedule_from(config.node(schedulers + "lr"), schedulers + "lr", optimizer.num_epochs);
  optimizer.lr_scaling = auto_scaling_from(config, schedulers + "lr.auto_lr_scaling");
  optimizer.head_use_different_lr =
      config.get_bool("OPTIMIZER.head_optimizer_params.use_different_lr");
  optimizer.lr_head = schedule_from(
      config.node(schedulers + "lr_head"), schedulers + "lr_head", optimizer.num_epochs);
  optimizer.lr_head_scaling = auto_scaling_from(config, schedulers + "lr_head.auto_lr_scaling");
  optimizer.weight_decay_schedule =
      weight_decay_schedule_from(config, schedulers + "weight_decay", optimizer.num_epochs);
  optimizer.head_weight_decay_schedule =
      weight_decay_schedule_from(config, schedulers + "weight_decay_head", optimizer.num_epochs);
  rethrow_with_yaml_keys([&] { // the library's validator, its options named by their keys
    optim::make_schedule(optimizer.lr, schedulers + "lr");
    if (optimizer.head_use_different_lr) { // otherwise the trainer uses lr for the head too
      optim::make_schedule(optimizer.lr_head, schedulers + "lr_head");
    }
  });
}

} // namespace largo::train
