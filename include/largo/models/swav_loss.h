// SwAV's swapped-prediction loss as VISSL computes it (LOSS.swav_loss, one prototype head):
// the scores of the crops in crops_for_assign (with the queue's scores appended, when a queue
// is used) become soft cluster assignments through distributed Sinkhorn-Knopp, and every
// other crop predicts them:
//   loss = mean over assigned crops c of
//            mean over the other crops p of −mean over images of Σ_k q_c[k] · log softmax(s_p /
//            T)[k]
// The assignments carry no gradient. Sinkhorn's row sums (and, in float32, the maximum score)
// are all-reduced, so the assignments over 2 ranks are those of one process on the whole
// batch, and each rank's loss is over its own images.
//
// The queue's upkeep is swav_queue.h's, the prototypes' normalisation swav_head.h's; with
// several prototype sets VISSL averages this loss over them (swav_queue.h shows the loop;
// train/self_supervised_loss.h runs it for LOSS.name: swav_loss).
#pragma once

#include <largo/comm/process_group.h>

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace largo::models {

struct SwavLossOptions {
  double temperature = 0.1; // temperature of the predicting softmax, > 0
  double epsilon = 0.05;    // Sinkhorn's entropic regularisation: exp(scores / epsilon), > 0
  int64_t num_iters = 3;    // Sinkhorn iterations, >= 1
  int64_t num_crops = 2;    // crops per image in `scores`, >= 2
  std::vector<int64_t> crops_for_assign{0, 1}; // crops whose assignments are predicted
  // Sinkhorn in float64 (VISSL's use_double_precision): exp(scores / epsilon) without
  // subtracting the maximum; the assignments are float32 either way, as VISSL's.
  bool use_double_precision = false;
};

// Sinkhorn-Knopp over the ranks of `group` (VISSL's distributed_sinkhornknopp): `q` is
// [K prototypes, n local columns], positive; returns the [n, K] float32 assignments, each
// row summing to 1 (one-hot at its largest entry with hard_assignment). Collective.
at::Tensor distributed_sinkhorn(
    at::Tensor q, int64_t num_iters, bool hard_assignment, comm::ProcessGroup& group);

// `scores`: [num_crops * n, K] prototype scores of this rank's n images, crop-major (crop 0
// of every image, then crop 1, ...: VISSL's multicrop_collator order). `queue_scores`: empty,
// or one [q, K] tensor per crops_for_assign entry, appended to that crop's scores before
// Sinkhorn. Collective; throws OptionError for bad options, largo::Error for bad shapes.
at::Tensor swav_loss(
    const at::Tensor& scores,
    comm::ProcessGroup& group,
    const SwavLossOptions& options = {},
    const std::vector<at::Tensor>& queue_scores = {},
    bool hard_assignment = false);

} // namespace largo::models
