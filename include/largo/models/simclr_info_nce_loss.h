// SimCLR's contrastive loss as VISSL computes it (LOSS.simclr_info_nce_loss): each of a
// rank's 2n embeddings (view 0 of its n images, then view 1: VISSL's simclr_collator order)
// is an anchor whose positive is the other view of its image; every other embedding of every
// rank is a negative. With s = anchor · other / temperature,
//   loss = mean over anchors of −log( exp(s_pos) / (exp(s_pos) + Σ_negatives exp(s_neg)) ),
// computed as s_pos − logsumexp (the same value; VISSL exponentiates directly, which
// overflows for un-normalised embeddings at small temperatures). The embeddings of all ranks
// are gathered with comm::all_gather_with_gradient, so the gradient reaches every rank's
// embeddings and, averaged by data parallelism, equals one process on the whole batch.
#pragma once

#include <largo/comm/process_group.h>

#include <ATen/Tensor.h>

namespace largo::models {

struct SimclrInfoNceOptions {
  double temperature = 0.1; // LOSS.simclr_info_nce_loss.temperature, > 0
};

// `embeddings`: [2n, d] on this rank (n ≥ 1), in the order above. Every rank of `group`
// must call it with the same n and d (a collective). Throws largo::Error on other shapes.
at::Tensor simclr_info_nce_loss(
    const at::Tensor& embeddings,
    comm::ProcessGroup& group,
    const SimclrInfoNceOptions& options = {});

} // namespace largo::models
