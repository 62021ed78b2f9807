// Linear evaluation (MODEL.FEATURE_EVAL_SETTINGS): a frozen trunk, features tapped at ResNet
// stages with their pooling, and trained heads on them.
#include <largo/core/error.h>
#include <largo/models/linear_eval.h>
#include <largo/models/model_factory.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::models::linear_eval_test {
namespace {

TrunkHeadModel resnet18() {
  ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = 18;
  options.resnet.stem = "cifar";
  options.image_size = 16;
  options.num_classes = 10;
  torch::manual_seed(0);
  return build_model(options);
}

EvalHeadOptions eval_mlp(int64_t in_channels, std::vector<int64_t> dims) {
  EvalHeadOptions head;
  head.in_channels = in_channels;
  head.dims = std::move(dims);
  return head;
}

// VISSL's benchmark layout, scaled to 16x16 images: three taps, eval_mlp heads on 4-D
// features (SHOULD_FLATTEN_FEATS False).
FeatureEvalOptions three_taps() {
  FeatureEvalOptions options;
  options.eval_mode_on = true;
  options.freeze_trunk_only = true;
  options.should_flatten_feats = false;
  options.taps = {
      {"conv1", "AdaptiveAvgPool2d", {2}, 0, 0},
      {"res4", "AvgPool2d", {2, 2}, 2, 0},
      {"res5avg", "Identity", {}, 0, 0}};
  options.heads = {eval_mlp(64, {256, 10}), eval_mlp(256, {1024, 10}), eval_mlp(512, {512, 10})};
  return options;
}

std::map<std::string, at::Tensor> buffers_of(const torch::nn::Module& module) {
  std::map<std::string, at::Tensor> buffers;
  for (const auto& item : module.named_buffers()) {
    buffers[item.key()] = item.value().clone();
  }
  return buffers;
}

TEST(LinearEvalTest, TrunkIsFrozenAndKeepsItsStatisticsWhileTheHeadsTrain) {
  LinearEvalModel model(resnet18(), three_taps());
  const auto before = buffers_of(*model);
  model->train();
  at::Tensor images = torch::randn({4, 3, 16, 16});
  at::Tensor labels = torch::tensor({1, 2, 3, 4});
  std::vector<at::Tensor> outputs = model->forward_outputs(images);
  ASSERT_EQ(outputs.size(), 3u);
  // The one tensor a parallel model carries splits back into the same outputs.
  const std::vector<at::Tensor> split = model->split_outputs(model->forward(images));
  ASSERT_EQ(split.size(), 3u);
  for (size_t i = 0; i < split.size(); ++i) {
    EXPECT_TRUE(split[i].equal(outputs[i])) << "output " << i;
  }
  at::Tensor loss = torch::zeros({});
  for (const auto& output : outputs) {
    EXPECT_EQ(output.sizes(), (std::vector<int64_t>{4, 10}));
    loss = loss + torch::nn::functional::cross_entropy(output, labels);
  }
  loss.backward();
  for (const auto& item : model->named_parameters()) {
    const bool trunk = item.key().rfind("trunk.", 0) == 0;
    EXPECT_EQ(item.value().requires_grad(), !trunk) << item.key();
    EXPECT_EQ(item.value().grad().defined(), !trunk) << item.key();
  }
  for (const auto& [name, buffer] : buffers_of(*model)) {
    const bool trunk = name.rfind("trunk.", 0) == 0;
    EXPECT_EQ(buffer.equal(before.at(name)), trunk) << name; // heads' BatchNorm2d trains
  }
  for (const auto& item : model->named_modules()) {
    EXPECT_EQ(item.value()->is_training(), item.key().rfind("trunk", 0) != 0) << item.key();
  }
}

TEST(LinearEvalTest, FeaturesAreTheTrunksStagesPooled) {
  TrunkHeadModel base = resnet18();
  base->eval();
  FeatureEvalOptions options = three_taps();
  LinearEvalModel model(base, options);
  at::Tensor images = torch::randn({2, 3, 16, 16});
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> features = model->forward_features(images);
  ASSERT_EQ(features.size(), 3u);
  auto* stem = base->trunk_block(0)->as<ResNetStemImpl>();
  EXPECT_TRUE(features[0].equal(at::adaptive_avg_pool2d(stem->forward_conv(images), {2, 2})));
  // res4: after the stem and the first three stages of 2 blocks each.
  at::Tensor res4 = base->forward_trunk_range(images, 0, 1 + 2 + 2 + 2);
  EXPECT_TRUE(features[1].equal(at::avg_pool2d(res4, {2, 2}, {2, 2})));
  EXPECT_EQ(features[1].sizes(), (std::vector<int64_t>{2, 256, 2, 2}));
  EXPECT_TRUE(features[2].equal(base->forward_trunk(images).reshape({2, 512, 1, 1})));

  options.should_flatten_feats = true;
  options.taps = {{"res3", "MaxPool2d", {4}, 0, 0}, {"flatten", "Identity", {}, 0, 0}};
  options.heads = {eval_mlp(512, {512, 10}), eval_mlp(512, {512, 10})};
  options.heads[1].name = "mlp";
  LinearEvalModel flat(base, options);
  features = flat->forward_features(images);
  at::Tensor res3 = base->forward_trunk_range(images, 0, 1 + 2 + 2);
  EXPECT_TRUE(features[0].equal(at::max_pool2d(res3, {4, 4}, {4, 4}).flatten(1)));
  EXPECT_EQ(flat->forward_outputs(images).size(), 2u);
}

// VISSL's trunk feature extraction configs tap the trunk and leave MODEL.HEAD.PARAMS empty:
// with extract_trunk_features_only the taps need no heads, and give the same features.
TEST(LinearEvalTest, TrunkFeatureExtractionTapsWithoutHeads) {
  TrunkHeadModel base = resnet18();
  base->eval();
  FeatureEvalOptions options = three_taps();
  options.heads.clear();
  EXPECT_THROW(validate_feature_eval_options(options), ConfigError);
  options.extract_trunk_features_only = true;
  LinearEvalModel bare(base, options);
  EXPECT_EQ(bare->num_outputs(), 0);
  LinearEvalModel with_heads(base, three_taps());
  at::Tensor images = torch::randn({2, 3, 16, 16});
  std::vector<at::Tensor> features = bare->forward_features(images);
  std::vector<at::Tensor> expected = with_heads->forward_features(images);
  ASSERT_EQ(features.size(), expected.size());
  for (size_t i = 0; i < features.size(); ++i) {
    EXPECT_TRUE(features[i].equal(expected[i])) << options.taps[i].feature;
  }
  try {
    bare->forward_outputs(images);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("forward_features"), std::string::npos)
        << error.what();
  }
  options.heads = {eval_mlp(64, {256, 10})}; // some heads, but not one per tap
  EXPECT_THROW(validate_feature_eval_options(options), ConfigError);
}

TEST(LinearEvalTest, HeadsAreNamedAsVissl) {
  LinearEvalModel model(resnet18(), three_taps());
  auto parameters = model->named_parameters();
  EXPECT_TRUE(parameters.contains("heads.0.channel_bn.weight"));
  EXPECT_TRUE(parameters.contains("heads.2.clf.clf.0.weight"));
  EXPECT_TRUE(parameters.contains("trunk.0.conv1.weight"));
}

TEST(LinearEvalTest, WithoutTapsThePretrainedHeadTrainsOnTheFrozenTrunk) {
  TrunkHeadModel base = resnet18();
  FeatureEvalOptions options;
  options.eval_mode_on = true;
  options.freeze_trunk_only = true;
  LinearEvalModel model(base, options);
  model->train();
  at::Tensor images = torch::randn({2, 3, 16, 16});
  std::vector<at::Tensor> outputs = model->forward_outputs(images);
  ASSERT_EQ(outputs.size(), 1u);
  outputs[0].sum().backward();
  EXPECT_TRUE(model->named_parameters()["head.0.weight"].grad().defined());
  EXPECT_FALSE(model->named_parameters()["trunk.0.conv1.weight"].grad().defined());
  base->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(outputs[0].detach().equal(base->forward(images)));

  options.freeze_trunk_only = false;
  options.freeze_trunk_and_head = true;
  LinearEvalModel frozen(resnet18(), options);
  for (const auto& parameter : frozen->parameters()) {
    EXPECT_FALSE(parameter.requires_grad());
  }
}

TEST(LinearEvalTest, RejectsUnknownFeaturesMismatchedHeadsAndOtherTrunks) {
  FeatureEvalOptions options = three_taps();
  options.taps[1].feature = "res6";
  EXPECT_THROW(validate_tap_features(tap_features(options), "resnet"), ConfigError);
  EXPECT_THROW(LinearEvalModel(resnet18(), options), ConfigError);
  options = three_taps();
  options.heads.pop_back();
  EXPECT_THROW(validate_feature_eval_options(options), ConfigError);
  options = three_taps();
  options.heads[1] = eval_mlp(128, {1024, 10}); // res4 has 256 channels
  LinearEvalModel model(resnet18(), options);
  try {
    model->forward(torch::randn({2, 3, 16, 16}));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("FeatureEvalOptions::heads[1]"), std::string::npos)
        << error.what();
  }
  ModelOptions small;
  small.trunk_name = "small_cnn";
  EXPECT_THROW(LinearEvalModel(build_model(small), three_taps()), ConfigError);
}

} // namespace
} // namespace largo::models::linear_eval_test
