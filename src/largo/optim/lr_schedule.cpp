#include <largo/optim/lr_schedule.h>

#include "lr_schedule_parts.h"

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace largo::optim {
namespace {

using detail::check_where;
using detail::kScheduleNames;
using detail::kWhereEpsilon;

class ConstantSchedule : public LrSchedule {
 public:
  explicit ConstantSchedule(double value) : value_(value) {}
  double value_at(double where) const override {
    check_where(where);
    return value_;
  }

 private:
  double value_;
};

class LinearSchedule : public LrSchedule {
 public:
  LinearSchedule(double start, double end) : start_(start), end_(end) {}
  double value_at(double where) const override {
    check_where(where);
    return start_ + (end_ - start_) * where;
  }

 private:
  double start_, end_;
};

class CosineSchedule : public LrSchedule {
 public:
  CosineSchedule(double start, double end) : start_(start), end_(end) {}
  double value_at(double where) const override {
    check_where(where);
    return end_ + 0.5 * (start_ - end_) * (1.0 + std::cos(std::numbers::pi * where));
  }

 private:
  double start_, end_;
};

// values[i] over the i-th of values.size() equal spans of training.
class StepSchedule : public LrSchedule {
 public:
  explicit StepSchedule(std::vector<double> values) : values_(std::move(values)) {}
  double value_at(double where) const override {
    check_where(where);
    const auto num_values = static_cast<int64_t>(values_.size());
    const auto index = static_cast<int64_t>(std::floor((where + kWhereEpsilon) * num_values));
    return values_[std::clamp<int64_t>(index, 0, num_values - 1)];
  }

 private:
  std::vector<double> values_;
};

// values[k] where k is the number of milestones <= the current (whole) epoch.
class MultiStepSchedule : public LrSchedule {
 public:
  MultiStepSchedule(std::vector<double> values, std::vector<int64_t> milestones, int64_t num_epochs)
      : values_(std::move(values)), milestones_(std::move(milestones)), num_epochs_(num_epochs) {}
  double value_at(double where) const override {
    check_where(where);
    const auto epoch = static_cast<int64_t>((where + kWhereEpsilon) * num_epochs_);
    const auto index =
        std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
    return values_[index];
  }

 private:
  std::vector<double> values_;
  std::vector<int64_t> milestones_;
  int64_t num_epochs_;
};

class CompositeSchedule : public LrSchedule {
 public:
  CompositeSchedule(
      std::vector<std::unique_ptr<LrSchedule>> schedules,
      std::vector<double> lengths,
      std::vector<bool> rescaled)
      : schedules_(std::move(schedules)),
        lengths_(std::move(lengths)),
        rescaled_(std::move(rescaled)) {}
  double value_at(double where) const override {
    check_where(where);
    size_t i = 0;
    double end_of_current = lengths_[0];
    while (where + kWhereEpsilon > end_of_current && i + 1 < schedules_.size()) {
      ++i;
      end_of_current += lengths_[i];
    }
    double sub_where = where;
    if (rescaled_[i]) {
      const double start_of_current = end_of_current - lengths_[i];
      // Clamped: the epsilon above can switch schedules a hair before the boundary.
      sub_where = std::clamp((where - start_of_current) / lengths_[i], 0.0, 1.0);
    }
    return schedules_[i]->value_at(sub_where);
  }

 private:
  std::vector<std::unique_ptr<LrSchedule>> schedules_;
  std::vector<double> lengths_;
  std::vector<bool> rescaled_;
};

std::unique_ptr<LrSchedule> make_multistep(const ScheduleOptions& options, const std::string& key) {
  if (options.values.empty()) {
    throw ConfigError(fmt::format("{}.values is empty; give at least one value", key));
  }
  if (options.num_epochs <= 0) {
    throw ConfigError(fmt::format(
        "{}.num_epochs (ScheduleOptions::num_epochs) = {} must be > 0", key, options.num_epochs));
  }
  std::vector<int64_t> milestones = options.milestones;
  if (milestones.empty()) {
    const auto step_width = static_cast<int64_t>(
        std::ceil(static_cast<double>(options.num_epochs) / options.values.size()));
    for (size_t i = 0; i + 1 < options.values.size(); ++i) {
      milestones.push_back(step_width * static_cast<int64_t>(i + 1));
    }
  }
  if (milestones.size() + 1 != options.values.size()) {
    throw ConfigError(fmt::format(
        "{}.milestones = [{}] has {} entries but {}.values has {}; give one milestone fewer "
        "than values",
        key,
        fmt::join(milestones, ", "),
        milestones.size(),
        key,
        options.values.size()));
  }
  for (size_t i = 0; i < milestones.size(); ++i) {
    if (milestones[i] <= 0 || (i > 0 && milestones[i] <= milestones[i - 1])) {
      throw ConfigError(fmt::format(
          "{}.milestones = [{}] must be positive and strictly increasing",
          key,
          fmt::join(milestones, ", ")));
    }
  }
  if (!milestones.empty() && milestones.back() >= options.num_epochs) {
    throw ConfigError(fmt::format(
        "{}.milestones = [{}]: the last milestone must be before the end of training "
        "(num_epochs = {}), or its value is never used",
        key,
        fmt::join(milestones, ", "),
        options.num_epochs));
  }
  return std::make_unique<MultiStepSchedule>(
      options.values, std::move(milestones), options.num_epochs);
}

std::unique_ptr<LrSchedule> make_composite(const ScheduleOptions& options, const std::string& key) {
  const size_t num_schedules = options.schedulers.size();
  if (num_schedules == 0) {
    throw ConfigError(fmt::format(
        "{}.schedulers is empty; a composite schedule needs at least "
        "one sub-schedule",
        key));
  }
  if (options.lengths.size() != num_schedules) {
    throw ConfigError(fmt::format(
        "{}.lengths = [{}] has {} entries but there are {} schedulers",
        key,
        fmt::join(options.lengths, ", "),
        options.lengths.size(),
        num_schedules));
  }
  double total_length = 0.0;
  for (double length : options.lengths) {
    if (!(length > 0.0)) {
      throw ConfigError(fmt::format(
          "{}.lengths = [{}]: every length must be > 0", key, fmt::join(options.lengths, ", ")));
    }
    total_length += length;
  }
  if (std::abs(total_length - 1.0) > 1e-3) {
    throw ConfigError(fmt::format(
        "{}.lengths = [{}] sum to {}; they must sum to 1",
        key,
        fmt::join(options.lengths, ", "),
        total_length));
  }
  if (!options.interval_scaling.empty() && options.interval_scaling.size() != num_schedules) {
    throw ConfigError(fmt::format(
        "{}.interval_scaling has {} entries but there are {} schedulers; give one per "
        "scheduler or none",
        key,
        options.interval_scaling.size(),
        num_schedules));
  }
  std::vector<bool> rescaled(num_schedules, true);
  for (size_t i = 0; i < options.interval_scaling.size(); ++i) {
    const std::string& scaling = options.interval_scaling[i];
    if (scaling != "rescaled" && scaling != "fixed") {
      throw ConfigError(fmt::format(
          "{}.interval_scaling[{}] = '{}' is not supported; use "
          "'rescaled' or 'fixed'",
          key,
          i,
          scaling));
    }
    rescaled[i] = scaling == "rescaled";
  }
  std::vector<std::unique_ptr<LrSchedule>> schedules;
  for (size_t i = 0; i < num_schedules; ++i) {
    schedules.push_back(
        make_schedule(options.schedulers[i], fmt::format("{}.schedulers[{}]", key, i)));
  }
  return std::make_unique<CompositeSchedule>(
      std::move(schedules), options.lengths, std::move(rescaled));
}

void check_update_interval(const std::string& update_interval, const std::string& key) {
  if (update_interval != "epoch" && update_interval != "step") {
    throw ConfigError(fmt::format(
        "{}.update_interval = '{}' is not supported; use 'epoch' or 'step'", key, update_interval));
  }
}

} // namespace

std::unique_ptr<LrSchedule>
make_schedule(const ScheduleOptions& options, const std::string& key_prefix) {
  check_update_interval(options.update_interval, key_prefix);
  const std::string& name = options.name;
  if (name == "constant") {
    return std::make_unique<ConstantSchedule>(options.value);
  }
  if (name == "linear") {
    return std::make_unique<LinearSchedule>(options.start_value, options.end_value);
  }
  if (name == "cosine") {
    return std::make_unique<CosineSchedule>(options.start_value, options.end_value);
  }
  if (name == "step") {
    if (options.values.empty()) {
      throw ConfigError(fmt::format("{}.values is empty; give at least one value", key_prefix));
    }
    return std::make_unique<StepSchedule>(options.values);
  }
  if (name == "multistep") {
    return make_multistep(options, key_prefix);
  }
  if (name == "composite") {
    return make_composite(options, key_prefix);
  }
  if (auto schedule = detail::make_vissl_schedule(options, key_prefix)) {
    return schedule;
  }
  throw ConfigError(fmt::format(
      "{}.name = '{}' is not supported; use one of {}", key_prefix, name, kScheduleNames));
}

double where_for(
    int64_t epoch,
    int64_t iteration_in_epoch,
    int64_t iterations_per_epoch,
    int64_t num_epochs,
    const std::string& update_interval) {
  check_update_interval(update_interval, "ScheduleOptions");
  if (num_epochs <= 0) {
    throw ConfigError(fmt::format("ScheduleOptions::num_epochs = {} must be > 0", num_epochs));
  }
  if (update_interval == "epoch") {
    return static_cast<double>(epoch) / static_cast<double>(num_epochs);
  }
  if (iterations_per_epoch <= 0) {
    throw ConfigError(fmt::format(
        "update_interval 'step' needs at least one iteration per epoch, got {}",
        iterations_per_epoch));
  }
  return static_cast<double>(epoch * iterations_per_epoch + iteration_in_epoch) /
         static_cast<double>(iterations_per_epoch * num_epochs);
}

} // namespace largo::optim
