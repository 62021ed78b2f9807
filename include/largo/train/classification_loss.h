// The classification losses VISSL configs name in LOSS.name, with their LOSS.<name> options:
//   CrossEntropyLoss                               torch.nn.CrossEntropyLoss(ignore_index)
//   cross_entropy_multiple_output_single_target    VISSL's: for each model output (one per
//       head, e.g. the heads of a linear evaluation), the cross-entropy of
//       normalize?(output) / temperature against the one target, summed over the outputs.
// Per output: logits [b, classes] (L2-normalized along the classes first when
// normalize_output), divided by temperature, cross-entropy against targets [b] with the
// per-class weights (a weighted mean: sum_i w[y_i] l_i / sum_i w[y_i], as torch) and without
// the samples whose target is ignore_index. (VISSL passes LOSS.<name>.reduction to nothing;
// Largo's config refuses values other than "mean".)
// No collectives.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace largo::train {

struct ClassificationLossOptions {
  double temperature = 1.0;      // LOSS.<name>.temperature (> 0)
  bool normalize_output = false; // LOSS.<name>.normalize_output
  std::vector<double> weight;    // LOSS.<name>.weight: one per class; empty = all 1
  int64_t ignore_index = -1;     // LOSS.<name>.ignore_index
  // Mean over the counted samples (training), or their sum (evaluation, which adds the sums
  // of every batch and rank before dividing once).
  bool sum = false;
};

// Throws ConfigError naming LOSS.<name>.temperature / weight for a temperature <= 0 or a
// weight list whose length differs from the number of classes.
at::Tensor classification_loss(
    const std::vector<at::Tensor>& outputs,
    const at::Tensor& targets,
    const ClassificationLossOptions& options);

at::Tensor classification_loss(
    const at::Tensor& output, const at::Tensor& targets, const ClassificationLossOptions& options);

} // namespace largo::train
