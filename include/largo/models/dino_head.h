// VISSL's dino_head (DINOHead, vissl/models/heads/dino_head.py; Caron et al. 2021): an MLP
// from the trunk's features to a small bottleneck, L2-normalised, then one weight-normalised
// Linear layer without bias (the "prototypes", one row per output dimension) scoring it.
//   MLP: Linear(in, hidden) [BatchNorm1d] GELU, (num_layers - 2) x (Linear(hidden, hidden)
//        [BatchNorm1d] GELU), Linear(hidden, bottleneck); a lone Linear(in, bottleneck) when
//        num_layers is 1.
//   prototypes0: x -> x · (g · v / ||v||_row)^T (torch.nn.utils.weight_norm, dim 0), g fixed
//        to 1 (not trained) with normalize_last_layer.
// Initialisation as VISSL's: each MLP Linear's weight from VISSL's trunc_normal_(std 0.02),
// whose bounds are ±2 absolute (±100 std: in effect an untruncated normal), biases 0; the
// prototypes' v as torch.nn.Linear's default (Kaiming uniform, a = sqrt(5)) and g = 1.
//
// Parameter names are VISSL's under its heads.0., so a VISSL checkpoint's head maps by name:
//   mlp.<k>.weight / mlp.<k>.bias (k in order of creation: Linear, BatchNorm1d, GELU, ...;
//   mlp.weight / mlp.bias when num_layers is 1), mlp.<k>.running_mean / running_var /
//   num_batches_tracked for the BatchNorm1d buffers, prototypes0.weight_g [K, 1] and
//   prototypes0.weight_v [K, bottleneck]. VISSL's dino_head_fsdp keeps weight_g as a buffer
//   rather than a frozen parameter; the values and names are the same.
// VISSL's last-layer freezing (the gradients of prototypes0 dropped for the first iterations)
// is not part of the head: it is MODEL.TEMP_FROZEN_PARAMS_ITER_MAP, counted in iterations,
// which train::SelfSupervisedLoss already applies to any parameter by name.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace largo::models {

// VISSL's dino_head arguments, with its defaults (num_clusters is VISSL's one-entry list).
struct DinoHeadOptions {
  int64_t in_dim = 0;               // the trunk's feature width, > 0
  int64_t num_clusters = 0;         // output width K (VISSL's num_clusters[0]), > 0
  bool use_bn = false;              // BatchNorm1d (eps 1e-5, momentum 0.1) after hidden Linears
  bool normalize_last_layer = true; // weight_g fixed to 1 (not trained)
  int64_t num_layers = 3;           // Linear layers in the MLP, >= 1
  int64_t hidden_dim = 2048;        // > 0
  int64_t bottleneck_dim = 256;     // > 0
};

// The weight-normalised last layer (VISSL's prototypes0): weight = g * v / ||v|| per row,
// computed by at::_weight_norm as torch.nn.utils.weight_norm does.
class DinoPrototypesImpl : public torch::nn::Module {
 public:
  DinoPrototypesImpl(int64_t in_features, int64_t out_features, bool train_norm);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight_g; // [out, 1], 1 at the start
  at::Tensor weight_v; // [out, in]
};
TORCH_MODULE(DinoPrototypes);

class DinoHeadImpl : public torch::nn::Module {
 public:
  // Throws OptionError naming the DinoHeadOptions field for a width <= 0 or num_layers < 1.
  explicit DinoHeadImpl(const DinoHeadOptions& options);

  // features [batch, in_dim] -> scores [batch, num_clusters] (VISSL returns it as [scores]).
  at::Tensor forward(const at::Tensor& features);

  const DinoHeadOptions& options() const {
    return options_;
  }
  DinoPrototypes& prototypes() {
    return prototypes_;
  }

 private:
  at::Tensor run_mlp(const at::Tensor& features);

  DinoHeadOptions options_;
  torch::nn::Sequential mlp_;             // num_layers >= 2
  torch::nn::Linear mlp_linear_{nullptr}; // num_layers == 1 (VISSL's bare mlp Linear)
  DinoPrototypes prototypes_{nullptr};
};
TORCH_MODULE(DinoHead);

} // namespace largo::models
