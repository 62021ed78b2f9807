#include <largo/train/train_step.h>

#include <largo/models/linear_eval.h>
#include <largo/models/multi_crop_model.h>

#include <cmath>

namespace largo::train {

TrainStep::TrainStep(parallel::ParallelModel& model, torch::Device device, TrainStepOptions options)
    : model_(model), device_(device), options_(options) {}

StepResult
TrainStep::run(const std::function<data::Batch()>& next_batch, int64_t num_micro_batches) {
  model_.zero_grad();
  StepResult result;
  float loss_sum = 0.0f;
  bool losses_finite = true;
  SelfSupervisedLoss* self_supervised = options_.self_supervised;
  if (self_supervised != nullptr) { // DINO's teacher, MoCo's encoder: whole values under FSDP
    self_supervised->before_step(model_);
  }
  const auto loss = [this, self_supervised](const at::Tensor& output, const at::Tensor& labels) {
    if (self_supervised != nullptr) {
      return self_supervised->loss(output, labels);
    }
    return classification_loss(
        models::split_outputs(output, options_.output_widths), labels, options_.loss);
  };
  for (int64_t micro = 0; micro < num_micro_batches; ++micro) {
    data::Batch batch = next_batch();
    const at::Tensor input = batch.views.empty() ? batch.images : models::pack_views(batch.views);
    at::Tensor images = input.to(device_, /*non_blocking=*/true);
    at::Tensor labels = batch.labels.to(device_, /*non_blocking=*/true);
    auto scope = model_.micro_step(/*synchronize=*/micro + 1 == num_micro_batches);
    const auto loss_value =
        static_cast<float>(model_.forward_backward(images, labels, loss, num_micro_batches));
    // Not thrown here: the ranks decide together in finish_backward, so that a NaN on one
    // rank stops (or, with loss scaling, skips) every rank at the same step.
    if (!std::isfinite(loss_value) && losses_finite) {
      losses_finite = false;
      result.non_finite_loss = loss_value;
    }
    loss_sum += loss_value;
    result.num_images += images.size(0);
  }
  result.loss = loss_sum / static_cast<float>(num_micro_batches);
  result.finite = model_.finish_backward(losses_finite);
  if (self_supervised != nullptr) { // MODEL.TEMP_FROZEN_PARAMS_ITER_MAP, before clipping
    self_supervised->before_optimizer_step(model_);
  }
  if (result.finite && options_.clip_gradients) { // after unscale, before LARC
    model_.clip_grad_norm(options_.max_norm, options_.norm_type);
  }
  if (result.finite || model_.precision().has_loss_scaling()) {
    // skipped (and counted) when a gradient was inf/NaN
    if (model_.step() && self_supervised != nullptr) {
      self_supervised->after_optimizer_step(model_); // SwAV's prototypes normalised
    }
  }
  return result;
}

} // namespace largo::train
