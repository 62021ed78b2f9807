// The small CNN (the default job's model): shapes for 28x28 and 32x32 inputs, block layout,
// parameter count, channels-last numerics and option validation.
#include <largo/models/model_factory.h>

#include <largo/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace largo::models::small_cnn_test {
namespace {

ModelOptions cnn_options(int64_t in_channels, int64_t image_size) {
  ModelOptions options;
  options.trunk_name = "small_cnn";
  options.in_channels = in_channels;
  options.image_size = image_size;
  options.num_classes = 10;
  return options;
}

TEST(SmallCnn, ShapesFor28And32PixelInputs) {
  // 28 -> 14 -> 7 -> 3 and 32 -> 16 -> 8 -> 4 (then pooled to 3x3): 64 * 3 * 3 features.
  for (auto [channels, size] : {std::pair<int64_t, int64_t>{1, 28}, {3, 32}}) {
    TrunkHeadModel model = build_model(cnn_options(channels, size));
    EXPECT_EQ(model->num_trunk_blocks(), 3);
    EXPECT_EQ(model->trunk_output_dim(), 64 * 3 * 3);
    at::Tensor images = torch::randn({5, channels, size, size});
    torch::NoGradGuard no_grad;
    model->eval();
    at::Tensor stage1 = model->forward_trunk_range(images, 0, 1);
    EXPECT_EQ(stage1.sizes().vec(), (std::vector<int64_t>{5, 16, size / 2, size / 2}));
    at::Tensor stage2 = model->forward_trunk_range(stage1, 1, 2);
    EXPECT_EQ(stage2.sizes().vec(), (std::vector<int64_t>{5, 32, size / 4, size / 4}));
    EXPECT_EQ(model->forward_trunk(images).sizes().vec(), (std::vector<int64_t>{5, 576}));
    EXPECT_EQ(model->forward(images).sizes().vec(), (std::vector<int64_t>{5, 10}));
  }
}

TEST(SmallCnn, ParameterCount) {
  // conv (no bias) + BN (weight, bias) per stage, then Linear(576 -> 10).
  const int64_t expected =
      (1 * 16 * 9 + 2 * 16) + (16 * 32 * 9 + 2 * 32) + (32 * 64 * 9 + 2 * 64) + (576 * 10 + 10);
  EXPECT_EQ(count_parameters(*build_model(cnn_options(1, 28))), expected);
}

// Channels-last is a layout choice only: same weights, same numbers (up to summation order).
TEST(SmallCnn, ChannelsLastComputesTheSameAsNchw) {
  ModelOptions options = cnn_options(1, 28);
  torch::manual_seed(3);
  TrunkHeadModel fast = build_model(options);
  options.small_cnn.channels_last = false;
  torch::manual_seed(3);
  TrunkHeadModel plain = build_model(options);
  at::Tensor images = torch::randn({8, 1, 28, 28});
  at::Tensor labels = torch::randint(0, 10, {8});
  at::Tensor fast_out = fast->forward(images);
  at::Tensor plain_out = plain->forward(images);
  EXPECT_TRUE(torch::allclose(fast_out, plain_out, 1e-4, 1e-5));
  torch::nn::functional::cross_entropy(fast_out, labels).backward();
  torch::nn::functional::cross_entropy(plain_out, labels).backward();
  auto fast_params = fast->named_parameters();
  for (const auto& item : plain->named_parameters()) {
    EXPECT_TRUE(torch::allclose(fast_params[item.key()].grad(), item.value().grad(), 1e-3, 1e-5))
        << item.key();
  }
}

TEST(SmallCnn, CustomChannelsPoolingAndDropout) {
  ModelOptions options = cnn_options(3, 32);
  options.small_cnn.channels = {8, 16};
  options.small_cnn.pooled_size = 2;
  options.small_cnn.dropout = 0.5;
  TrunkHeadModel model = build_model(options);
  EXPECT_EQ(model->num_trunk_blocks(), 2);
  EXPECT_EQ(model->trunk_output_dim(), 16 * 2 * 2);
  at::Tensor images = torch::randn({4, 3, 32, 32});
  torch::NoGradGuard no_grad;
  model->train();
  at::Tensor features = model->forward_trunk(images);
  EXPECT_EQ(features.sizes().vec(), (std::vector<int64_t>{4, 64}));
  // Dropout(0.5) in training zeroes about half of the (post-ReLU, mostly positive) features.
  model->eval();
  at::Tensor eval_features = model->forward_trunk(images);
  EXPECT_GT(features.eq(0).sum().item<int64_t>(), eval_features.eq(0).sum().item<int64_t>());
}

TEST(SmallCnn, RejectsBadOptions) {
  ModelOptions options = cnn_options(1, 4); // 3 stages halve 4 pixels to nothing
  try {
    build_model(options);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("at least 8"), std::string::npos) << error.what();
  }
  options = cnn_options(1, 28);
  options.small_cnn.dropout = 1.0;
  try {
    build_model(options);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("SmallCnnOptions::dropout"), std::string::npos)
        << error.what();
  }
  options = cnn_options(1, 28);
  options.small_cnn.channels = {};
  EXPECT_THROW(build_model(options), ConfigError);
}

} // namespace
} // namespace largo::models::small_cnn_test
