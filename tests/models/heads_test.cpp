// Heads: the default linear head and VISSL's mlp head layouts.
#include <largo/models/model_factory.h>

#include <largo/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::models::heads_test {
namespace {

std::vector<std::string> module_names(const torch::nn::Sequential& head) {
  std::vector<std::string> names;
  for (const auto& module : head->children()) {
    names.push_back(module->name());
  }
  return names;
}

TEST(Heads, MlpHeadDefaultsAreLinearLayersOnly) {
  torch::nn::Sequential head = build_mlp_head({64, 32, 10});
  EXPECT_EQ(
      module_names(head),
      (std::vector<std::string>{"torch::nn::LinearImpl", "torch::nn::LinearImpl"}));
  EXPECT_EQ(head->forward(torch::randn({4, 64})).sizes().vec(), (std::vector<int64_t>{4, 10}));
}

TEST(Heads, MlpHeadWithBnReluSkipsThemAfterTheLastLayer) {
  MlpHeadOptions options;
  options.use_bn = true;
  options.use_relu = true;
  options.use_dropout = true;
  torch::nn::Sequential head = build_mlp_head({64, 32, 16, 10}, options);
  EXPECT_EQ(
      module_names(head),
      (std::vector<std::string>{
          "torch::nn::LinearImpl",
          "torch::nn::BatchNorm1dImpl",
          "torch::nn::ReLUImpl",
          "torch::nn::DropoutImpl",
          "torch::nn::LinearImpl",
          "torch::nn::BatchNorm1dImpl",
          "torch::nn::ReLUImpl",
          "torch::nn::DropoutImpl",
          "torch::nn::LinearImpl"}));
  options.skip_last_layer_relu_bn = false;
  options.use_dropout = false;
  options.use_bias = false;
  head = build_mlp_head({64, 10}, options);
  EXPECT_EQ(
      module_names(head),
      (std::vector<std::string>{
          "torch::nn::LinearImpl", "torch::nn::BatchNorm1dImpl", "torch::nn::ReLUImpl"}));
  EXPECT_EQ(count_parameters(*head), 64 * 10 + 2 * 10); // no Linear bias, BN weight + bias
}

TEST(Heads, ModelWithMlpHead) {
  ModelOptions options;
  options.trunk_name = "small_cnn";
  options.in_channels = 1;
  options.image_size = 28;
  options.num_classes = 10;
  options.head_dims = {576, 128, 10};
  options.head.use_relu = true;
  TrunkHeadModel model = build_model(options);
  EXPECT_EQ(model->head()->size(), 3u); // Linear, ReLU, Linear
  EXPECT_TRUE(model->named_parameters().contains("head.2.weight"));
  torch::NoGradGuard no_grad;
  EXPECT_EQ(
      model->forward(torch::randn({2, 1, 28, 28})).sizes().vec(), (std::vector<int64_t>{2, 10}));
}

TEST(Heads, HeadDimsMustFitTrunkAndClasses) {
  ModelOptions options;
  options.trunk_name = "mlp";
  options.in_channels = 1;
  options.image_size = 28;
  options.num_classes = 10;
  options.mlp.hidden_dims = {64};
  options.head_dims = {128, 10};
  try {
    build_model(options);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("ModelOptions::head_dims"), std::string::npos) << message;
    EXPECT_NE(message.find("[128, 10]"), std::string::npos) << message;
    EXPECT_NE(message.find("64"), std::string::npos) << message;
  }
  options.head_dims = {64, 7};
  try {
    build_model(options);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("number of classes 10"), std::string::npos)
        << error.what();
  }
  options.head_dims = {64};
  EXPECT_THROW(build_model(options), ConfigError);
}

} // namespace
} // namespace largo::models::heads_test
