// VISSL's automatic scaling of the learning rate to the global batch size
// (vissl/utils/hydra_config.py, get_scaled_lr_scheduler), declared in optim/lr_schedule.h.
#include <largo/optim/lr_schedule.h>

#include "lr_schedule_parts.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace largo::optim {
namespace {

void scale_schedule(
    ScheduleOptions& options,
    double scaled_lr,
    const AutoLrScaling& scaling,
    int64_t per_node_batch_size,
    const std::string& key);

bool nearly_equal(double a, double b) {
  return std::abs(a - b) <= 1e-12 * std::max(std::abs(a), std::abs(b));
}

// A linear sub-schedule is a warm-up (Goyal et al.): it starts from the lr that suits one
// node's batch. On one node that is already lr*, so the warm-up is pointless and dropped.
void resolve_warmups(
    ScheduleOptions& options, const AutoLrScaling& scaling, int64_t per_node_batch_size) {
  const double warmup_start = scaling.base_value * static_cast<double>(per_node_batch_size) /
                              static_cast<double>(scaling.base_lr_batch_size);
  std::vector<bool> drop(options.schedulers.size(), false);
  for (size_t i = 0; i < options.schedulers.size(); ++i) {
    ScheduleOptions& sub = options.schedulers[i];
    if (sub.name != "linear") {
      continue;
    }
    if (nearly_equal(sub.end_value, warmup_start)) {
      drop[i] = true;
    } else {
      sub.start_value = warmup_start;
    }
  }
  ScheduleOptions kept = options;
  kept.schedulers.clear();
  kept.lengths.clear();
  kept.interval_scaling.clear();
  double kept_length = 0.0;
  for (size_t i = 0; i < options.schedulers.size(); ++i) {
    if (drop[i]) {
      continue;
    }
    kept.schedulers.push_back(options.schedulers[i]);
    if (i < options.lengths.size()) {
      kept.lengths.push_back(options.lengths[i]);
      kept_length += options.lengths[i];
    }
    if (i < options.interval_scaling.size()) {
      kept.interval_scaling.push_back(options.interval_scaling[i]);
    }
  }
  if (kept.schedulers.empty()) {
    // Only warm-ups: they would all be constant at lr*.
    ScheduleOptions constant = options;
    constant.name = "constant";
    constant.value = warmup_start;
    constant.schedulers.clear();
    constant.lengths.clear();
    constant.interval_scaling.clear();
    options = std::move(constant);
    return;
  }
  if (kept.schedulers.size() == 1) {
    ScheduleOptions lone = kept.schedulers.front();
    lone.update_interval = options.update_interval;
    options = std::move(lone);
    return;
  }
  if (kept_length > 0.0) {
    for (double& length : kept.lengths) {
      length /= kept_length;
    }
  }
  options = std::move(kept);
}

void scale_composite(
    ScheduleOptions& options,
    double scaled_lr,
    const AutoLrScaling& scaling,
    int64_t per_node_batch_size,
    const std::string& key) {
  bool has_linear = false;
  for (size_t i = 0; i < options.schedulers.size(); ++i) {
    has_linear = has_linear || options.schedulers[i].name == "linear";
    scale_schedule(
        options.schedulers[i],
        scaled_lr,
        scaling,
        per_node_batch_size,
        fmt::format("{}.schedulers[{}]", key, i));
  }
  if (has_linear) {
    resolve_warmups(options, scaling, per_node_batch_size);
  }
}

void scale_schedule(
    ScheduleOptions& options,
    double scaled_lr,
    const AutoLrScaling& scaling,
    int64_t per_node_batch_size,
    const std::string& key) {
  const std::string& name = options.name;
  if (name == "constant") {
    options.value = scaled_lr;
  } else if (name == "linear") {
    options.end_value = scaled_lr;
  } else if (name == "cosine" || name == "cosine_warm_restart") {
    if (options.start_value == 0.0) {
      throw ConfigError(fmt::format(
          "{}.start_value = 0: auto_lr_scaling keeps the ratio end_value / start_value of a "
          "{} schedule, which needs a non-zero start_value",
          key,
          name));
    }
    const double end_ratio = options.end_value / options.start_value;
    options.start_value = scaled_lr;
    options.end_value = scaled_lr * end_ratio;
  } else if (name == "step" || name == "multistep") {
    if (options.values.empty() || options.values[0] == 0.0) {
      throw ConfigError(fmt::format(
          "{}.values = [{}]: auto_lr_scaling needs a non-zero first value to find the decay "
          "factor values[1] / values[0]",
          key,
          fmt::join(options.values, ", ")));
    }
    const double gamma = options.values.size() > 1 ? options.values[1] / options.values[0] : 1.0;
    for (size_t i = 0; i < options.values.size(); ++i) {
      options.values[i] = scaled_lr * std::pow(gamma, static_cast<double>(i));
    }
  } else if (name == "step_with_fixed_gamma") {
    options.base_value = scaled_lr;
  } else if (name == "inverse_sqrt") {
    options.start_value = scaled_lr;
  } else if (name == "polynomial") {
    throw ConfigError(fmt::format(
        "{}.name = polynomial: auto_lr_scaling has no rule for a polynomial schedule (VISSL "
        "has none either); set auto_lr_scaling.auto_scale to False and give base_value",
        key));
  } else if (name == "composite") {
    scale_composite(options, scaled_lr, scaling, per_node_batch_size, key);
  } else {
    throw ConfigError(fmt::format(
        "{}.name = '{}' is not supported; use one of {}", key, name, detail::kScheduleNames));
  }
}

} // namespace

void apply_auto_lr_scaling(
    ScheduleOptions& options,
    const AutoLrScaling& scaling,
    int64_t global_batch_size,
    int64_t per_node_batch_size) {
  if (!scaling.auto_scale) {
    return;
  }
  const std::string key = "AutoLrScaling";
  if (scaling.scaling_type != "linear" && scaling.scaling_type != "sqrt") {
    throw ConfigError(fmt::format(
        "{}::scaling_type = '{}' is not supported; use 'linear' or 'sqrt'",
        key,
        scaling.scaling_type));
  }
  if (scaling.base_lr_batch_size <= 0) {
    throw ConfigError(
        fmt::format("{}::base_lr_batch_size = {} must be > 0", key, scaling.base_lr_batch_size));
  }
  if (global_batch_size <= 0 || per_node_batch_size <= 0 ||
      per_node_batch_size > global_batch_size) {
    throw ConfigError(fmt::format(
        "auto_lr_scaling needs 0 < per-node batch size ({}) <= global batch size ({}); check "
        "the batch size per replica and the number of nodes and processes per node",
        per_node_batch_size,
        global_batch_size));
  }
  double factor =
      static_cast<double>(global_batch_size) / static_cast<double>(scaling.base_lr_batch_size);
  if (scaling.scaling_type == "sqrt") {
    factor = std::sqrt(factor);
  }
  scale_schedule(options, scaling.base_value * factor, scaling, per_node_batch_size, key);
}

} // namespace largo::optim
