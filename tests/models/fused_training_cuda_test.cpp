// Models built with Largo's fused CUDA kernels (MODEL.FUSED_KERNELS: ResNet's and RegNet's
// BatchNorm + ReLU (+ add), the ViT's bias + GELU and add + LayerNorm) train like the same
// models on ATen's kernels: 50 SGD steps, float32 and bfloat16 autocast, loss curves compared.
// Skipped without a GPU (scripts/gpu_check.sh runs them).
//
// The bound. Neither run computes the exact training: each rounds every op in its dtype, and
// the rounding errors are carried along by the training itself. The kernels' own tests
// (tests/kernels/*_cuda_test.cpp) bound each fused op within twice ATen's error of the exact
// value. So the fused run's loss may be at most twice as far from the exact (float64) run's as
// ATen's run is, at that step or any earlier one (errors that happened to cancel at one step
// are not a bound for the next), plus one rounding of the loss in the run's dtype:
//   |fused(s) - exact(s)| <= 2 max_{s' <= s} |aten(s') - exact(s')| + u_T |exact(s)|.
// The exact run is the unfused model in float64 on the same GPU (ATen's float64 kernels).
#include <largo/models/channels_last_module.h>
#include <largo/models/model_factory.h>

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda_kernels_skip.h"

namespace largo::models::fused_training_cuda_test {
namespace {

constexpr int kSteps = 50;
constexpr int64_t kBatch = 16;
constexpr int64_t kImage = 32;
constexpr int64_t kClasses = 10;

ModelOptions model_options(const std::string& trunk, bool fused) {
  ModelOptions options;
  options.trunk_name = trunk;
  options.in_channels = 3;
  options.image_size = kImage;
  options.num_classes = kClasses;
  options.resnet.depth = 18;
  options.resnet.stem = "cifar";
  options.resnet.norm.fuse_relu = fused;
  options.regnet.depth = 6;
  options.regnet.w_0 = 16;
  options.regnet.w_a = 16;
  options.regnet.w_m = 2;
  options.regnet.group_width = 8;
  options.regnet.stem_width = 16;
  options.regnet.fuse_relu = fused;
  options.vit.patch_size = 4;
  options.vit.num_layers = 4;
  options.vit.num_heads = 4;
  options.vit.hidden_dim = 128;
  options.vit.mlp_dim = 512;
  options.vit.fused_kernels = fused ? VitFusedKernels::kOnCuda : VitFusedKernels::kNever;
  return options;
}

struct Run {
  std::string trunk;
  bool fused = false;
  at::ScalarType dtype = at::kFloat;      // the parameters' and the images' dtype
  std::optional<at::ScalarType> autocast; // CUDA autocast's dtype, when on
};

// The loss at each of kSteps SGD steps (lr 0.01, momentum 0.9) over four fixed batches in turn.
std::vector<double> train_losses(const Run& run) {
  torch::manual_seed(17); // the same initial weights for every run of a trunk
  TrunkHeadModel model = build_model(model_options(run.trunk, run.fused));
  const bool convolutional = run.trunk != "vision_transformer";
  if (convolutional) {
    convert_to_channels_last(*model); // the fused BatchNorm kernels take channels-last
  }
  model->to(torch::kCUDA, run.dtype);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(23);
  std::vector<at::Tensor> images, labels;
  for (int b = 0; b < 4; ++b) {
    at::Tensor batch =
        at::randn({kBatch, 3, kImage, kImage}, generator).to(torch::kCUDA, run.dtype);
    images.push_back(convolutional ? batch.contiguous(at::MemoryFormat::ChannelsLast) : batch);
    labels.push_back(at::randint(0, kClasses, {kBatch}, generator).to(torch::kCUDA));
  }
  at::autocast::set_autocast_enabled(at::kCUDA, run.autocast.has_value());
  at::autocast::set_autocast_dtype(at::kCUDA, run.autocast.value_or(at::kBFloat16));
  std::vector<double> losses;
  model->train();
  for (int step = 0; step < kSteps; ++step) {
    sgd.zero_grad();
    const at::Tensor output = model->forward(images[step % 4]);
    const at::Tensor loss =
        torch::nn::functional::cross_entropy(output.to(run.dtype), labels[step % 4]);
    loss.backward();
    sgd.step();
    losses.push_back(loss.item<double>());
  }
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  return losses;
}

void expect_trains_like_aten(const std::string& trunk, std::optional<at::ScalarType> autocast) {
  const std::vector<double> exact = train_losses({trunk, false, at::kDouble, std::nullopt});
  const std::vector<double> aten = train_losses({trunk, false, at::kFloat, autocast});
  const std::vector<double> fused = train_losses({trunk, true, at::kFloat, autocast});
  const double loss_roundoff = autocast ? 0x1p-8 : 0x1p-24; // u_T of the loss's dtype
  double aten_error = 0.0; // max over the steps so far of |aten - exact|
  for (int step = 0; step < kSteps; ++step) {
    aten_error = std::max(aten_error, std::abs(aten[step] - exact[step]));
    const double bound = 2.0 * aten_error + loss_roundoff * std::abs(exact[step]);
    EXPECT_LE(std::abs(fused[step] - exact[step]), bound)
        << trunk << (autocast ? " bfloat16 autocast" : " float32") << " step " << step << ": fused "
        << fused[step] << ", ATen " << aten[step] << ", float64 " << exact[step];
  }
  // The training did something (the curves compared are not flat lines): the last pass over the
  // four batches has a lower mean loss than the first.
  const auto pass_mean = [&](int first) {
    return (exact[first] + exact[first + 1] + exact[first + 2] + exact[first + 3]) / 4.0;
  };
  EXPECT_LT(pass_mean(kSteps - 4), pass_mean(0)) << trunk;
}

TEST(FusedTrainingCudaTest, ResNetTrainsLikeAtenInFloat32AndBfloat16) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  expect_trains_like_aten("resnet", std::nullopt);
  expect_trains_like_aten("resnet", at::kBFloat16);
}

TEST(FusedTrainingCudaTest, RegNetTrainsLikeAtenInFloat32AndBfloat16) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  expect_trains_like_aten("regnet", std::nullopt);
  expect_trains_like_aten("regnet", at::kBFloat16);
}

TEST(FusedTrainingCudaTest, VitTrainsLikeAtenInFloat32AndBfloat16) {
  LARGO_SKIP_WITHOUT_CUDA_KERNELS();
  expect_trains_like_aten("vision_transformer", std::nullopt);
  expect_trains_like_aten("vision_transformer", at::kBFloat16);
}

} // namespace
} // namespace largo::models::fused_training_cuda_test
