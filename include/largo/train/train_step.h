// One optimizer step of a parallel model, as llm.c's training step reads:
//   zero_grad -> micro-steps (forward, loss, backward: the parallel model's forward_backward,
//   a whole schedule in a pipeline; only the last synchronizes) ->
//   finish_backward (unscale, inf/NaN agreed by every rank) -> clip -> step.
// Gradients of the micro-steps are summed (each loss divided by their number), so a step
// equals one batch of them all. Collective (the parallel model's collectives, in the same
// order on every rank).
#pragma once

#include <largo/data/dataset.h>
#include <largo/parallel/parallelize.h>
#include <largo/train/classification_loss.h>
#include <largo/train/self_supervised_loss.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace largo::train {

struct TrainStepOptions {
  ClassificationLossOptions loss; // LOSS: the mean over a micro-batch's counted samples
  bool clip_gradients = false;    // MODEL.GRAD_CLIP
  double max_norm = 1.0;
  double norm_type = 2.0;
  // Several heads (a linear evaluation): each one's classes; the model's output is their
  // concatenation (models::split_outputs) and the loss is summed over them. Empty: one output.
  std::vector<int64_t> output_widths;
  // A self-supervised run's loss, in place of the classification loss (not owned). Batches
  // of several views (data::Batch::views) reach the model packed (models::pack_views).
  SelfSupervisedLoss* self_supervised = nullptr;
  // Read the losses and the inf/NaN decision to the host in each step (a device sync). False:
  // the step leaves them on the device (StepResult::unread; no loss scaling, whose skip is
  // decided on the host) for read_step_results, so the host queues the next step while the
  // device still runs this one. A step with inf/NaN still runs its optimizer then: the caller
  // stops at the read and trusts no weights written after the bad step.
  bool sync_every_step = true;
};

struct StepResult {
  float loss = 0.0f;      // mean over the micro-steps, on this rank
  int64_t num_images = 0; // on this rank (a pipeline's stages each count their replica's)
  // Every gradient was finite on every rank (and this rank's losses were finite). False with
  // loss scaling: the step was skipped; without it the run has diverged.
  bool finite = true;
  float non_finite_loss = 0.0f; // this rank's first inf/NaN loss, when there was one
  // Without a sync every step: what the three fields above are made of, still on the device
  // (loss, finite and non_finite_loss hold nothing until read_step_results reads it).
  struct OnDevice {
    at::Tensor losses;     // [micro-steps] float32, each micro-step's loss
    at::Tensor non_finite; // [1] float32, the agreed inf/NaN flag; undefined: not checked
  };
  std::optional<OnDevice> unread;
};

// Reads the unread results among `results` in one copy to the host and fills their loss,
// finite and non_finite_loss as a step with a sync would have (the same float sums, in the
// same order: bit for bit). Results already read are left as they are.
void read_step_results(std::vector<StepResult>& results);

class TrainStep {
 public:
  TrainStep(parallel::ParallelModel& model, torch::Device device, TrainStepOptions options);

  // Runs one step over `num_micro_batches` batches from `next_batch`. Throws TrainingError
  // when the loss scale cannot back off any further.
  StepResult run(const std::function<data::Batch()>& next_batch, int64_t num_micro_batches);

 private:
  // The micro-steps' losses, [num_micro_batches] float32 on the device.
  at::Tensor run_micro_steps(
      const std::function<data::Batch()>& next_batch,
      int64_t num_micro_batches,
      StepResult& result);
  // Reduction, unscale and the inf/NaN decision: read now (a sync) or left on the device.
  void finish_backward(const at::Tensor& losses, StepResult& result);

  parallel::ParallelModel& model_;
  torch::Device device_;
  TrainStepOptions options_;
};

} // namespace largo::train
