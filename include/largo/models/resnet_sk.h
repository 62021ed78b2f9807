// SimCLRv2's ResNet with selective kernels (VISSL's trunk "resnet_sk",
// vissl/models/trunks/resnext_selective_kernels.py), as VISSL computes it:
//   - stem: with selective kernels three 3x3 convs (stride 2 in the first; 32*w, 32*w, 64*w
//     channels for width multiplier w), without a 7x7/2 conv to 64*w; BatchNorm + ReLU after
//     each; 3x3/2 max pool;
//   - four stages of bottleneck blocks (64*w .. 512*w channels inside, 4x that out), stride 2
//     from the second stage on (in the 3x3 conv), the first block of each stage with a
//     projection shortcut: with selective kernels a zero pad (right, bottom), 2x2 average pool
//     with the stride and a 1x1 conv, without a strided 1x1 conv; then BatchNorm;
//   - the selective kernel in place of the 3x3 conv: a 3x3 conv to twice the channels (+ BN +
//     ReLU), split in two halves; the sum of the halves, averaged over the pixels, goes
//     through 1x1 conv (to max(channels * sk_ratio, 32)) + BN + ReLU + 1x1 conv (to twice
//     the channels); a softmax over the two halves of that weights the halves, which are
//     summed;
//   - the blocks end in ReLU(shortcut + block); the trunk ends in the mean over the pixels.
// BatchNorm eps 1e-5, momentum 0.1 (PyTorch's defaults, as VISSL's). Initialization: PyTorch's
// defaults for Conv2d and BatchNorm2d (VISSL sets none).
//
// Trunk blocks (models/trunk_head_model.h): 0 = the stem, 1 .. N = the bottleneck blocks in
// order, N + 1 = the mean pool, output [batch, 2048 * w]. Inside each block the modules carry
// VISSL's names ("0.weight" of the stem is VISSL's net.0.0.weight; a block's "net.2.main_conv.
// 0.weight" is VISSL's net.<stage>.blocks.<i>.net.2.main_conv.0.weight), so
// resnet_sk_name_from_vissl maps a VISSL checkpoint onto Largo's names one to one.
// No collectives.
#pragma once

#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::models {

// MODEL.TRUNK.RESNETS_SK.
struct ResNetSkOptions {
  // DEPTH: VISSL builds only 152, blocks {3, 8, 36, 3} per stage.
  int64_t depth = 152;
  int64_t width_multiplier = 3; // WIDTH_MULTIPLIER: an integer >= 1
  double sk_ratio = 0.0625;     // SK_RATIO: 0 = plain bottlenecks and a 7x7 stem
  // Library option (no key): blocks per stage in place of the depth's, for small test models.
  std::vector<int64_t> blocks_per_stage{};
};

// The blocks per stage `options` build. Throws OptionError naming ResNetSkOptions::depth
// (other than 152 without blocks_per_stage), ::width_multiplier (< 1), ::sk_ratio (< 0) or
// ::blocks_per_stage (not four counts >= 1).
std::vector<int64_t> resnet_sk_stage_sizes(const ResNetSkOptions& options);

// Throws what resnet_sk_stage_sizes throws.
Trunk build_resnet_sk_trunk(const ResNetSkOptions& options, int64_t in_channels);

// Largo's name for a tensor VISSL names "trunk.net.<...>" or "net.<...>" in a resnet_sk of
// these options ("trunk.net.0.1.0.weight" -> "trunk.0.1.0.weight", "trunk.net.2.blocks.1.net.
// 0.weight" -> "trunk.5.net.0.weight" for blocks {3, ...}); other names come back unchanged.
std::string resnet_sk_name_from_vissl(const std::string& name, const ResNetSkOptions& options);

// Modules run one after another, registered as "0", "1", ... like torch.nn.Sequential (which
// libtorch's Sequential cannot be inside another Sequential).
class ChainImpl : public torch::nn::Module {
 public:
  void push_back(torch::nn::AnyModule module);
  at::Tensor forward(at::Tensor x);

 private:
  std::vector<torch::nn::AnyModule> modules_;
};
TORCH_MODULE(Chain);

// VISSL's SelectiveKernel: [b, in, h, w] -> [b, out, h / stride, w / stride].
class SelectiveKernelImpl : public torch::nn::Module {
 public:
  SelectiveKernelImpl(int64_t in_channels, int64_t out_channels, int64_t stride, double sk_ratio);
  at::Tensor forward(at::Tensor x);

 private:
  Chain main_conv_{nullptr};
  Chain mixing_conv_{nullptr};
};
TORCH_MODULE(SelectiveKernel);

// VISSL's BottleneckBlock: ReLU(projection(x) + net(x)), out_channels = 4 * channels.
class SkBottleneckImpl : public torch::nn::Module {
 public:
  SkBottleneckImpl(
      int64_t in_channels, int64_t channels, int64_t stride, double sk_ratio, bool projection);
  at::Tensor forward(at::Tensor x);

 private:
  torch::nn::AnyModule projection_; // empty: the identity
  Chain net_{nullptr};
};
TORCH_MODULE(SkBottleneck);

} // namespace largo::models
