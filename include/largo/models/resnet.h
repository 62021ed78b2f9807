// ResNet trunks (18/34/50/101/152/200) with torchvision's architecture: the same layers,
// parameter shapes, parameter order and initialization, so ResNet-50 with a
// Linear(2048 -> 1000) head has torchvision's 25,557,032 parameters.
//
// Trunk blocks (what checkpointing, FSDP and pipelines cut between):
//   block 0            stem: conv (7x7/2 "imagenet" or 3x3/1 "cifar"), BN, ReLU[, max pool]
//   blocks 1 .. n      one residual block each (BasicBlock for 18/34, Bottleneck for 50+)
//   block n+1          adaptive average pool to 1x1 + flatten -> [batch, 512 * expansion * w]
// Inside a block, names are torchvision's (conv1, bn1, ..., downsample.0/1), so
// "trunk.<k>.conv1.weight" corresponds to torchvision's "layer<s>.<i>.conv1.weight".
#pragma once

#include <largo/models/module_swap.h>
#include <largo/models/norm_layers.h>
#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::models {

struct ResNetOptions {
  int64_t depth = 50; // MODEL.TRUNK.RESNETS.DEPTH: 18, 34, 50, 101, 152 or 200
  // MODEL.TRUNK.RESNETS.STEM: "imagenet" (7x7 stride-2 conv + 3x3 stride-2 max pool) or
  // "cifar" (3x3 stride-1 conv, no pool; for 32x32 inputs).
  std::string stem = "imagenet";
  // MODEL.TRUNK.RESNETS.ZERO_INIT_RESIDUAL: the last BN of each residual block starts at 0,
  // so each block starts as the identity.
  bool zero_init_residual = false;
  // MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER: like VISSL, scales the stem and every stage
  // (RN50x2 = 2). 1 is torchvision's ResNet.
  int64_t width_multiplier = 1;
  // MODEL.TRUNK.RESNETS.GROUPS / WIDTH_PER_GROUP: ResNeXt (Bottleneck depths only).
  int64_t groups = 1;
  int64_t width_per_group = 64;
  // MODEL.TRUNK.RESNETS.LAYER4_STRIDE: 1 keeps the last stage at the resolution of the third.
  int64_t layer4_stride = 2;
  // MODEL.TRUNK.RESNETS.NORM / GROUPNORM_GROUPS: every norm layer (stem, blocks, shortcuts).
  NormOptions norm;
};

// Residual blocks per stage for a depth, e.g. 50 -> {3, 4, 6, 3}. Throws OptionError naming
// ResNetOptions::depth for an unsupported depth.
std::vector<int64_t> resnet_stage_sizes(int64_t depth);
// 1 for BasicBlock depths (18, 34), 4 for Bottleneck depths (50+).
int64_t resnet_expansion(int64_t depth);

// Largo's name for a tensor of a depth-`depth` ResNet named as torchvision names it
// ("conv1.weight", "bn1.running_mean", "layer2.0.downsample.1.weight" -> "trunk.0.conv1.weight",
// "trunk.0.bn1.running_mean", "trunk.4.downsample.1.weight"; "fc.bias" -> "head.0.bias"), also
// under VISSL's trunk prefixes ("trunk._feature_blocks.", "trunk.base_model._feature_blocks.",
// "_feature_blocks."). Other names come back unchanged. (checkpoint/weights_init.h's rename;
// weights_name_mapping in vissl_names.h adds VISSL's head names.)
std::string resnet_name_from_torchvision(const std::string& name, int64_t depth);

// One residual block of the trunk: what build_resnet_trunk builds and count_model_flops
// counts (blocks 1 .. n, in order).
struct ResNetBlockSpec {
  int64_t in_channels = 0;
  int64_t planes = 0; // the block's output has planes * expansion channels
  int64_t stride = 1; // on the first 3x3 conv (BasicBlock) or the 3x3 conv (Bottleneck)
};
// The stem's output channels (64 times WIDTH_MULTIPLIER) and every residual block.
int64_t resnet_stem_channels(const ResNetOptions& options);
std::vector<ResNetBlockSpec> resnet_blocks(const ResNetOptions& options);

// Validates `options` (OptionError naming the ResNetOptions field, value and what is expected) and
// builds the trunk. in_channels: channels of the input images.
Trunk build_resnet_trunk(const ResNetOptions& options, int64_t in_channels);

// The stem: conv1 -> bn1 -> ReLU [-> max pool]. [b, in, h, w] -> [b, 64*w, h', w'].
// (bn1 is the norm layer NormOptions picks; torchvision's name is kept.)
class ResNetStemImpl : public torch::nn::Module, public SwappableChildren {
 public:
  ResNetStemImpl(
      int64_t in_channels, int64_t out_channels, bool imagenet_stem, const NormOptions& norm = {});
  at::Tensor forward(at::Tensor x);
  // The two halves of forward (VISSL's "conv1" feature is the first one's output):
  // conv1 -> bn1 -> ReLU, and the max pool (the identity for the "cifar" stem).
  at::Tensor forward_conv(at::Tensor x);
  at::Tensor forward_pool(at::Tensor x);
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::AnyModule bn1_;
  bool use_max_pool_;
  bool fuse_relu_; // NormOptions::fuse_relu
};
TORCH_MODULE(ResNetStem);

// torchvision's BasicBlock: two 3x3 convs, stride on the first, identity or 1x1 shortcut.
class BasicBlockImpl : public torch::nn::Module, public SwappableChildren {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlockImpl(int64_t in_channels, int64_t planes, int64_t stride, const NormOptions& norm = {});
  at::Tensor forward(at::Tensor x);
  // The norm layer zero_init_residual zeroes.
  const torch::nn::AnyModule& last_norm() const {
    return bn2_;
  }
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::AnyModule bn1_;
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::AnyModule bn2_;
  torch::nn::Sequential downsample_{nullptr}; // null when the shortcut is the identity
  bool fuse_relu_;                            // NormOptions::fuse_relu
};
TORCH_MODULE(BasicBlock);

// torchvision's Bottleneck (ResNet v1.5: the stride is on the 3x3 conv):
// 1x1 (-> width) -> 3x3 (stride, groups) -> 1x1 (-> planes * 4), identity or 1x1 shortcut.
class BottleneckImpl : public torch::nn::Module, public SwappableChildren {
 public:
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(
      int64_t in_channels,
      int64_t planes,
      int64_t stride,
      int64_t groups,
      int64_t width_per_group,
      const NormOptions& norm = {});
  at::Tensor forward(at::Tensor x);
  const torch::nn::AnyModule& last_norm() const {
    return bn3_;
  }
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::AnyModule bn1_;
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::AnyModule bn2_;
  torch::nn::Conv2d conv3_{nullptr};
  torch::nn::AnyModule bn3_;
  torch::nn::Sequential downsample_{nullptr}; // null when the shortcut is the identity
  bool fuse_relu_;                            // NormOptions::fuse_relu
};
TORCH_MODULE(Bottleneck);

// Adaptive average pool to 1x1, then flatten: [b, c, h, w] -> [b, c]. No parameters.
class GlobalAvgPoolImpl : public torch::nn::Module {
 public:
  at::Tensor forward(at::Tensor x);
};
TORCH_MODULE(GlobalAvgPool);

} // namespace largo::models
