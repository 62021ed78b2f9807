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
};

struct StepResult {
  float loss = 0.0f;      // mean over the micro-steps, on this rank
  int64_t num_images = 0; // on this rank (a pipeline's stages each count their replica's)
  // Every gradient was finite on every rank (and this rank's losses were finite). False with
  // loss scaling: the step was skipped; without it the run has diverged.
  bool finite = true;
  float non_finite_loss = 0.0f; // this rank's first inf/NaN loss, when there was one
};

class TrainStep {
 public:
  TrainStep(parallel::ParallelModel& model, torch::Device device, TrainStepOptions options);

  // Runs one step over `num_micro_batches` batches from `next_batch`. Throws TrainingError
  // when the loss scale cannot back off any further.
  StepResult run(const std::function<data::Batch()>& next_batch, int64_t num_micro_batches);

 private:
  parallel::ParallelModel& model_;
  torch::Device device_;
  TrainStepOptions options_;
};

} // namespace largo::train
