// VISSL's swav_head (SwAVPrototypesHead, Caron et al. 2020): a projection MLP to a small
// embedding, L2-normalised, then one or more prototype layers (Linear without bias, one row
// per cluster centroid) scoring the embedding. forward() returns VISSL's list: the embedding
// first (return_embeddings), then each prototype set's scores, which swav_loss.h takes.
//
// Module names follow VISSL's, so a VISSL checkpoint's head loads by name:
// projection_head.<i> (Linear, BatchNorm1d, activation in order of creation) and
// prototypes<j>.
#pragma once

#include <largo/models/module_swap.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::models {

// MODEL.HEAD.PARAMS [["swav_head", {...}]]: VISSL's arguments, with its defaults.
struct SwavHeadOptions {
  std::vector<int64_t> dims;         // [in, ..., embedding], >= 2 entries (e.g. [2048, 2048, 128])
  bool use_bn = false;               // BatchNorm1d after each hidden Linear
  std::vector<int64_t> num_clusters; // one prototype set per entry (SwAV: [3000]); may be empty
  bool use_bias = true;              // bias in the projection's Linear layers
  bool return_embeddings = true;     // the embedding first in forward()'s list
  // The projection ends in its last Linear (VISSL's default); false adds BN and activation.
  bool skip_last_bn = true;
  bool normalize_feats = true;     // L2-normalise the embedding before the prototypes
  std::string activation = "ReLU"; // ReLU or GELU (VISSL's activation_name)
  double batchnorm_eps = 1e-5;     // MODEL.HEAD.BATCHNORM_EPS
  double batchnorm_momentum = 0.1; // MODEL.HEAD.BATCHNORM_MOMENTUM
};

class SwavHeadImpl : public torch::nn::Module, public SwappableChildren {
 public:
  // Throws ConfigError naming the swav_head argument for fewer than 2 dims, a dim or a
  // cluster count <= 0, or an activation other than ReLU and GELU.
  explicit SwavHeadImpl(SwavHeadOptions options);

  // features [batch, dims[0]] -> [embedding [batch, dims.back()] if return_embeddings,
  // scores [batch, num_clusters[j]] for each prototype set j].
  std::vector<at::Tensor> forward(const at::Tensor& features);

  // Each prototype (a row of every prototypes<j>.weight) rescaled to unit L2 norm, in place
  // and outside autograd: what VISSL's SwAV runs after every optimizer step with the loss's
  // normalize_last_layer (NormalizePrototypesHook.on_update), so the scores are cosine
  // similarities from the second step on.
  void normalize_prototypes();
  // The same for one prototypes weight [K, d] given as a tensor (a gathered copy of a sharded
  // one, train::SelfSupervisedLoss under FSDP).
  static void normalize_prototype_rows(at::Tensor& weight);

  const SwavHeadOptions& options() const {
    return options_;
  }
  const std::vector<torch::nn::Linear>& prototypes() const {
    return prototypes_;
  }

  // The projection ("projection_head", a Sequential) may be swapped for a rebuilt one
  // (its BatchNorm1d layers for SyncBatchNorm, parallel/data_parallel/sync_batch_norm.h).
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  SwavHeadOptions options_;
  torch::nn::Sequential projection_head_;
  std::vector<torch::nn::Linear> prototypes_;
};
TORCH_MODULE(SwavHead);

} // namespace largo::models
