// MoCo's contrastive loss as VISSL computes it (LOSS.moco_loss, vissl/losses/moco_loss.py):
// each query (the trained encoder's output for view 0 of an image, L2-normalised here) is
// scored against its positive key (the momentum encoder's normalised output for view 1 of the
// same image) and against every key in the queue (the negatives, moco_queue.h); with
// logits = [q·k_pos, q·queue] / temperature, the loss is the cross-entropy with class 0:
//   loss = mean over queries of logsumexp(logits) - logits[0].
// The keys and the queue carry no gradient (VISSL detaches them). No collectives: each rank
// scores its own queries; data parallelism's averaging of the gradients makes the step that
// of one process on the global batch (the queue being the same on every rank).
#pragma once

#include <ATen/Tensor.h>

namespace largo::models {

struct MocoLossOptions {
  double temperature = 0.2; // > 0; VISSL's default
};

// `query` [n, d] (normalised here), `key` [n, d] (normalised by the caller, as VISSL's hook
// does), `queue` [d, K] (columns are keys). Throws largo::Error on shapes that do not fit,
// OptionError for a temperature <= 0.
at::Tensor moco_loss(
    const at::Tensor& query,
    const at::Tensor& key,
    const at::Tensor& queue,
    const MocoLossOptions& options = {});

} // namespace largo::models
