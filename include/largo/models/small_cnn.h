// A small, fast CNN for 28x28 / 32x32 images (MNIST, Fashion-MNIST, CIFAR-10): the default
// job's model. With the defaults it trains at >10k images/s (forward + backward, batch
// 128, 2 threads) on the 2-core dev machine and reaches ~92 % Fashion-MNIST test top-1 in
// 5 epochs (SGD + cosine).
//
// Trunk blocks, one per conv stage:
//   stage i: conv3x3 (no bias) -> max pool 2x2 -> BatchNorm -> ReLU      [b, c_i, h/2, w/2]
//   the last stage then average-pools to pooled_size x pooled_size and flattens
//   (+ dropout)                                        -> [b, c_last * pooled_size^2]
// Pooling comes before BN + ReLU (max pool commutes with ReLU): BN and ReLU then touch 4x
// fewer values, which matters because these memory-bound ops, not the convs, dominated the
// step time on CPU. Stages compute in channels-last layout, which oneDNN's convs and
// libtorch's max pool run several times faster here than NCHW.
#pragma once

#include <largo/models/module_swap.h>
#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/conv.h>

#include <cstdint>
#include <vector>

namespace largo::models {

struct SmallCnnOptions {
  std::vector<int64_t> channels{16, 32, 64}; // output channels of each conv stage
  // The last stage's maps are average-pooled to this size (skipped when they already are:
  // 28x28 inputs give 3x3 maps), so the feature width does not depend on the image size.
  int64_t pooled_size = 3;
  double dropout = 0.0;      // MODEL.TRUNK.SMALL_CNN.DROPOUT: on the flattened features
  bool channels_last = true; // compute in channels-last layout (faster on CPU)
};

// Throws ConfigError for empty/non-positive channels, pooled_size < 1, dropout outside
// [0, 1), or an image_size below 2^stages (each stage halves it).
Trunk build_small_cnn_trunk(
    const SmallCnnOptions& options, int64_t in_channels, int64_t image_size);

struct SmallCnnStageOptions {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  bool channels_last = true;
  // For the last stage: pool to pooled_size x pooled_size and flatten; 0 = keep 4-D maps.
  int64_t pooled_size = 0;
  double dropout = 0.0; // after flattening (last stage only)
};

// One stage: [b, in, h, w] -> [b, out, h/2, w/2] (or [b, out * pooled^2] for the last).
// Its BatchNorm2d ("bn") is swappable (models/module_swap.h).
class SmallCnnStageImpl : public torch::nn::Module, public SwappableChildren {
 public:
  explicit SmallCnnStageImpl(const SmallCnnStageOptions& options);
  at::Tensor forward(at::Tensor x);
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  SmallCnnStageOptions options_;
  torch::nn::Conv2d conv_{nullptr};
  torch::nn::AnyModule bn_;
};
TORCH_MODULE(SmallCnnStage);

} // namespace largo::models
