// HOOKS.EMA_MODEL in the training loop: VISSL's EmaHook.on_update after every optimizer step.
// The average (optim/model_ema.h) is kept over the module's parameters and buffers, which are
// whole on every rank in the modes it is allowed with (not FSDP: train/run_plan.cpp), so every
// rank holds the same average of the same weights. The trainer also hands it to the
// checkpoints (checkpoint/training_state.h, SAVE_EMA_MODEL) and to the evaluation
// (EvaluationHook::also_evaluate, ENABLE_EMA_METERS).
#pragma once

#include <largo/optim/model_ema.h>
#include <largo/train/training_hooks.h>

#include <torch/nn/module.h>

namespace largo::train {

// Every parameter and buffer of `module` by name: what the average is kept over.
optim::NamedTensors parameters_and_buffers(const torch::nn::Module& module);

class ModelEmaHook : public TrainingHook {
 public:
  ModelEmaHook(optim::ModelEma& ema, optim::NamedTensors model_tensors);
  // ModelEma::on_update with the steps done before this one and the fraction of the run's
  // steps they are (VISSL's task.iteration and task.where).
  void on_step_end(const StepEvent& event) override;

 private:
  optim::ModelEma& ema_;
  optim::NamedTensors model_tensors_;
};

} // namespace largo::train
