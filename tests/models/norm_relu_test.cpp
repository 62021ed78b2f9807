// The trunks' BatchNorm + ReLU through models/norm_relu.h (NormOptions::fuse_relu,
// RegNetOptions::fuse_relu; MODEL.FUSED_KERNELS): on the CPU the fused call runs ATen's ops, so
// a ResNet (basic and bottleneck blocks, NCHW and channels-last) and a RegNet built with it
// train bit for bit like the same model built without it: outputs, every gradient, the weights
// after SGD steps, the running statistics and num_batches_tracked, then evaluation. That checks
// what the blocks pass (weight, bias, running statistics, momentum, eps, training and the batch
// count) through the call the CUDA kernels share. Also: a SyncBatchNorm-like subclass and a
// cumulative-average BatchNorm keep the module's own forward.
#include <largo/models/channels_last_module.h>
#include <largo/models/model_factory.h>
#include <largo/models/norm_relu.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace largo::models::norm_relu_test {
namespace {

ModelOptions trunk_options(const std::string& trunk, int64_t depth, bool fuse) {
  ModelOptions options;
  options.trunk_name = trunk;
  options.in_channels = 3;
  options.image_size = 16;
  options.num_classes = 5;
  options.resnet.depth = depth;
  options.resnet.stem = "cifar";
  options.resnet.norm.fuse_relu = fuse;
  options.regnet.depth = 6;
  options.regnet.w_0 = 8;
  options.regnet.w_a = 8;
  options.regnet.w_m = 2;
  options.regnet.group_width = 4;
  options.regnet.stem_width = 8;
  options.regnet.fuse_relu = fuse;
  return options;
}

// Three SGD steps in training mode, then an evaluation forward; every tensor the model holds
// (parameters, gradients, buffers) and every output, in order.
std::vector<at::Tensor> train_and_collect(const ModelOptions& options, bool channels_last) {
  torch::manual_seed(7);
  TrunkHeadModel model = build_model(options);
  if (channels_last) {
    convert_to_channels_last(*model);
  }
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(3);
  std::vector<at::Tensor> seen;
  model->train();
  for (int step = 0; step < 3; ++step) {
    at::Tensor images = at::randn({4, 3, 16, 16}, generator);
    if (channels_last) {
      images = images.contiguous(at::MemoryFormat::ChannelsLast);
    }
    const at::Tensor labels = at::randint(0, 5, {4}, generator);
    sgd.zero_grad();
    const at::Tensor output = model->forward(images);
    torch::nn::functional::cross_entropy(output, labels).backward();
    seen.push_back(output.detach().clone());
    for (const auto& parameter : model->parameters()) {
      seen.push_back(parameter.grad().clone());
    }
    sgd.step();
  }
  model->eval();
  torch::NoGradGuard no_grad;
  seen.push_back(model->forward(at::randn({2, 3, 16, 16}, generator)));
  for (const auto& parameter : model->parameters()) {
    seen.push_back(parameter.detach().clone());
  }
  for (const auto& buffer : model->buffers()) { // running statistics, num_batches_tracked
    seen.push_back(buffer.clone());
  }
  return seen;
}

void expect_bit_for_bit(const std::string& trunk, int64_t depth, bool channels_last) {
  const std::string what =
      trunk + " " + std::to_string(depth) + (channels_last ? " channels-last" : " contiguous");
  const auto fused = train_and_collect(trunk_options(trunk, depth, true), channels_last);
  const auto unfused = train_and_collect(trunk_options(trunk, depth, false), channels_last);
  ASSERT_EQ(fused.size(), unfused.size()) << what;
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_TRUE(fused[i].equal(unfused[i])) << what << ": tensor " << i << " of " << fused.size();
  }
}

TEST(ResNetFusedNormReluTest, TrainsBitForBitLikeAtensOpsOnTheCpu) {
  expect_bit_for_bit("resnet", 18, false); // basic blocks
  expect_bit_for_bit("resnet", 18, true);
  expect_bit_for_bit("resnet", 50, false); // bottlenecks, projection shortcuts
  expect_bit_for_bit("regnet", 0, true);
}

// A module derived from BatchNorm2d (as SyncBatchNorm is) computes other statistics: the fused
// call must not stand in for it.
struct HalvingBatchNormImpl : torch::nn::BatchNorm2dImpl {
  using BatchNorm2dImpl::BatchNorm2dImpl;
  at::Tensor forward(const at::Tensor& input) {
    return BatchNorm2dImpl::forward(input) * 0.5;
  }
};

TEST(ResNetFusedNormReluTest, SubclassesAndCumulativeAveragesKeepTheirOwnForward) {
  const at::Tensor x = at::randn({4, 3, 5, 5});
  const at::Tensor residual = at::randn({4, 3, 5, 5});
  auto halving = std::make_shared<HalvingBatchNormImpl>(torch::nn::BatchNorm2dOptions(3));
  torch::nn::AnyModule subclass(halving);
  EXPECT_TRUE(norm_relu(subclass, x, true).equal(halving->forward(x).relu()));
  EXPECT_TRUE(
      norm_add_relu(subclass, x, residual, true).equal((halving->forward(x) + residual).relu()));

  // momentum None: a cumulative average, 1 / num_batches_tracked, as the module computes it.
  torch::nn::BatchNorm2d cumulative(torch::nn::BatchNorm2dOptions(3).momentum(std::nullopt));
  torch::nn::BatchNorm2d reference(torch::nn::BatchNorm2dOptions(3).momentum(std::nullopt));
  torch::nn::AnyModule any(cumulative);
  for (int step = 0; step < 3; ++step) {
    EXPECT_TRUE(norm_relu(any, x * (step + 1), true).equal(reference(x * (step + 1)).relu()));
  }
  EXPECT_TRUE(cumulative->running_mean.equal(reference->running_mean));
  EXPECT_TRUE(cumulative->running_var.equal(reference->running_var));
}

} // namespace
} // namespace largo::models::norm_relu_test
