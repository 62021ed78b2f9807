// Evaluation on the test split: every rank runs its share of the test set through the
// parallel model without gradients, and the loss sums and top-k counts of all ranks are added
// (collectives), so every rank gets the figures of the whole test set.
#pragma once

#include <largo/parallel/parallelize.h>
#include <largo/train/training_data.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <largo/train/classification_loss.h>

namespace largo::train {

struct EvaluationResult {
  double loss = 0.0;                // mean cross-entropy over the test samples (summed over heads)
  std::vector<int64_t> topk;        // e.g. {1, 5}
  std::vector<double> topk_percent; // the accuracy for each k, percent (of the best output)
  int64_t num_samples = 0;          // over every rank
  // Several outputs (a linear evaluation's heads): each one's accuracy for each k, and the
  // best one (the highest accuracy at the first k; the first of equals), whose figures
  // topk_percent repeats. One output: empty, and 0.
  std::vector<std::vector<double>> output_topk_percent;
  int64_t best_output = 0;
  std::optional<double> top(int64_t k) const;
};

struct EvaluationOptions {
  std::vector<int64_t> topk_values{1, 5}; // METERS.accuracy_list_meter.topk_values
  ClassificationLossOptions loss;         // LOSS (summed over the test samples, then averaged)
  std::vector<int64_t> sample_shape;      // [C, H, W] of the test samples
  std::vector<int64_t> output_widths;     // several heads (TrainStepOptions'): a meter each
};

// Collective. Leaves the model in training mode.
EvaluationResult evaluate(
    parallel::ParallelModel& model,
    TrainingData& data,
    torch::Device device,
    const EvaluationOptions& options);

} // namespace largo::train
