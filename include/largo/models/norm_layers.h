// The normalization layers of Largo's convolutional trunks, chosen by
// MODEL.TRUNK.RESNETS.NORM as in VISSL's ResNe(X)t:
//   BatchNorm  torch BatchNorm2d (batch statistics, running averages for evaluation)
//   GroupNorm  torch GroupNorm with GROUPNORM_GROUPS groups (per-sample statistics)
//   LayerNorm  VISSL's LayerNorm2d: a GroupNorm with one group, i.e. each sample normalized
//              over all its channels and positions, with a per-channel affine
// Models hold them as torch::nn::AnyModule so that they can be swapped after the model is
// built (models/module_swap.h), e.g. BatchNorm2d for SyncBatchNorm.
// No collectives.
#pragma once

#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <string>

namespace largo::models {

struct NormOptions {
  std::string type = "BatchNorm"; // MODEL.TRUNK.RESNETS.NORM: BatchNorm | GroupNorm | LayerNorm
  int64_t groupnorm_groups = 32;  // MODEL.TRUNK.RESNETS.GROUPNORM_GROUPS
  // A block's BatchNorm + ReLU (+ residual add) through largo::kernels' fused CUDA kernels
  // where they apply (models/norm_relu.h; MODEL.FUSED_KERNELS); false: ATen's ops everywhere.
  // Either way ATen's ops on the CPU.
  bool fuse_relu = true;
};

// Throws OptionError naming NormOptions::type or groupnorm_groups for an unknown type,
// or for groups that are not > 0.
void validate_norm_options(const NormOptions& options);

// A norm layer over `channels` channels ([b, channels, h, w] -> same), weight 1, bias 0.
// Throws OptionError naming NormOptions::groupnorm_groups when GroupNorm's groups do not divide
// `channels`.
torch::nn::AnyModule make_norm2d(const NormOptions& options, int64_t channels);

// The affine weight of a norm layer made by make_norm2d (or a module swapped in for it).
at::Tensor norm_weight(const torch::nn::AnyModule& norm);

} // namespace largo::models
