#include <largo/train/train_step.h>

#include <largo/core/error.h>
#include <largo/models/linear_eval.h>
#include <largo/models/multi_crop_model.h>

#include <cmath>

namespace largo::train {

namespace {

// Fills result's loss (the float mean of the micro-steps', summed in their order) and
// non_finite_loss (the first inf/NaN one) from the host copy of the losses; returns whether
// every loss was finite.
bool take_losses(const float* losses, int64_t count, StepResult& result) {
  float loss_sum = 0.0f;
  bool finite = true;
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(losses[i]) && finite) {
      finite = false;
      result.non_finite_loss = losses[i];
    }
    loss_sum += losses[i];
  }
  result.loss = loss_sum / static_cast<float>(count);
  return finite;
}

} // namespace

void read_step_results(std::vector<StepResult>& results) {
  std::vector<at::Tensor> pieces; // every unread step's losses, then its flag
  for (const StepResult& result : results) {
    if (result.unread) {
      pieces.push_back(result.unread->losses);
      if (result.unread->non_finite.defined()) {
        pieces.push_back(result.unread->non_finite);
      }
    }
  }
  if (pieces.empty()) {
    return;
  }
  for (at::Tensor& piece : pieces) { // a flag without gradients to check is a CPU zero
    piece = piece.to(pieces.front().device());
  }
  const at::Tensor host = at::cat(pieces).cpu(); // the one device sync
  const float* next = host.data_ptr<float>();
  for (StepResult& result : results) {
    if (!result.unread) {
      continue;
    }
    const int64_t count = result.unread->losses.numel();
    take_losses(next, count, result);
    next += count;
    if (result.unread->non_finite.defined()) {
      result.finite = *next++ == 0.0f; // the losses' inf/NaN is in the agreed flag
    }
    result.unread.reset();
  }
}

TrainStep::TrainStep(parallel::ParallelModel& model, torch::Device device, TrainStepOptions options)
    : model_(model), device_(device), options_(options) {
  if (!options_.sync_every_step && model_.precision().has_loss_scaling()) {
    throw OptionError(
        "TrainStepOptions::sync_every_step",
        "false",
        "true with loss scaling (float16), whose skip and scale update the host decides "
        "each step");
  }
}

StepResult
TrainStep::run(const std::function<data::Batch()>& next_batch, int64_t num_micro_batches) {
  model_.zero_grad();
  StepResult result;
  SelfSupervisedLoss* self_supervised = options_.self_supervised;
  if (self_supervised != nullptr) { // DINO's teacher, MoCo's encoder: whole values under FSDP
    self_supervised->before_step(model_);
  }
  finish_backward(run_micro_steps(next_batch, num_micro_batches, result), result);
  if (self_supervised != nullptr) { // MODEL.TEMP_FROZEN_PARAMS_ITER_MAP, before clipping
    self_supervised->before_optimizer_step(model_);
  }
  // Unread, the decision is the caller's (at its read); the optimizer steps meanwhile.
  const bool finite = result.unread || result.finite;
  if (finite && options_.clip_gradients) { // after unscale, before LARC
    model_.clip_grad_norm(options_.max_norm, options_.norm_type);
  }
  if (finite || model_.precision().has_loss_scaling()) {
    // skipped (and counted) when a gradient was inf/NaN
    if (model_.step() && self_supervised != nullptr) {
      self_supervised->after_optimizer_step(model_); // SwAV's prototypes normalised
    }
  }
  return result;
}

at::Tensor TrainStep::run_micro_steps(
    const std::function<data::Batch()>& next_batch, int64_t num_micro_batches, StepResult& result) {
  SelfSupervisedLoss* self_supervised = options_.self_supervised;
  const auto loss = [this, self_supervised](const at::Tensor& output, const at::Tensor& labels) {
    if (self_supervised != nullptr) {
      return self_supervised->loss(output, labels);
    }
    return classification_loss(
        models::split_outputs(output, options_.output_widths), labels, options_.loss);
  };
  std::vector<at::Tensor> losses;
  for (int64_t micro = 0; micro < num_micro_batches; ++micro) {
    data::Batch batch = next_batch();
    const at::Tensor input = batch.views.empty() ? batch.images : models::pack_views(batch.views);
    at::Tensor images = input.to(device_, /*non_blocking=*/true);
    at::Tensor labels = batch.labels.to(device_, /*non_blocking=*/true);
    auto scope = model_.micro_step(/*synchronize=*/micro + 1 == num_micro_batches);
    // float32, as the loss value a step reports (a float64 model's rounded once).
    losses.push_back(
        model_.forward_backward_on_device(images, labels, loss, num_micro_batches).to(at::kFloat));
    result.num_images += images.size(0);
  }
  return at::stack(losses);
}

// Not thrown on an inf/NaN loss: the ranks decide together, so that a NaN on one rank stops
// (or, with loss scaling, skips) every rank at the same step.
void TrainStep::finish_backward(const at::Tensor& losses, StepResult& result) {
  if (options_.sync_every_step) {
    const at::Tensor host = losses.cpu();
    const bool losses_finite = take_losses(host.data_ptr<float>(), host.numel(), result);
    result.finite = model_.finish_backward(losses_finite);
    return;
  }
  const at::Tensor loss_non_finite = losses.isfinite().logical_not().any().to(at::kFloat).view({1});
  result.unread = StepResult::OnDevice{losses, model_.finish_backward_on_device(loss_non_finite)};
}

} // namespace largo::train
