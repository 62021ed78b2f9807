// An exponential moving average of a model's weights, as VISSL's HOOKS.EMA_MODEL keeps it
// (vissl/utils/ema_model.py ModelEmaV2 and vissl/hooks/ema_hooks.py EmaHook):
//   - it starts as a copy of the model (VISSL builds it and calls set());
//   - after an optimizer step that was preceded by `iteration` steps, when
//     iteration % update_iter == 0: if the fraction of training done before that step,
//     where = iteration / total iterations, is below warmup the average becomes a copy of the
//     model again; otherwise average = decay * average + (1 - decay) * value;
//   - every parameter and buffer is averaged (BatchNorm running statistics too), in float32
//     (float64 for float64 tensors) whatever the model's precision, like VISSL's float32 EMA
//     model; integer buffers (num_batches_tracked) are copied.
//
// It works on named tensors, not on a module, so that it holds whatever the caller trains:
// the full parameters and buffers (module->named_parameters() + named_buffers(), or a model
// state dict), or this rank's shards in sharded modes (ZeRO-3/FSDP pieces), each rank then
// averaging its own pieces. The names only have to stay the same from call to call; the
// averages are stored under them in state_dict().
//
// No collectives.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/ordered_dict.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

namespace largo::optim {

using NamedTensors = torch::OrderedDict<std::string, at::Tensor>;

struct ModelEmaOptions {
  double decay = 0.9999;   // HOOKS.EMA_MODEL.DECAY, in [0, 1]
  int64_t update_iter = 1; // HOOKS.EMA_MODEL.UPDATE_ITER: update after every N-th step
  double warmup = 0.05;    // HOOKS.EMA_MODEL.WARMUP: fraction of training spent copying
  // Where the averages live (HOOKS.EMA_MODEL.EMA_DEVICE cpu: the CPU, to spare GPU memory);
  // unset: beside each tensor.
  std::optional<c10::Device> device;
};

// Throws OptionError naming ModelEmaOptions::decay / update_iter / warmup for decay outside
// [0, 1], update_iter < 1 or warmup outside [0, 1].
void validate_model_ema_options(const ModelEmaOptions& options);

class ModelEma {
 public:
  // Copies `tensors` (on their device). Validates `options` (validate_model_ema_options).
  ModelEma(const NamedTensors& tensors, ModelEmaOptions options);

  // VISSL's EmaHook.on_update: call after each optimizer step with the number of steps done
  // before it (0 for the first) and `where` = that number / the run's total steps.
  // Returns whether it updated (or copied).
  bool on_update(const NamedTensors& tensors, int64_t iteration, double where);

  // average = decay * average + (1 - decay) * value (integer tensors: value).
  void update(const NamedTensors& tensors);
  // average = value.
  void set(const NamedTensors& tensors);

  // The averages by name, in the order they were given.
  const NamedTensors& averages() const {
    return averages_;
  }
  // Copies each average into the tensor of the same name in `targets` (e.g. a second model
  // built for evaluating the EMA). Throws largo::Error listing names that do not match.
  void copy_to(const NamedTensors& targets) const;

  const ModelEmaOptions& options() const {
    return options_;
  }

  // {"decay", "update_iter", "warmup", "averages": {name: tensor}}, the averages on the CPU
  // (the tensors themselves when they are there); torch.load reads it.
  c10::IValue state_dict() const;
  // Restores state_dict() output (the averages are copied). Throws CheckpointError when the
  // names or shapes differ from this average's.
  void load_state_dict(const c10::IValue& state);

 private:
  // Throws largo::Error unless `tensors` has exactly this average's names and shapes.
  void check_matches(const NamedTensors& tensors, const std::string& what) const;

  ModelEmaOptions options_;
  NamedTensors averages_;
};

// For the lifetime of this object the average is in the model: the constructor copies it into
// `model_tensors` (ModelEma::copy_to) after keeping their own values, which the destructor puts
// back bit for bit, also when what ran in between threw. For evaluating or gathering the
// average with the model's own machinery (an FSDP gather of each rank's pieces).
class AverageInModel {
 public:
  AverageInModel(const ModelEma& ema, NamedTensors model_tensors);
  ~AverageInModel();
  AverageInModel(const AverageInModel&) = delete;
  AverageInModel& operator=(const AverageInModel&) = delete;

 private:
  NamedTensors model_tensors_;
  std::vector<at::Tensor> own_values_;
};

} // namespace largo::optim
