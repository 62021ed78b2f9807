// What the learning-rate schedule files share (lr_schedule.cpp: ClassyVision's schedules
// and make_schedule; vissl_lr_schedules.cpp: the ones VISSL adds; auto_lr_scaling.cpp).
#pragma once

#include <largo/core/error.h>
#include <largo/optim/lr_schedule.h>

#include <fmt/format.h>

#include <memory>
#include <string>

namespace largo::optim::detail {

// Progress values are computed in floating point (e.g. 30 / 90 * 3 may land just below 1);
// like ClassyVision, nudge them before turning them into an index so a boundary that is
// reached exactly selects the next value.
inline constexpr double kWhereEpsilon = 1e-6;

inline constexpr const char* kScheduleNames =
    "constant, linear, cosine, step, multistep, composite, polynomial, step_with_fixed_gamma, "
    "cosine_warm_restart or inverse_sqrt";

inline void check_where(double where) {
  if (!(where >= 0.0 && where <= 1.0)) {
    throw Error(fmt::format(
        "a learning-rate schedule was asked for its value at training progress {}, outside "
        "[0, 1]; training ran past ScheduleOptions::num_epochs",
        where));
  }
}

// polynomial, step_with_fixed_gamma, cosine_warm_restart or inverse_sqrt, validated
// (ConfigError naming `key`.field); nullptr for any other name.
std::unique_ptr<LrSchedule>
make_vissl_schedule(const ScheduleOptions& options, const std::string& key);

} // namespace largo::optim::detail
