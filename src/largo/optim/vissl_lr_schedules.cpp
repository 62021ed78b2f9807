// The schedules VISSL configs use beyond ClassyVision's basic ones: polynomial and
// step_with_fixed_gamma (ClassyVision's, registered for VISSL), cosine_warm_restart and
// inverse_sqrt (VISSL's vissl/optimizers/param_scheduler/). Values as VISSL computes them,
// checked against tests/reference/gen_vissl_schedule_baselines.py. Invalid values throw
// OptionError (core/error.h) naming the schedule's option under the caller's name for it.
#include "lr_schedule_parts.h"

#include <largo/core/error.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

namespace largo::optim::detail {
namespace {

class PolynomialSchedule : public LrSchedule {
 public:
  PolynomialSchedule(double base_value, double power) : base_value_(base_value), power_(power) {}
  double value_at(double where) const override {
    check_where(where);
    return base_value_ * std::pow(1.0 - where, power_);
  }

 private:
  double base_value_, power_;
};

// base_value * gamma^k over the k-th of num_decays + 1 equal spans of training.
class StepWithFixedGammaSchedule : public LrSchedule {
 public:
  StepWithFixedGammaSchedule(double base_value, int64_t num_decays, double gamma) {
    for (int64_t k = 0; k <= num_decays; ++k) {
      values_.push_back(base_value * std::pow(gamma, static_cast<double>(k)));
    }
  }
  double value_at(double where) const override {
    check_where(where);
    const auto num_values = static_cast<int64_t>(values_.size());
    const auto index = static_cast<int64_t>((where + kWhereEpsilon) * num_values);
    return values_[std::clamp<int64_t>(index, 0, num_values - 1)];
  }

 private:
  std::vector<double> values_;
};

class CosineWarmRestartSchedule : public LrSchedule {
 public:
  explicit CosineWarmRestartSchedule(const ScheduleOptions& options)
      : length_(options.restart_interval_length),
        end_(options.end_value),
        full_wave_(options.wave_type == "full") {
    // The restarts are where numpy.arange(length, 1, step) puts them: ceil((1 - length) /
    // step) points length + i * step, after the start at 0.
    const double step = full_wave_ ? 2.0 * length_ : length_;
    const auto count = static_cast<int64_t>(std::max(0.0, std::ceil((1.0 - length_) / step)));
    restarts_.push_back(0.0);
    for (int64_t i = 0; i < count; ++i) {
      restarts_.push_back(length_ + static_cast<double>(i) * step);
    }
    const double start = options.start_value;
    for (size_t k = 0; k < restarts_.size(); ++k) {
      if (options.is_adaptive) {
        // The single cosine's value at the restart (a full wave's at half a period later).
        const double at = full_wave_ ? length_ + restarts_[k] : restarts_[k];
        peaks_.push_back(end_ + 0.5 * (start - end_) * (1.0 + std::cos(std::numbers::pi * at)));
      } else {
        peaks_.push_back(start * std::pow(options.lr_multiplier, static_cast<double>(k)));
      }
    }
  }
  double value_at(double where) const override {
    check_where(where);
    const auto after = std::upper_bound(restarts_.begin(), restarts_.end(), where);
    const auto restart = std::max<std::ptrdiff_t>(after - restarts_.begin() - 1, 0);
    const double peak = peaks_[static_cast<size_t>(restart)];
    const double phase = full_wave_ ? where / length_ : std::fmod(where, length_) / length_;
    return end_ + 0.5 * (peak - end_) * (1.0 + std::cos(std::numbers::pi * phase));
  }

 private:
  double length_, end_;
  bool full_wave_;
  std::vector<double> restarts_;
  std::vector<double> peaks_;
};

class InverseSqrtSchedule : public LrSchedule {
 public:
  InverseSqrtSchedule(double start_value, double warmup_interval_length)
      : factor_(
            warmup_interval_length > 0.0 ? start_value * std::sqrt(warmup_interval_length)
                                         : start_value) {}
  double value_at(double where) const override {
    check_where(where);
    return where > 0.0 ? factor_ * std::pow(where, -0.5) : factor_;
  }

 private:
  double factor_;
};

std::unique_ptr<LrSchedule>
make_step_with_fixed_gamma(const ScheduleOptions& options, const std::string& key) {
  require_option(
      options.base_value > 0.0,
      key + ".base_value",
      fmt::format("{}", options.base_value),
      "a number > 0");
  require_option(
      options.num_decays > 0,
      key + ".num_decays",
      fmt::format("{}", options.num_decays),
      "an integer > 0");
  require_option(
      options.gamma > 0.0, key + ".gamma", fmt::format("{}", options.gamma), "a number > 0");
  return std::make_unique<StepWithFixedGammaSchedule>(
      options.base_value, options.num_decays, options.gamma);
}

std::unique_ptr<LrSchedule>
make_cosine_warm_restart(const ScheduleOptions& options, const std::string& key) {
  require_option(
      options.restart_interval_length > 0.0 && options.restart_interval_length <= 1.0,
      key + ".restart_interval_length",
      fmt::format("{}", options.restart_interval_length),
      "a fraction of training in (0, 1]");
  require_option(
      options.wave_type == "half" || options.wave_type == "full",
      key + ".wave_type",
      options.wave_type,
      "half or full");
  require_option(
      options.lr_multiplier > 0.0,
      key + ".lr_multiplier",
      fmt::format("{}", options.lr_multiplier),
      "a number > 0");
  return std::make_unique<CosineWarmRestartSchedule>(options);
}

} // namespace

std::unique_ptr<LrSchedule>
make_vissl_schedule(const ScheduleOptions& options, const std::string& key) {
  if (options.name == "polynomial") {
    require_option(
        std::isfinite(options.power) && options.power >= 0.0,
        key + ".power",
        fmt::format("{}", options.power),
        "a number >= 0");
    return std::make_unique<PolynomialSchedule>(options.base_value, options.power);
  }
  if (options.name == "step_with_fixed_gamma") {
    return make_step_with_fixed_gamma(options, key);
  }
  if (options.name == "cosine_warm_restart") {
    return make_cosine_warm_restart(options, key);
  }
  if (options.name == "inverse_sqrt") {
    require_option(
        options.warmup_interval_length >= 0.0 && options.warmup_interval_length <= 1.0,
        key + ".warmup_interval_length",
        fmt::format("{}", options.warmup_interval_length),
        "a fraction of training in [0, 1]");
    return std::make_unique<InverseSqrtSchedule>(
        options.start_value, options.warmup_interval_length);
  }
  return nullptr;
}

} // namespace largo::optim::detail
