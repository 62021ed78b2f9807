// Heads: the default linear head and VISSL's mlp head layouts.
#include <largo/models/model_factory.h>
#include <largo/models/vissl_names.h>

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

// An mlp trunk on one-channel images of `side` x `side`, `width` wide, and `classes` classes.
ModelOptions mlp_trunk(int64_t side, int64_t width, int64_t classes) {
  ModelOptions options;
  options.trunk_name = "mlp";
  options.in_channels = 1;
  options.image_size = side;
  options.num_classes = classes;
  options.mlp.hidden_dims = {width};
  return options;
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
  ModelOptions options = mlp_trunk(28, 64, 10);
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

// ModelOptions::head_channel_bn: VISSL's eval_mlp on the trunk's output, BatchNorm2d over
// its channels ([b, c] seen as [b, c, 1, 1]) then the mlp, under VISSL's names.
TEST(Heads, EvalMlpOnTheTrunkIsBatchNormThenMlpUnderVisslsNames) {
  ModelOptions options = mlp_trunk(2, 8, 3);
  options.head_dims = {8, 3};
  options.head_channel_bn = 8;
  TrunkHeadModel model = build_model(options);
  auto parameters = model->named_parameters();
  const auto rename = weights_name_mapping(options);
  for (const std::string vissl : {"heads.0.channel_bn.weight", "heads.0.clf.clf.0.weight"}) {
    EXPECT_TRUE(parameters.contains(rename(vissl))) << vissl << " -> " << rename(vissl);
  }
  torch::NoGradGuard no_grad;
  model->eval();
  at::Tensor weight = parameters["head.0.channel_bn.weight"];
  at::Tensor bias = parameters["head.0.channel_bn.bias"];
  weight.copy_(at::linspace(0.5, 2.0, 8));
  bias.copy_(at::linspace(-1.0, 1.0, 8));
  auto buffers = model->named_buffers();
  at::Tensor mean = buffers["head.0.channel_bn.running_mean"];
  at::Tensor var = buffers["head.0.channel_bn.running_var"];
  mean.copy_(at::linspace(-0.2, 0.3, 8));
  var.copy_(at::linspace(0.5, 1.5, 8));
  const at::Tensor features = at::randn({4, 8});
  const at::Tensor normalized = (features - mean) / at::sqrt(var + 1e-5) * weight + bias;
  const at::Tensor expected = at::linear(
      normalized, parameters["head.0.clf.clf.0.weight"], parameters["head.0.clf.clf.0.bias"]);
  // float32, the same operations up to BatchNorm's fused form: a few ulps
  EXPECT_TRUE(at::allclose(model->forward_head(features), expected, 1e-5, 1e-6));
  options.head_channel_bn = 4; // not the trunk's width
  EXPECT_THROW(build_model(options), ConfigError);
}

// A swav_head without prototypes as the projection before a classifier (VISSL's fine-tuning
// of a SwAV checkpoint): Linear, BatchNorm1d, ReLU (skip_last_bn False), the rows
// L2-normalised (normalize_feats), then the classifier's Linear; checked against that formula
// with the chain's own tensors.
TEST(Heads, SwavProjectionBeforeAClassifierNormalizesItsEmbedding) {
  MlpHeadSpec projection;
  projection.dims = {8, 6};
  projection.options.use_bn = true;
  projection.options.use_relu = true;
  projection.options.skip_last_layer_relu_bn = false;
  projection.normalize_output = true;
  projection.vissl_module = "projection_head";
  const std::vector<MlpHeadSpec> chain{projection, MlpHeadSpec{{6, 3}, MlpHeadOptions{}}};
  EXPECT_EQ(head_chain_layers(chain[0]), 4U); // Linear, BatchNorm1d, ReLU, the normalisation
  torch::nn::Sequential head = build_head_chain(8, chain);
  ASSERT_EQ(head->size(), 5U);
  torch::NoGradGuard no_grad;
  head->eval();
  auto parameters = head->named_parameters();
  auto buffers = head->named_buffers();
  buffers["1.running_mean"].copy_(at::linspace(-0.2, 0.3, 6));
  buffers["1.running_var"].copy_(at::linspace(0.5, 1.5, 6));
  parameters["1.weight"].copy_(at::linspace(0.5, 2.0, 6));
  const at::Tensor features = at::randn({4, 8});
  const at::Tensor projected = at::relu(
      (at::linear(features, parameters["0.weight"], parameters["0.bias"]) -
       buffers["1.running_mean"]) /
          at::sqrt(buffers["1.running_var"] + 1e-5) * parameters["1.weight"] +
      parameters["1.bias"]);
  const at::Tensor embedding =
      projected / projected.norm(2, /*dim=*/{1}, /*keepdim=*/true).clamp_min(1e-12);
  const at::Tensor expected = at::linear(embedding, parameters["4.weight"], parameters["4.bias"]);
  // float32, the same operations up to BatchNorm's fused form: a few ulps
  EXPECT_TRUE(at::allclose(head->forward(features), expected, 1e-5, 1e-6));
}

// MODEL.HEAD.PARAMS_MULTIPLIER scales VISSL's mlp heads (MLP.scale_weights), not a swav_head,
// so in a chain the projection keeps its initialization and the classifier is scaled.
TEST(Heads, ParamsMultiplierScalesTheMlpHeadsNotASwavProjection) {
  ModelOptions options = mlp_trunk(2, 8, 3);
  MlpHeadSpec projection;
  projection.dims = {8, 6};
  projection.normalize_output = true;
  projection.vissl_module = "projection_head";
  options.head_chain = {projection, MlpHeadSpec{{6, 3}, MlpHeadOptions{}}};
  torch::manual_seed(0);
  auto plain = build_model(options)->named_parameters();
  options.head_params_multiplier = 0.5;
  torch::manual_seed(0);
  auto scaled = build_model(options)->named_parameters();
  // head.0: the projection's Linear; head.1: the normalisation; head.2: the classifier.
  EXPECT_TRUE(scaled["head.0.weight"].equal(plain["head.0.weight"]));
  EXPECT_TRUE(scaled["head.2.weight"].equal(plain["head.2.weight"] * 0.5));
  EXPECT_TRUE(scaled["head.2.bias"].equal(plain["head.2.bias"] * 0.5));
}

} // namespace
} // namespace largo::models::heads_test
