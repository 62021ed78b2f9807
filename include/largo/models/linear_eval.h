// Linear evaluation of a pretrained trunk, as VISSL's MODEL.FEATURE_EVAL_SETTINGS builds it:
// the trunk is frozen (no gradients, and its BatchNorm layers stay in evaluation mode even
// when the model is put in training mode) and small heads are trained on its features.
//
// Two shapes, as in VISSL:
//   - no feature taps (LINEAR_EVAL_FEAT_POOL_OPS_MAP empty): the pretrained model's own
//     trunk and head ("trunk.*", "head.*"), the trunk frozen (FREEZE_TRUNK_ONLY) or both
//     (FREEZE_TRUNK_AND_HEAD); one output;
//   - feature taps (a resnet, regnet or vision_transformer trunk): features taken inside
//     the trunk by VISSL's names (models/feature_taps.h: conv1, res2 .. res5, avgpool, ... of
//     the conv trunks; lastCLS, concatCLS<n>, ... of the ViT), each pooled by its op
//     (AvgPool2d, MaxPool2d, AdaptiveAvgPool2d, AdaptiveMaxPool2d or Identity, with
//     nn.*Pool2d's positional arguments; the ViT's [b, d] features take Identity) and flattened
//     when flatten_features (SHOULD_FLATTEN_FEATS); one head per tap ("heads.<i>.*"): VISSL's
//     eval_mlp (BatchNorm2d "channel_bn" over in_channels, flatten, Linear layers
//     "clf.clf.<k>") or mlp (Linear layers "clf.<k>"); one output per head.
// The names are VISSL's for the heads and Largo's for the trunk, so a Largo checkpoint's
// trunk and a VISSL linear-evaluation checkpoint's heads load as they are
// (checkpoint/weights_init.h).
// No collectives.
#pragma once

#include <largo/models/feature_taps.h>
#include <largo/models/heads.h>
#include <largo/models/module_swap.h>
#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::models {

// One entry of LINEAR_EVAL_FEAT_POOL_OPS_MAP: ["res4", ["AvgPool2d", [[8, 8], 3, 0]]].
struct FeatureTap {
  std::string feature; // the trunk's feature, VISSL's name (models/feature_taps.h)
  std::string pool =
      "Identity"; // AvgPool2d | MaxPool2d | AdaptiveAvgPool2d | AdaptiveMaxPool2d | Identity
  std::vector<int64_t> kernel_size{}; // (Avg|Max)Pool2d: kernel; Adaptive*: the output size
  int64_t stride = 0;                 // (Avg|Max)Pool2d; 0 = the kernel size (PyTorch's default)
  int64_t padding = 0;                // (Avg|Max)Pool2d
};

// One head of MODEL.HEAD.PARAMS under linear evaluation: ["eval_mlp", {"in_channels": 2048,
// "dims": [2048, 1000]}] or ["mlp", {"dims": [2048, 1000]}].
struct EvalHeadOptions {
  std::string name = "eval_mlp"; // eval_mlp | mlp
  int64_t in_channels = 0;       // eval_mlp: channels of its BatchNorm2d
  std::vector<int64_t> dims;     // Linear layers [in, ..., out]
  MlpHeadOptions mlp;            // use_bn, use_relu, ... (eps / momentum: MODEL.HEAD.BATCHNORM_*)
};

// MODEL.FEATURE_EVAL_SETTINGS (VISSL's keys and defaults).
struct FeatureEvalOptions {
  bool eval_mode_on = false;                // EVAL_MODE_ON
  bool freeze_trunk_only = false;           // FREEZE_TRUNK_ONLY
  bool freeze_trunk_and_head = false;       // FREEZE_TRUNK_AND_HEAD
  bool extract_trunk_features_only = false; // EXTRACT_TRUNK_FEATURES_ONLY (largo extract)
  bool eval_trunk_and_head = false;         // EVAL_TRUNK_AND_HEAD: load the head's weights too
  bool assert_head_layer_shape_init = true; // ASSERT_HEAD_LAYER_SHAPE_INIT
  bool should_flatten_feats = true;         // SHOULD_FLATTEN_FEATS
  std::vector<FeatureTap> taps;             // LINEAR_EVAL_FEAT_POOL_OPS_MAP
  // MODEL.HEAD.PARAMS when it lists one head per tap (empty: the pretrained model's head).
  std::vector<EvalHeadOptions> heads;

  // Whether the model is built for evaluation at all (EVAL_MODE_ON with a freeze switch).
  bool enabled() const {
    return eval_mode_on && (freeze_trunk_only || freeze_trunk_and_head);
  }
  // Whether MODEL.WEIGHTS_INIT loads the head (VISSL's should_init_head_weights).
  bool init_heads_from_weights() const {
    return !eval_mode_on || eval_trunk_and_head;
  }
};

// Throws OptionError naming FeatureEvalOptions::taps / heads for pool ops that do not
// exist, pool arguments that do not fit, or heads that are not one per tap (no heads is
// accepted with extract_trunk_features_only: the model then only gives forward_features). The
// features depend on the trunk: validate_tap_features(tap_features(options), trunk name) checks
// them.
void validate_feature_eval_options(const FeatureEvalOptions& options);
// The tapped features' names, in order.
std::vector<std::string> tap_features(const FeatureEvalOptions& options);

// VISSL's mlp head as a head of a linear evaluation: [b, c] or [b, c, 1, 1] -> Linear layers.
class EvalLinearHeadImpl : public torch::nn::Module {
 public:
  EvalLinearHeadImpl(const EvalHeadOptions& options);
  at::Tensor forward(at::Tensor x);

 private:
  torch::nn::Sequential clf_{nullptr};
};
TORCH_MODULE(EvalLinearHead);

// VISSL's eval_mlp head: [b, c, h, w] (or [b, c], seen as [b, c, 1, 1]) -> BatchNorm2d ->
// flatten -> Linear layers -> [b, dims.back()]. Its BatchNorm2d is swappable.
class EvalMlpHeadImpl : public torch::nn::Module, public SwappableChildren {
 public:
  EvalMlpHeadImpl(const EvalHeadOptions& options);
  at::Tensor forward(at::Tensor x);
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  torch::nn::AnyModule channel_bn_;
  EvalLinearHead clf_{nullptr}; // VISSL's MLP: its layers are "clf.clf.<k>"
};
TORCH_MODULE(EvalMlpHead);

class LinearEvalModelImpl : public torch::nn::Module, public SwappableChildren {
 public:
  // Takes `pretrained`'s trunk (and, without taps, its head) and freezes it as `options` say.
  // Throws ConfigError (validate_feature_eval_options, and taps the trunk does not have or a
  // trunk that cannot be tapped: TrunkTaps) and for options that are not enabled().
  LinearEvalModelImpl(TrunkHeadModel pretrained, const FeatureEvalOptions& options);

  // images -> one output per head ([b, classes] each). Throws OptionError for taps without
  // heads.
  std::vector<at::Tensor> forward_outputs(at::Tensor images);
  // images -> the outputs concatenated along dim 1 ([b, sum of the heads' classes]): the one
  // tensor a parallel model passes on (parallel::parallelize); split_outputs() undoes it.
  at::Tensor forward(at::Tensor images);
  // forward()'s result -> forward_outputs()'s (views, one per head).
  std::vector<at::Tensor> split_outputs(const at::Tensor& concatenated) const;
  // Each head's classes, in order: the widths forward() concatenates (empty without taps: the
  // one output is the pretrained head's).
  std::vector<int64_t> output_widths() const;
  // images -> the tapped features after their pooling (and flattening), or the trunk's output
  // without taps: what `largo extract` writes (EXTRACT_TRUNK_FEATURES_ONLY).
  std::vector<at::Tensor> forward_features(at::Tensor images);

  // The trunk (and frozen heads) stay in evaluation mode.
  void train(bool on = true) override;

  const FeatureEvalOptions& options() const {
    return options_;
  }
  int64_t num_outputs() const;
  // The name prefix of the trained head's parameters (optim::ParamGroupOptions::head_prefix):
  // "heads." with feature taps, "head." (the pretrained head) without.
  std::string head_prefix() const {
    return options_.taps.empty() ? "head." : "heads.";
  }
  // How many trunk blocks a forward runs: up to the deepest tapped feature (with conv1 only,
  // the stem), or the whole trunk without taps.
  int64_t trunk_blocks_run() const;
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  at::Tensor pool(const FeatureTap& tap, at::Tensor feature) const;

  FeatureEvalOptions options_;
  torch::nn::Sequential trunk_{nullptr};
  TrunkTaps taps_;                       // with taps: where the trunk's features are taken
  torch::nn::Sequential head_{nullptr};  // without taps: the pretrained head
  torch::nn::ModuleList heads_{nullptr}; // with taps: one per tap
  std::vector<torch::nn::AnyModule> head_calls_;
};
TORCH_MODULE(LinearEvalModel);

// `concatenated` [b, sum of `widths`] -> one view per width along dim 1, or {concatenated} when
// `widths` is empty (a model with one output).
std::vector<at::Tensor>
split_outputs(const at::Tensor& concatenated, const std::vector<int64_t>& widths);

} // namespace largo::models
