// DeepCluster v2's loss as VISSL computes it (LOSS.deepclusterv2_loss,
// vissl/losses/deepclusterv2_loss.py): each crop's embedding, L2-normalised, is scored against
// the centroids of every clustering head, and the loss is the cross-entropy of those scores
// against the cluster its image was assigned to at the epoch's start (the memory's k-means,
// deepclusterv2_memory.h):
//   loss = (1 / heads) Σ_h mean over rows with a target of
//          logsumexp(e·C_h / T) − e·C_h[target_h(row)] / T
// Rows whose target is -100 (an image no k-means assigned yet, VISSL's ignore_index) count
// in no mean. The centroids carry no gradient (they are the k-means' buffers, not parameters).
// No collectives: each rank scores its own rows; data parallelism averages the gradients.
#pragma once

#include <ATen/Tensor.h>

#include <vector>

namespace largo::models {

struct DeepClusterV2LossOptions {
  double temperature = 0.1; // > 0; LOSS.deepclusterv2_loss.temperature (VISSL's default)
};

// VISSL's CrossEntropyLoss(ignore_index=-100) target for an image without a cluster.
constexpr int64_t kDeepClusterV2Unassigned = -100;

// `embeddings` [m, d]: the head's output for m rows (any crops, un-normalised; normalised here
// with F.normalize's eps), `centroids`: one [K_h, d] per head, `targets` [heads, m] (int64):
// each row's cluster in each head. Throws largo::Error on shapes that do not fit, OptionError
// for a temperature <= 0.
at::Tensor deepclusterv2_loss(
    const at::Tensor& embeddings,
    const std::vector<at::Tensor>& centroids,
    const at::Tensor& targets,
    const DeepClusterV2LossOptions& options = {});

} // namespace largo::models
