// Stages cut from a model keep the full model's names and compute what the model computes;
// cuts balance the chosen cost; the split backward of zero-bubble schedules gives the
// gradients of an ordinary backward. One process.
#include <largo/core/error.h>
#include <largo/models/vit.h>
#include <largo/parallel/pipeline/pipeline_memory.h>
#include <largo/parallel/pipeline/pipeline_split_backward.h>
#include <largo/parallel/pipeline/pipeline_stages.h>

#include "parallel/pipeline_test_util.h"

#include <gtest/gtest.h>

namespace largo::parallel::pipeline_stages_test {
namespace {

using namespace largo::parallel::testing;

TEST(PipelineStagesTest, StagesKeepTheFullModelsNamesAndCompute) {
  auto model = make_model();
  auto blocks = pipeline_blocks(*model);
  ASSERT_EQ(blocks.size(), 8u);
  EXPECT_EQ(blocks.front().name, "trunk.0");
  EXPECT_EQ(blocks.back().name, "head.0");
  PipelineStage first(std::vector<PipelineBlock>(blocks.begin(), blocks.begin() + 3));
  PipelineStage second(std::vector<PipelineBlock>(blocks.begin() + 3, blocks.end()));
  std::vector<std::string> names;
  for (const auto* stage : {&first, &second}) {
    for (const auto& item : (*stage)->named_parameters()) {
      names.push_back(item.key());
    }
  }
  std::vector<std::string> expected;
  for (const auto& item : model->named_parameters()) {
    expected.push_back(item.key());
  }
  EXPECT_EQ(names, expected);
  auto [images, labels] = global_batch(0, 5);
  EXPECT_TRUE(second->forward(first->forward(images)).equal(model->forward(images)));
  // A Sequential's elements, with and without a prefix.
  auto sequential = torch::nn::Sequential(torch::nn::Linear(3, 3), torch::nn::ReLU());
  EXPECT_EQ(pipeline_blocks(sequential)[1].name, "1");
  PipelineStage nested(pipeline_blocks(sequential, "encoder.layers"));
  EXPECT_TRUE(nested->named_parameters().contains("encoder.layers.0.weight"));
}

TEST(PipelineStagesTest, CutsBalanceTheCostOrFollowTheBoundaries) {
  auto model = make_model();
  const auto blocks = pipeline_blocks(*model);
  const auto counts = block_parameter_counts(blocks);
  EXPECT_EQ(counts.front(), 16 * 12 + 12);
  EXPECT_EQ(counts.back(), 12 * kClasses + kClasses);
  // 204, 156 x 6, 52: the cheapest largest stage of 2 is blocks [0, 4) (672) vs 520.
  EXPECT_EQ(balanced_stage_boundaries(counts, 2), (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(
      balanced_stage_boundaries(std::vector<double>(8, 1.0), 4),
      (std::vector<int64_t>{0, 2, 4, 6, 8}));
  EXPECT_THROW(balanced_stage_boundaries(counts, 9), ConfigError);
  EXPECT_NO_THROW(check_stage_boundaries({0, 1, 8}, 8, 2));
  EXPECT_THROW(check_stage_boundaries({0, 8}, 8, 2), ConfigError);
  EXPECT_THROW(check_stage_boundaries({0, 3, 3, 8}, 8, 3), ConfigError);
  EXPECT_THROW(check_stage_boundaries({0, 4, 9}, 8, 2), ConfigError);
  EXPECT_EQ(parse_stage_balance("time"), StageBalance::kTime);
  EXPECT_THROW(parse_stage_balance("flops"), ConfigError);
  // Measured times: one per block, and the blocks' gradients left as they were.
  auto [images, labels] = global_batch(0, 4);
  const auto seconds = measure_block_seconds(blocks, images, 1);
  ASSERT_EQ(seconds.size(), blocks.size());
  for (double s : seconds) {
    EXPECT_GT(s, 0.0);
  }
  for (const auto& parameter : model->parameters()) {
    EXPECT_FALSE(parameter.grad().defined());
  }
}

// The estimate for `largo estimate`: each rank's parameters, and its peak activations as
// the schedule's stages in flight times what one micro-batch leaves alive in a stage —
// measured, so it is checked here by its structure: proportional to the rows, 8 in flight
// for gpipe, S - r for 1f1b.
TEST(PipelineMemoryTest, PeakActivationsAreStagesInFlightTimesOneMicroBatch) {
  auto model = make_model();
  const auto blocks = pipeline_blocks(*model);
  auto [images, labels] = global_batch(0, 6);
  const std::vector<int64_t> boundaries{0, 4, 8};
  const PipelineShape shape{2, 8, 1};
  const auto gpipe =
      estimate_pipeline_memory(blocks, boundaries, PipelineScheduleKind::kGPipe, shape, images);
  const auto one_f_one_b =
      estimate_pipeline_memory(blocks, boundaries, PipelineScheduleKind::kOneFOneB, shape, images);
  const auto doubled = estimate_pipeline_memory(
      blocks, boundaries, PipelineScheduleKind::kGPipe, shape, at::cat({images, images}));
  ASSERT_EQ(gpipe.size(), 2u);
  EXPECT_EQ(gpipe[0].parameter_count, 204 + 3 * 156);
  EXPECT_EQ(gpipe[1].parameter_count, 3 * 156 + 52);
  for (int r = 0; r < 2; ++r) {
    const int64_t per_microbatch = gpipe[r].activation_bytes_per_microbatch;
    EXPECT_GT(per_microbatch, 6 * 12 * 4) << r; // at least one [6, 12] float32 activation
    EXPECT_EQ(doubled[r].activation_bytes_per_microbatch, 2 * per_microbatch) << r;
    EXPECT_EQ(gpipe[r].peak_activation_bytes, 8 * per_microbatch);
    EXPECT_EQ(one_f_one_b[r].peak_stages_in_flight, 2 - r);
    EXPECT_EQ(one_f_one_b[r].peak_activation_bytes, (2 - r) * per_microbatch);
  }
  EXPECT_THROW(
      estimate_pipeline_memory(blocks, {0, 8}, PipelineScheduleKind::kGPipe, shape, images),
      ConfigError);
}

// Gradients of `module` (input [batch, ...] -> output) for seed `grad_output`, by an ordinary
// backward and by the split one; they must agree.
void expect_split_backward_equals_backward(
    torch::nn::Module& module,
    const std::function<at::Tensor(at::Tensor)>& forward,
    const at::Tensor& sample,
    bool input_requires_grad) {
  auto run = [&](bool split) {
    for (auto& parameter : module.parameters()) {
      parameter.mutable_grad() = at::Tensor();
    }
    at::Tensor input = sample.clone().requires_grad_(input_requires_grad);
    at::Tensor output = forward(input);
    at::Tensor seed = at::linspace(-1, 1, output.numel()).view(output.sizes());
    at::Tensor input_grad;
    if (split) {
      auto backward =
          SplitBackward::input_pass(output, seed, input, module.parameters(), input_grad);
      for (const auto& parameter : module.parameters()) { // nothing yet
        EXPECT_FALSE(parameter.grad().defined());
      }
      backward.weight_pass();
    } else {
      output.backward(seed);
      input_grad = input.grad();
    }
    std::vector<at::Tensor> grads{input_grad};
    for (const auto& parameter : module.parameters()) {
      grads.push_back(parameter.grad());
    }
    return grads;
  };
  const auto expected = run(false);
  const auto split = run(true);
  ASSERT_EQ(expected.size(), split.size());
  EXPECT_EQ(split[0].defined(), input_requires_grad);
  for (size_t i = input_requires_grad ? 0 : 1; i < expected.size(); ++i) {
    ASSERT_TRUE(split[i].defined()) << i;
    // The same kernels on the same values: equal up to the order in which a gradient used
    // twice is summed.
    EXPECT_TRUE(at::allclose(split[i], expected[i], 1e-6, 1e-7))
        << i << " max diff " << (split[i] - expected[i]).abs().max().item<double>() << " of "
        << expected[i].abs().max().item<double>() << " input grad " << input_requires_grad;
  }
}

TEST(SplitBackwardTest, EqualsAnOrdinaryBackwardOnVitLayersAndBatchNorm) {
  torch::manual_seed(1);
  models::VitEncoderLayerOptions layer_options;
  layer_options.hidden_dim = 16;
  layer_options.num_heads = 2;
  layer_options.mlp_dim = 32;
  layer_options.qkv_bias = true;
  auto vit = torch::nn::Sequential(
      models::VitEncoderLayer(layer_options), models::VitEncoderLayer(layer_options));
  const at::Tensor tokens = at::randn({3, 5, 16});
  auto vit_forward = [&](at::Tensor x) { return vit->forward(x); };
  expect_split_backward_equals_backward(*vit, vit_forward, tokens, true);
  expect_split_backward_equals_backward(*vit, vit_forward, tokens, false); // a first stage

  // BatchNorm, and a weight used twice (tied): its two uses share one group.
  auto net =
      torch::nn::Sequential(torch::nn::Linear(6, 6), torch::nn::BatchNorm1d(6), torch::nn::Tanh());
  auto tied = torch::nn::Linear(6, 6);
  auto net_forward = [&](at::Tensor x) { return tied->forward(net->forward(tied->forward(x))); };
  torch::nn::Module both;
  both.register_module("net", net.ptr());
  both.register_module("tied", tied.ptr());
  expect_split_backward_equals_backward(both, net_forward, at::randn({4, 6}), true);
}

TEST(SplitBackwardTest, WeightPassRunsOnce) {
  auto linear = torch::nn::Linear(3, 2);
  at::Tensor input = at::randn({2, 3}).requires_grad_(true);
  at::Tensor input_grad;
  auto backward = SplitBackward::input_pass(
      linear->forward(input), at::ones({2, 2}), input, linear->parameters(), input_grad);
  EXPECT_TRUE(input_grad.defined());
  backward.weight_pass();
  EXPECT_THROW(backward.weight_pass(), Error);
}

} // namespace
} // namespace largo::parallel::pipeline_stages_test
