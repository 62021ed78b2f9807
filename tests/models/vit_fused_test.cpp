// The ViT encoder layer's fused path (VitFusedKernels; kernels::bias_gelu for gelu(fc1(x)),
// kernels::add_layer_norm for the attention branch's residual add and norm2), checked where no
// GPU is: VitFusedKernels::kEverywhere takes the fused path's calls on the CPU, where the
// kernels run ATen's unfused sequence, so what differs from the unfused layer is only how the
// layer wires them (which bias, which norm weights, which residual stream, which output is
// passed on) and fc1's bias added after its matmul instead of inside addmm (which, depending on
// the BLAS, may round differently). The test makes that addition exact on both sides (below),
// so a correct wiring is bit for bit the unfused layer on any CPU:
// outputs, the input's gradient and every parameter's. Also: MODEL.FUSED_KERNELS's default
// (kOnCuda) leaves a ViT's CPU training bit for bit as without it. The GPU side (the CUDA
// kernels in a training ViT) is fused_training_cuda_test.cpp.
#include <largo/models/model_factory.h>
#include <largo/models/vit.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "vit_fused_test_util.h"

namespace largo::models::vit_fused_test {
namespace {

constexpr int64_t kHidden = 16;
constexpr int64_t kMlp = 32;

VitEncoderLayer make_layer(VitFusedKernels fused) {
  VitEncoderLayerOptions options;
  options.hidden_dim = kHidden;
  options.num_heads = 4;
  options.mlp_dim = kMlp;
  options.qkv_bias = true;
  options.fused_kernels = fused;
  return VitEncoderLayer(options);
}

// Every parameter random (biases and LayerNorm weights too, so that a swapped or missing one
// shows), except fc1's weight: exact products (testing::make_fc1_weight_exact).
void set_parameters(VitEncoderLayerImpl& layer) {
  torch::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  for (auto& named : layer.named_parameters()) {
    named.value().copy_(at::randn(named.value().sizes(), generator) * 0.5);
  }
  testing::make_fc1_weight_exact(layer.named_parameters()["fc1.weight"]);
}

// The output, the input's gradient and every parameter's gradient (in named order) of a
// forward and backward in training mode.
std::vector<at::Tensor> forward_backward(VitFusedKernels fused) {
  VitEncoderLayer layer = make_layer(fused);
  set_parameters(*layer);
  layer->train();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor x = at::randn({3, 7, kHidden}, generator).requires_grad_();
  const at::Tensor output = layer->forward(x);
  output.backward(at::randn(output.sizes(), generator));
  std::vector<at::Tensor> results{output.detach(), x.grad()};
  for (const auto& named : layer->named_parameters()) {
    results.push_back(named.value().grad());
  }
  return results;
}

TEST(VitFusedKernelsTest, FusedPathWiresTheLayerAsTheUnfusedOneComputesIt) {
  const auto fused = forward_backward(VitFusedKernels::kEverywhere);
  const auto unfused = forward_backward(VitFusedKernels::kNever);
  ASSERT_EQ(fused.size(), unfused.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_TRUE(fused[i].defined()) << "tensor " << i;
    EXPECT_TRUE(fused[i].equal(unfused[i])) << "tensor " << i << " (0: output, 1: grad of x, "
                                            << "then the parameters' gradients in named order)";
  }
}

// The test above is not of one path with itself: kEverywhere runs fc1 as a matmul without its
// bias (then bias_gelu), so its graph has one addmm fewer than the unfused layer's (qkv, proj,
// fc1, fc2: four), on any BLAS (on some, addmm and mm + add give the same bits for any weights,
// so equal outputs could not tell). kOnCuda on CPU activations is the unfused layer.
TEST(VitFusedKernelsTest, FusedPathReplacesFc1sAddmm) {
  const auto addmms = [](VitFusedKernels fused) {
    VitEncoderLayer layer = make_layer(fused);
    const at::Tensor output = layer->forward(at::randn({3, 7, kHidden}).requires_grad_());
    return testing::count_autograd_nodes(output, "AddmmBackward");
  };
  EXPECT_EQ(addmms(VitFusedKernels::kNever), 4);
  EXPECT_EQ(addmms(VitFusedKernels::kEverywhere), 3);
  EXPECT_EQ(addmms(VitFusedKernels::kOnCuda), 4);
}

// MODEL.FUSED_KERNELS (VitOptions::fused_kernels, default true) changes nothing on the CPU: a
// small ViT trains three SGD steps bit for bit with and without it.
std::vector<at::Tensor> train_vit(bool fused_kernels) {
  ModelOptions options;
  options.trunk_name = "vision_transformer";
  options.in_channels = 3;
  options.image_size = 16;
  options.num_classes = 5;
  options.vit.patch_size = 8;
  options.vit.num_layers = 2;
  options.vit.num_heads = 2;
  options.vit.hidden_dim = 16;
  options.vit.mlp_dim = 32;
  options.vit.fused_kernels = fused_kernels ? VitFusedKernels::kOnCuda : VitFusedKernels::kNever;
  torch::manual_seed(3);
  TrunkHeadModel model = build_model(options);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(9);
  std::vector<at::Tensor> seen;
  for (int step = 0; step < 3; ++step) {
    sgd.zero_grad();
    const at::Tensor output = model->forward(at::randn({4, 3, 16, 16}, generator));
    torch::nn::functional::cross_entropy(output, at::randint(0, 5, {4}, generator)).backward();
    seen.push_back(output.detach());
    sgd.step();
  }
  for (const auto& parameter : model->parameters()) {
    seen.push_back(parameter.detach());
  }
  return seen;
}

TEST(VitFusedKernelsTest, ModelOptionChangesNothingOnTheCpu) {
  const auto with = train_vit(true);
  const auto without = train_vit(false);
  ASSERT_EQ(with.size(), without.size());
  for (size_t i = 0; i < with.size(); ++i) {
    EXPECT_TRUE(with[i].equal(without[i])) << "tensor " << i;
  }
}

} // namespace
} // namespace largo::models::vit_fused_test
