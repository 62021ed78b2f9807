// Barlow Twins' loss as VISSL computes it (LOSS.barlow_twins_loss; Zbontar et al. 2021): a
// rank's [2n, d] embeddings (view 0 of its n images, then view 1: simclr_collator's order) are
// normalised over the batch dimension with the mean and variance of every rank's rows, both
// views together (VISSL's SyncNormalizeFunction: var = E[x^2] - mean^2, eps 1e-5); the
// cross-correlation C = a^T b / n of the two views' normalised rows is averaged over the ranks,
// and
//   loss = scale_loss * ( sum_i (C_ii - 1)^2 + lambda * sum_{i != j} C_ij^2 ),
// the same value on every rank.
//
// Gradients as VISSL's: the average of C is an all-reduce autograd does not see, so each rank's
// backward reaches its own embeddings only, with the gradient the loss has with respect to them
// (the normalisation's backward averages its two sums over the ranks, as SyncBatchNorm's does).
// Data parallelism then averages the parameter gradients over the ranks, so a run on N ranks
// steps with 1/N of one process's gradient on the same global batch: VISSL's behaviour, which
// its scale_loss and learning rates are tuned for.
//
// A collective (forward and backward): every rank of `group` calls it with the same n and d.
#pragma once

#include <largo/comm/process_group.h>

#include <ATen/Tensor.h>

namespace largo::models {

struct BarlowTwinsLossOptions {
  double lambda = 0.0051;    // LOSS.barlow_twins_loss.lambda_: the off-diagonal terms' weight, >= 0
  double scale_loss = 0.024; // LOSS.barlow_twins_loss.scale_loss: the whole loss's factor, > 0
};

// `embeddings`: [2n, d] on this rank (n >= 1), in the order above. Throws largo::Error on other
// shapes, OptionError for a negative lambda or a scale_loss that is not > 0.
at::Tensor barlow_twins_loss(
    const at::Tensor& embeddings,
    comm::ProcessGroup& group,
    const BarlowTwinsLossOptions& options = {});

} // namespace largo::models
