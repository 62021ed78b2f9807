// HOOKS.EMA_MODEL in the training loop: VISSL's EmaHook.on_update after every optimizer step.
// The average (optim/model_ema.h) is kept over the parallel model's local_state(): the
// module's parameters and buffers, whole on every rank under DDP and ZeRO-1/2 (every rank
// holds the same average); under FSDP this rank's 1-D pieces of the trained parameters (each
// rank averages its own; the checkpoint gathers them, checkpoint/training_state.h). The
// trainer also hands it to the checkpoints (checkpoint/training_state.h, SAVE_EMA_MODEL) and
// to the evaluation (EvaluationHook::also_evaluate, ENABLE_EMA_METERS).
#pragma once

#include <largo/optim/model_ema.h>
#include <largo/train/training_hooks.h>

namespace largo::train {

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
