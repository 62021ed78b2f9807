#include <largo/train/model_ema_hook.h>

namespace largo::train {

ModelEmaHook::ModelEmaHook(optim::ModelEma& ema, optim::NamedTensors model_tensors)
    : ema_(ema), model_tensors_(std::move(model_tensors)) {}

void ModelEmaHook::on_step_end(const StepEvent& event) {
  const checkpoint::TrainingProgress& progress = event.progress; // already past the step
  const int64_t steps_before = progress.iteration - 1;
  const int64_t total_steps = progress.iterations_per_epoch * progress.num_epochs;
  ema_.on_update(model_tensors_, steps_before, static_cast<double>(steps_before) / total_steps);
}

} // namespace largo::train
