// Learning-rate schedules as functions of training progress, with VISSL's
// OPTIMIZER.param_schedulers.lr keys and ClassyVision's semantics, and VISSL's automatic
// scaling of the learning rate to the global batch size.
//
// A schedule maps where ∈ [0, 1] (the fraction of training done) to a value; where_for()
// turns (epoch, iteration) into `where` for the "epoch" or "step" update interval.
// Schedules hold no state: resuming only needs the epoch and iteration.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace largo::optim {

// OPTIMIZER.param_schedulers.lr (and lr_head). Only the fields that `name` uses are read.
struct ScheduleOptions {
  // constant | linear | cosine | step | multistep | composite (ClassyVision), polynomial |
  // step_with_fixed_gamma (ClassyVision, for VISSL), cosine_warm_restart | inverse_sqrt
  // (VISSL's own)
  std::string name = "multistep";
  double value = 0.1;       // constant
  double start_value = 0.1; // linear, cosine, cosine_warm_restart, inverse_sqrt
  double end_value = 0.0;   // linear, cosine, cosine_warm_restart
  // polynomial: base_value * (1 - where)^power
  double base_value = 0.1; // polynomial, step_with_fixed_gamma
  double power = 1.0;
  // step_with_fixed_gamma: base_value * gamma^k over num_decays + 1 equal spans
  int64_t num_decays = 3;
  double gamma = 0.1;
  // cosine_warm_restart: a cosine from the current peak down to end_value over each
  // restart_interval_length of training ("half"), or a full cosine wave of period twice that
  // ("full"); the peak after the k-th restart is start_value * lr_multiplier^k, or with
  // is_adaptive the value the single cosine from start_value to end_value has there.
  double restart_interval_length = 0.5;
  std::string wave_type = "half";
  double lr_multiplier = 1.0;
  bool is_adaptive = false;
  // inverse_sqrt: start_value * sqrt(warmup_interval_length) / sqrt(where) (start_value *
  // sqrt(warmup_interval_length) at where 0; with warmup_interval_length 0, start_value /
  // sqrt(where)), as VISSL computes it: it reaches start_value at the end of a warm-up of
  // that length, which a composite schedule puts before it.
  double warmup_interval_length = 0.0;
  std::vector<double> values{0.1, 0.01, 0.001}; // step, multistep
  // multistep: the epochs at which the next value starts (values.size() - 1 of them,
  // increasing); empty means evenly spaced over num_epochs.
  std::vector<int64_t> milestones{30, 60};
  int64_t num_epochs = 90;                 // multistep's time base (OPTIMIZER.num_epochs)
  std::vector<ScheduleOptions> schedulers; // composite: the sub-schedules
  std::vector<double> lengths;             // composite: fractions summing to 1
  // composite, per sub-schedule: "rescaled" (sees its own 0→1 progress) or "fixed" (sees
  // the global progress); empty means all rescaled.
  std::vector<std::string> interval_scaling;
  std::string update_interval = "epoch"; // epoch | step
};

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The value at training progress where ∈ [0, 1]; throws largo::Error outside it.
  virtual double value_at(double where) const = 0;
};

// Validates the options (ConfigError naming the field under key_prefix, "ScheduleOptions.name",
// and the value) and builds the schedule.
std::unique_ptr<LrSchedule>
make_schedule(const ScheduleOptions& options, const std::string& key_prefix = "ScheduleOptions");

// OPTIMIZER.param_schedulers.lr.auto_lr_scaling
struct AutoLrScaling {
  bool auto_scale = false;
  double base_value = 0.1; // the lr that suits base_lr_batch_size
  int64_t base_lr_batch_size = 256;
  std::string scaling_type = "linear"; // linear | sqrt
};

// VISSL's rule. lr* = base_value * s, s = global_batch_size / base_lr_batch_size (square-
// rooted for "sqrt"). constant: value = lr*; linear: end_value = lr*; cosine: start_value =
// lr* and end_value keeps its ratio to start_value (cosine_warm_restart too); step, multistep:
// values[i] = lr* * gamma^i with gamma = values[1] / values[0]; step_with_fixed_gamma:
// base_value = lr*; inverse_sqrt: start_value = lr*; polynomial: a ConfigError (VISSL has no
// rule for it either); composite: every sub-schedule is scaled, then
// each linear sub-schedule (a warm-up) starts at base_value * per_node_batch_size /
// base_lr_batch_size. When that start equals its end (one node with linear scaling) the
// warm-up is dropped, the remaining lengths are stretched to sum to 1, and a single
// remaining schedule replaces the composite. No-op unless scaling.auto_scale.
void apply_auto_lr_scaling(
    ScheduleOptions& options,
    const AutoLrScaling& scaling,
    int64_t global_batch_size,
    int64_t per_node_batch_size);

// Training progress for the schedule: epoch / num_epochs for update_interval "epoch";
// (epoch * iterations_per_epoch + iteration_in_epoch) / (iterations_per_epoch * num_epochs)
// for "step". Throws ConfigError for another update_interval.
double where_for(
    int64_t epoch,
    int64_t iteration_in_epoch,
    int64_t iterations_per_epoch,
    int64_t num_epochs,
    const std::string& update_interval);

} // namespace largo::optim
