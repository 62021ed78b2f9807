// Features of a frozen trunk taken for a linear evaluation, by the names VISSL's trunks give
// them (MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP's first entries):
//   resnet              conv1 (stem conv + norm + ReLU, before the max pool), res1 (after the
//                       max pool), res2 .. res5 (after each stage), res5avg (the global
//                       average pool, [b, c, 1, 1]), flatten ([b, c])
//   regnet              conv1 (the whole stem, ClassyVision's, its max pool included),
//                       res2 .. res<S+1> (after each of the S stages: res5 is the last of the
//                       usual four), avgpool ([b, c, 1, 1]), flatten ([b, c])
//   vision_transformer  VISSL's get_intermediate_features: each encoder layer's tokens go
//                       through the final LayerNorm, then
//                         lastCLS        the last layer's class token        [b, d]
//                         blkCLS<i>      layer i's (from 0) class token      [b, d]
//                         concatCLS<n>   the last n layers' class tokens,
//                                        concatenated in layer order         [b, n d]
//                       with a class token (models::has_class_token), and
//                         lastPOOL       the mean of the last layer's tokens [b, d]
//                         concatPOOL<n>  those means of the last n layers    [b, n d]
//                         stridePOOL_<count>[_<stride>]  the means of the last layer and
//                                        every stride-th before it, at most count (stride
//                                        ceil(layers / count) when not given), last first
//                                                                            [b, k d]
//                       without one (use_class_token false or classifier gap;
//                       VISSL asserts the same), and with or without one
//                         lastBLK        the last layer's tokens             [b, t, d]
//                         concatBLK<n>   the last n layers' tokens,
//                                        concatenated per token              [b, t, n d]
// VISSL's lastMAP (the patch tokens as a map of the built grid, in one config) is not offered.
// No collectives.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace largo::models {

// The trunks (ModelOptions::trunk_name) whose features can be tapped.
const std::vector<std::string>& tappable_trunk_names();

// Checks that every name in `features` (the taps in order) can be a feature of a
// `trunk_name` trunk as far as the name alone tells (stage and layer numbers are checked
// against the built trunk by TrunkTaps). Throws OptionError naming
// FeatureEvalOptions::taps[i] and listing the trunk's features, or ModelOptions::trunk_name
// for a trunk that cannot be tapped.
void validate_tap_features(const std::vector<std::string>& features, const std::string& trunk_name);

// Where each tapped feature is taken in a built trunk, and how to take it.
class TrunkTaps {
 public:
  TrunkTaps() = default;
  // Throws OptionError (FeatureEvalOptions::taps[i]) for a feature this trunk does not have,
  // listing the ones it has, or (FeatureEvalOptions::taps) for a trunk that is none of
  // tappable_trunk_names().
  TrunkTaps(const torch::nn::Sequential& trunk, std::vector<std::string> features);

  // images -> the features, in the order asked (before any pooling): [b, c, h, w] for the
  // conv trunks' stages, [b, c, 1, 1] for res5avg / avgpool, [b, c] for flatten and [b, d]
  // (or [b, n d]; [b, t, n d] for *BLK) for the ViT's. Runs only as many blocks as the
  // deepest feature needs.
  std::vector<at::Tensor> forward(const torch::nn::Sequential& trunk, at::Tensor images) const;

  // How many trunk blocks a forward runs (at least one).
  int64_t blocks_run() const {
    return blocks_run_;
  }

 private:
  std::vector<at::Tensor> forward_conv(const torch::nn::Sequential& trunk, at::Tensor x) const;
  std::vector<at::Tensor> forward_vit(const torch::nn::Sequential& trunk, at::Tensor x) const;

  std::string trunk_name_; // one of tappable_trunk_names()
  std::vector<std::string> features_;
  // Conv trunks: the blocks run before each feature is taken (-1: ResNet's conv1, inside
  // the stem).
  std::vector<int64_t> after_blocks_;
  // ViT: the encoder layers (from 0) whose class tokens, token means or tokens each feature
  // concatenates, in that order.
  std::vector<std::vector<int64_t>> layers_;
  int64_t blocks_run_ = 0;
};

} // namespace largo::models
