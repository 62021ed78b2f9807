// RegNet trunks (Radosavovic et al., "Designing Network Design Spaces"), as VISSL builds them
// from MODEL.TRUNK.REGNET through ClassyVision's RegNet: a named preset (regnet_y_400mf ...
// regnet_y_256gf, the SEER sizes included) or the explicit RegNet parameters depth, w_0, w_a,
// w_m, group_width, ... The widths are ClassyVision's: a linear ramp w_0 + w_a * j quantized
// in log space with base w_m, rounded to multiples of 8 (float64, numpy's round half to even),
// then adjusted so that each bottleneck width is a multiple of the group width.
//
// Trunk blocks (what checkpointing, FSDP and pipelines cut between):
//   block 0            stem: conv (3x3/2 simple_stem_in, 7x7/2 res_stem_in + 3x3/2 max pool,
//                      3x3/1 res_stem_cifar), BN, activation
//   blocks 1 .. n      one residual bottleneck block each, in stage order:
//                      act(proj(x) + c(se(b(a(x)))))  a: 1x1, b: 3x3 grouped (the stage's
//                      stride on the first block), se: squeeze-excitation, c: 1x1 (no act)
//   block n+1          adaptive average pool to 1x1 + flatten -> [batch, last stage width]
// Inside a block, names are torchvision's (proj.0/1, f.a.0/1, f.b.0/1, f.se.fc1/fc2,
// f.c.0/1), so "trunk.<k>.f.a.0.weight" is torchvision's
// "trunk_output.block<s>.block<s>-<i>.f.a.0.weight". Init is ClassyVision's (= torchvision's):
// convs normal(0, sqrt(2 / (k * k * out_channels))), BN weight 1 bias 0.
//
// torchvision computes the widths in float32 and rounds with _make_divisible, which gives
// other widths than ClassyVision's for regnet_y_800mf, regnet_y_8gf and regnet_x_400mf
// (e.g. 784 instead of 768 output features for regnet_y_800mf); Largo follows ClassyVision
// (VISSL), so torchvision's weights of those three presets do not fit Largo's presets.
// No collectives.
#pragma once

#include <largo/models/module_swap.h>
#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/conv.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::models {

// One stage: `depth` blocks of output width `width`, the first with stride `stride`.
struct RegNetStageSpec {
  int64_t width = 0;
  int64_t depth = 0;
  int64_t stride = 2;
  int64_t group_width = 0; // a RegNet's: after ClassyVision's adjustment (<= the bottleneck)
  double bottleneck_multiplier = 1.0;
};

// Keys are MODEL.TRUNK.REGNET.<name>, spelled and defaulted as ClassyVision's RegNetParams.
// depth, w_0, w_a, w_m and group_width have no default: set them, take a preset, or give the
// stages one by one (`stages`).
struct RegNetOptions {
  int64_t depth = 0;                  // depth: number of blocks over all stages
  int64_t w_0 = 0;                    // w_0: initial width, a multiple of 8
  double w_a = 0;                     // w_a: slope of the width ramp, >= 0
  double w_m = 0;                     // w_m: width multiplier between stages, > 1
  int64_t group_width = 0;            // group_width: channels per group of the 3x3 convs
  double bottleneck_multiplier = 1.0; // bottleneck_multiplier: inner width / block width
  // stem_type: simple_stem_in | res_stem_in | res_stem_cifar
  std::string stem_type = "simple_stem_in";
  int64_t stem_width = 32; // stem_width
  // block_type: res_bottleneck_block (ClassyVision's other types are not built)
  std::string block_type = "res_bottleneck_block";
  std::string activation = "relu"; // activation: relu | silu (every activation, SE's too)
  bool use_se = true;              // use_se: squeeze-excitation in every block (RegNetY)
  double se_ratio = 0.25;          // se_ratio: SE width / block input width
  double bn_epsilon = 1e-5;        // bn_epsilon
  double bn_momentum = 0.1;        // bn_momentum (PyTorch's convention)
  // With the relu activation: each conv's BatchNorm + ReLU, and each block's last BatchNorm +
  // residual add + ReLU, through largo::kernels' fused CUDA kernels where they apply
  // (models/norm_relu.h; MODEL.FUSED_KERNELS). false: ATen's ops everywhere.
  bool fuse_relu = true;
  // ClassyVision's AnyNet (VISSL's `name: anynet` with depths, widths, group_widths,
  // bottleneck_multipliers, strides): the stages given one by one, used as given (AnyNetParams
  // adjusts no width), in place of the ramp: depth, w_0, w_a, w_m and group_width then stay 0
  // and bottleneck_multiplier 1 (each stage has its own).
  std::vector<RegNetStageSpec> stages;
};

// The RegNet parameters of a ClassyVision preset: regnet_y_400mf, regnet_y_800mf,
// regnet_y_1.6gf, regnet_y_3.2gf, regnet_y_8gf, regnet_y_16gf, regnet_y_32gf, regnet_y_64gf,
// regnet_y_128gf, regnet_y_256gf and the regnet_x_* sizes (no SE); torchvision's spelling
// (regnet_y_1_6gf) is accepted too. The other fields keep their defaults. Throws ConfigError
// naming RegNetOptions::name and listing the presets for another name.
RegNetOptions regnet_preset(const std::string& name);
// The preset names, in the order errors list them.
std::vector<std::string> regnet_preset_names();

// Throws OptionError naming RegNetOptions::<field>, the value and what is accepted.
void validate_regnet_options(const RegNetOptions& options);

// ClassyVision's get_expanded_params: the ramp's stages, or RegNetOptions::stages as given.
// Validates `options` first.
std::vector<RegNetStageSpec> regnet_stages(const RegNetOptions& options);

// One block of the trunk: what build_regnet_trunk builds and count_model_flops counts
// (blocks 1 .. n, in order).
struct RegNetBlockSpec {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t stride = 1;           // on the 3x3 conv and the projection
  int64_t bottleneck_width = 0; // round(out_channels * bottleneck_multiplier)
  int64_t groups = 1;           // of the 3x3 conv: bottleneck_width / group_width
  int64_t se_width = 0;         // round(se_ratio * in_channels); 0: no SE
  bool starts_stage = false;    // the first block of its stage
  bool projection() const {     // a 1x1 conv + BN shortcut when the shape changes
    return in_channels != out_channels || stride != 1;
  }
};
std::vector<RegNetBlockSpec> regnet_blocks(const RegNetOptions& options);

// Largo's name for a tensor of the RegNet `options` describes, named as torchvision names it
// ("stem.1.running_mean" -> "trunk.0.1.running_mean", "trunk_output.block2.block2-1.f.b.0.weight"
// -> "trunk.<1 + depth of stage 1 + 1>.f.b.0.weight", "fc.bias" -> "head.0.bias") or as VISSL's
// regnet trunk names it (ClassyVision's modules under "trunk._feature_blocks.": "conv1.stem.0.",
// "res<r>.block<s>-<i>." with f.se.excitation.0/2, f.c, f.final_bn, proj, bn). Other names
// come back unchanged. (checkpoint/weights_init.h's rename; weights_name_mapping in
// vissl_names.h adds VISSL's head names.)
std::string regnet_name_from_torchvision(const std::string& name, const RegNetOptions& options);

// Validates `options` and builds the trunk. in_channels: channels of the input images.
Trunk build_regnet_trunk(const RegNetOptions& options, int64_t in_channels);

// A conv (no bias), BN and optional activation, with torchvision's child names "0" (conv) and
// "1" (norm): the stem, the projection shortcut and the a / b / c parts of a block.
// [b, in, h, w] -> [b, out, h / stride, w / stride].
class ConvNormActivationImpl : public torch::nn::Module, public SwappableChildren {
 public:
  // activation: "relu", "silu" or "" (none).
  ConvNormActivationImpl(
      int64_t in_channels,
      int64_t out_channels,
      int64_t kernel,
      int64_t stride,
      int64_t groups,
      const RegNetOptions& options,
      std::string activation);
  at::Tensor forward(at::Tensor x);
  // relu(norm(conv(x)) + residual) through models/norm_relu.h's fused call (a block's last
  // part, which has no activation of its own, when RegNetOptions::fuse_relu).
  at::Tensor forward_add_relu(const at::Tensor& x, const at::Tensor& residual);
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  torch::nn::Conv2d conv_{nullptr};
  torch::nn::AnyModule norm_;
  std::string activation_;
  bool fuse_relu_; // RegNetOptions::fuse_relu, with a relu activation
};
TORCH_MODULE(ConvNormActivation);

// The stem: a ConvNormActivation (children "0", "1" as torchvision's stem), then the max pool
// of res_stem_in.
class RegNetStemImpl : public ConvNormActivationImpl {
 public:
  RegNetStemImpl(int64_t in_channels, const RegNetOptions& options);
  at::Tensor forward(at::Tensor x);

 private:
  bool max_pool_;
};
TORCH_MODULE(RegNetStem);

// Squeeze-excitation: x * sigmoid(fc2(act(fc1(mean of x over h, w)))), fc1/fc2 1x1 convs
// with bias. [b, c, h, w] -> same.
class SqueezeExcitationImpl : public torch::nn::Module {
 public:
  SqueezeExcitationImpl(int64_t channels, int64_t squeeze_channels, std::string activation);
  at::Tensor forward(at::Tensor x);

 private:
  torch::nn::Conv2d fc1_{nullptr};
  torch::nn::Conv2d fc2_{nullptr};
  std::string activation_;
};
TORCH_MODULE(SqueezeExcitation);

// The bottleneck transform F: a (1x1) -> b (3x3, stride, groups) -> [se] -> c (1x1, no act).
class BottleneckTransformImpl : public torch::nn::Module {
 public:
  BottleneckTransformImpl(const RegNetBlockSpec& spec, const RegNetOptions& options);
  at::Tensor forward(at::Tensor x);
  // relu(forward(x) + shortcut), c's BatchNorm, the add and the ReLU in one call.
  at::Tensor forward_add_relu(at::Tensor x, const at::Tensor& shortcut);

 private:
  ConvNormActivation a_{nullptr};
  ConvNormActivation b_{nullptr};
  SqueezeExcitation se_{nullptr}; // null without SE
  ConvNormActivation c_{nullptr};
};
TORCH_MODULE(BottleneckTransform);

// ClassyVision's ResBottleneckBlock: act(proj(x) + f(x)), proj the identity when the shape
// is kept.
class RegNetBlockImpl : public torch::nn::Module {
 public:
  RegNetBlockImpl(const RegNetBlockSpec& spec, const RegNetOptions& options);
  at::Tensor forward(at::Tensor x);
  // Whether it is the first block of its stage, which is how a linear evaluation finds the
  // stages (models/feature_taps.h): not from the stride, since an AnyNet stage may keep it 1.
  bool starts_stage() const {
    return starts_stage_;
  }

 private:
  bool starts_stage_;
  ConvNormActivation proj_{nullptr}; // null for the identity
  BottleneckTransform f_{nullptr};
  std::string activation_;
  bool fuse_add_relu_; // RegNetOptions::fuse_relu, with a relu activation
};
TORCH_MODULE(RegNetBlock);

} // namespace largo::models
