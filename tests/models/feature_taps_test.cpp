// Linear evaluation of RegNet and ViT trunks: the features VISSL's names tap
// (models/feature_taps.h) against VISSL's way of computing them in PyTorch
// (tests/reference/gen_feature_tap_baselines.py, tests/models/baselines/
// feature_tap_baselines.json), against Largo's own trunk forward, and the names each trunk
// refuses.
#include <largo/core/error.h>
#include <largo/models/feature_taps.h>
#include <largo/models/linear_eval.h>
#include <largo/models/model_factory.h>
#include <largo/models/regnet.h>

#include "model_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace largo::models::feature_taps_test {
namespace {

const char* const kGenerator = "gen_feature_tap_baselines.py";

nlohmann::json tap_case(const std::string& name) {
  return testing::baseline_case("feature_tap_baselines.json", kGenerator, name);
}

std::vector<int64_t> shape_of(const nlohmann::json& json) {
  return json.get<std::vector<int64_t>>();
}

TrunkHeadModel regnet_model(int64_t image_size = 32) {
  ModelOptions options;
  options.trunk_name = "regnet";
  options.image_size = image_size;
  options.num_classes = 10;
  // gen_regnet_baselines.py's SMALL: stages [8, 16, 32, 64] of [1, 1, 3, 1] blocks.
  options.regnet.depth = 6;
  options.regnet.w_0 = 8;
  options.regnet.w_a = 8.0;
  options.regnet.w_m = 2.0;
  options.regnet.group_width = 4;
  options.regnet.stem_width = 8;
  return build_model(options);
}

TrunkHeadModel vit_model(const std::string& classifier, int64_t layers = 3) {
  ModelOptions options;
  options.trunk_name = "vision_transformer";
  options.image_size = 32;
  options.num_classes = 10;
  options.vit.patch_size = 8;
  options.vit.num_layers = layers;
  options.vit.num_heads = 4;
  options.vit.hidden_dim = 32;
  options.vit.mlp_dim = 64;
  options.vit.qkv_bias = true; // torchvision's attention always has one
  options.vit.classifier = classifier;
  return build_model(options);
}

// Every float tensor of `model` set to the case's closed form (through its Largo names), in
// eval mode.
void set_closed_form(TrunkHeadModel& model, const nlohmann::json& entry) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model->named_parameters()) {
    tensors[item.key()] = item.value();
  }
  for (const auto& item : model->named_buffers()) {
    tensors[item.key()] = item.value();
  }
  RegNetOptions regnet;
  regnet.depth = 6;
  regnet.w_0 = 8;
  regnet.w_a = 8.0;
  regnet.w_m = 2.0;
  regnet.group_width = 4;
  regnet.stem_width = 8;
  size_t assigned = 0;
  torch::NoGradGuard no_grad;
  for (const auto& t : entry.at("tensors")) {
    const std::string name = t.contains("largo_name")
                                 ? t.at("largo_name").get<std::string>()
                                 : regnet_name_from_torchvision(t.at("torchvision_name"), regnet);
    auto found = tensors.find(name);
    ASSERT_NE(found, tensors.end()) << name << " (" << t.at("torchvision_name") << ")";
    at::Tensor value = testing::closed_form(
        t.at("k").get<uint64_t>(), shape_of(t.at("shape")), t.at("scale"), t.at("offset"));
    ASSERT_EQ(found->second.sizes(), value.sizes()) << name;
    found->second.copy_(value);
    ++assigned;
  }
  size_t float_tensors = 0;
  for (const auto& [name, tensor] : tensors) {
    float_tensors += tensor.is_floating_point() ? 1 : 0;
  }
  EXPECT_EQ(assigned, float_tensors);
  model->eval();
}

// The case's input: 2u - 1 for key input_key.
at::Tensor closed_form_input(const nlohmann::json& entry) {
  return testing::closed_form(
      entry.at("input_key").get<uint64_t>(), shape_of(entry.at("input_shape")), 1.0, 0.0);
}

// A linear evaluation tapping `features` unpooled and unflattened, mlp heads of the right
// widths (unused: the features are what is compared).
LinearEvalModel tapping(TrunkHeadModel model, const std::vector<std::string>& features) {
  FeatureEvalOptions options;
  options.eval_mode_on = true;
  options.freeze_trunk_only = true;
  options.should_flatten_feats = false;
  for (const auto& feature : features) {
    options.taps.push_back({feature, "Identity", {}, 0, 0});
    EvalHeadOptions head;
    head.name = "mlp";
    head.dims = {1, 10}; // not run
    options.heads.push_back(head);
  }
  return LinearEvalModel(std::move(model), options);
}

// Largo's features against PyTorch's. Both run the same float32 operations (convolutions,
// BatchNorm, SE, matmuls, LayerNorm, GELU) in up to ~30 sequential steps; the kernels may sum
// in another order, each sum of K <= 576 products then differing by about sqrt(K) * 2^-24
// ~= 1.5e-6 relative, and LayerNorm / BatchNorm keep activations O(1): the errors add to a few
// 1e-5 of the feature's scale at most. Allow 1e-4 of it (as tests/models/
// torchvision_parity_test.cpp does through deeper models).
void expect_features_match(
    const std::vector<at::Tensor>& features,
    const std::vector<std::string>& names,
    const nlohmann::json& entry) {
  ASSERT_EQ(features.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const nlohmann::json& expected_json = entry.at("features").at(names[i]);
    at::Tensor expected = torch::tensor(expected_json.at("values").get<std::vector<float>>())
                              .view(shape_of(expected_json.at("shape")));
    ASSERT_EQ(features[i].sizes(), expected.sizes()) << names[i];
    const double scale = expected.abs().max().item<double>();
    const double error = (features[i] - expected).abs().max().item<double>();
    EXPECT_LE(error, 1e-4 * scale) << entry.at("name") << " " << names[i];
  }
}

TEST(FeatureTapsTest, RegNetFeaturesMatchVisslsRegNetTrunk) {
  const nlohmann::json entry = tap_case("regnet");
  TrunkHeadModel model = regnet_model();
  set_closed_form(model, entry);
  const std::vector<std::string> names{
      "conv1", "res2", "res3", "res4", "res5", "avgpool", "flatten"};
  LinearEvalModel eval = tapping(model, names);
  expect_features_match(eval->forward_features(closed_form_input(entry)), names, entry);
}

TEST(FeatureTapsTest, VitClassTokenFeaturesMatchVisslsIntermediateFeatures) {
  const nlohmann::json entry = tap_case("vit_token");
  TrunkHeadModel model = vit_model("token");
  set_closed_form(model, entry);
  const std::vector<std::string> names{
      "lastCLS", "blkCLS0", "blkCLS1", "concatCLS2", "concatCLS3", "lastBLK", "concatBLK2"};
  LinearEvalModel eval = tapping(model, names);
  expect_features_match(eval->forward_features(closed_form_input(entry)), names, entry);
}

TEST(FeatureTapsTest, VitPooledFeaturesMatchVisslsIntermediateFeatures) {
  const nlohmann::json entry = tap_case("vit_gap");
  TrunkHeadModel model = vit_model("gap");
  set_closed_form(model, entry);
  // 3 layers: stridePOOL_2 takes layers 2 and 0 (stride ceil(3 / 2)), stridePOOL_5_1 the 3
  // there are (VISSL's slice gives fewer than asked).
  const std::vector<std::string> names{
      "lastPOOL",
      "concatPOOL2",
      "concatPOOL3",
      "stridePOOL_2",
      "stridePOOL_2_1",
      "stridePOOL_5_1",
      "lastBLK",
      "concatBLK3"};
  LinearEvalModel eval = tapping(model, names);
  expect_features_match(eval->forward_features(closed_form_input(entry)), names, entry);
}

// The taps are the trunk's own computation: the same kernels on the same values, so equal.
TEST(FeatureTapsTest, TapsAreTheTrunksOwnForward) {
  torch::manual_seed(0);
  TrunkHeadModel regnet = regnet_model();
  regnet->eval();
  at::Tensor images = torch::randn({2, 3, 32, 32});
  torch::NoGradGuard no_grad;
  LinearEvalModel eval = tapping(regnet, {"res3", "res5", "flatten", "conv1"});
  std::vector<at::Tensor> features = eval->forward_features(images);
  // Blocks: stem, [1], [1], [3], [1] stage blocks, the pool.
  EXPECT_TRUE(features[0].equal(regnet->forward_trunk_range(images, 0, 3)));
  EXPECT_TRUE(features[1].equal(regnet->forward_trunk_range(images, 0, 7)));
  EXPECT_TRUE(features[2].equal(regnet->forward_trunk(images)));
  EXPECT_TRUE(features[3].equal(regnet->forward_trunk_range(images, 0, 1)));
  EXPECT_EQ(eval->trunk_blocks_run(), 8);
  EXPECT_EQ(tapping(regnet, {"res3"})->trunk_blocks_run(), 3);

  TrunkHeadModel vit = vit_model("token");
  vit->eval();
  LinearEvalModel last = tapping(vit, {"lastCLS", "concatCLS2"});
  features = last->forward_features(images);
  EXPECT_TRUE(features[0].equal(vit->forward_trunk(images))); // the normed class token
  EXPECT_TRUE(features[1].narrow(1, 32, 32).equal(features[0]));
  EXPECT_EQ(features[1].sizes(), (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(last->trunk_blocks_run(), 4);
  EXPECT_EQ(tapping(vit, {"blkCLS0"})->trunk_blocks_run(), 2);

  TrunkHeadModel gap = vit_model("gap");
  gap->eval();
  features = tapping(gap, {"lastPOOL", "lastBLK", "stridePOOL_1"})->forward_features(images);
  EXPECT_TRUE(features[0].equal(gap->forward_trunk(images))); // the mean of the normed tokens
  EXPECT_TRUE(features[1].mean(1).equal(features[0]));        // the normed tokens themselves
  EXPECT_TRUE(features[2].equal(features[0]));                // the last layer, stride 3
  EXPECT_EQ(tapping(gap, {"stridePOOL_2_1"})->trunk_blocks_run(), 4);
}

// An AnyNet stage that keeps the stride 1 is still a stage of its own: res3 ends after it,
// though its block does not downsample (VISSL's res<k> are ClassyVision's stages).
TEST(FeatureTapsTest, AnyNetStagesOfStrideOneAreStagesToo) {
  ModelOptions options;
  options.trunk_name = "regnet";
  options.image_size = 32;
  options.num_classes = 10;
  options.regnet.stem_width = 8;
  options.regnet.stages = {{8, 1, 2, 4, 1.0}, {16, 2, 1, 4, 1.0}, {32, 1, 2, 4, 1.0}};
  torch::manual_seed(0);
  TrunkHeadModel model = build_model(options);
  model->eval();
  const at::Tensor images = torch::randn({2, 3, 32, 32});
  torch::NoGradGuard no_grad;
  const std::vector<at::Tensor> features =
      tapping(model, {"res2", "res3", "res4"})->forward_features(images);
  // Blocks: stem, [1], [2], [1] stage blocks, the pool.
  EXPECT_TRUE(features[0].equal(model->forward_trunk_range(images, 0, 2)));
  EXPECT_TRUE(features[1].equal(model->forward_trunk_range(images, 0, 4)));
  EXPECT_TRUE(features[2].equal(model->forward_trunk_range(images, 0, 5)));
  EXPECT_EQ(features[1].sizes(), (std::vector<int64_t>{2, 16, 8, 8})); // 32 -> 16 -> 8 -> 8
}

// The message of the ConfigError `make` throws, or "(no ConfigError)".
template <typename F>
std::string error_of(F make) {
  try {
    make();
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(no ConfigError)";
}

TEST(FeatureTapsTest, NamesATrunkLacksAreRefusedListingItsFeatures) {
  auto refused = [](TrunkHeadModel model, const std::string& feature) {
    return error_of([&] { tapping(std::move(model), {"conv1", feature}); });
  };
  std::string error = refused(regnet_model(), "res6");
  EXPECT_NE(error.find("FeatureEvalOptions::taps[1] = res6"), std::string::npos) << error;
  EXPECT_NE(error.find("conv1, res2, res3, res4, res5, avgpool, flatten"), std::string::npos)
      << error;
  error = refused(regnet_model(), "res5avg"); // ResNet's name
  EXPECT_NE(error.find("a regnet feature: conv1 (the stem), res2"), std::string::npos) << error;

  auto refused_vit = [](const std::string& classifier, const std::string& feature) {
    return error_of([&] { tapping(vit_model(classifier), {feature}); });
  };
  error = refused_vit("token", "blkCLS3");
  EXPECT_NE(error.find("FeatureEvalOptions::taps[0] = blkCLS3"), std::string::npos) << error;
  EXPECT_NE(error.find("lastCLS, blkCLS0 .. blkCLS2, concatCLS1 .. concatCLS3"), std::string::npos)
      << error;
  EXPECT_NE(refused_vit("token", "concatCLS4").find("concatCLS1 .. concatCLS3"), std::string::npos);
  error = refused_vit("token", "lastPOOL");
  EXPECT_NE(
      error.find("concatPOOL<n> and stridePOOL_<count>[_<stride>] need no class token: "
                 "VitOptions::use_class_token false"),
      std::string::npos)
      << error;
  EXPECT_NE(
      refused_vit("token", "stridePOOL_2").find("lastBLK, concatBLK1 .. concatBLK3"),
      std::string::npos);
  for (const char* malformed : {"stridePOOL_0", "stridePOOL_2_0", "stridePOOL_", "stridePOOL_2_"}) {
    EXPECT_NE(
        refused_vit("gap", malformed).find("stridePOOL_<count>[_<stride>]"), std::string::npos)
        << malformed;
  }
  EXPECT_NE(refused_vit("gap", "concatBLK4").find("concatBLK1 .. concatBLK3"), std::string::npos);
  error = refused_vit("gap", "lastCLS");
  EXPECT_NE(error.find("lastPOOL, concatPOOL1 .. concatPOOL3"), std::string::npos) << error;
  EXPECT_NE(refused_vit("token", "res5").find("a vision_transformer feature"), std::string::npos);

  ModelOptions small;
  small.trunk_name = "small_cnn";
  error = error_of([&] { tapping(build_model(small), {"conv1"}); });
  EXPECT_NE(error.find("resnet, regnet, vision_transformer"), std::string::npos) << error;
  error = error_of([] { validate_tap_features({"conv1"}, "small_cnn"); });
  EXPECT_NE(error.find("ModelOptions::trunk_name = small_cnn"), std::string::npos) << error;
  EXPECT_NO_THROW(validate_tap_features({"res7", "avgpool"}, "regnet")); // stages: when built
  EXPECT_NO_THROW(validate_tap_features(
      {"concatCLS4", "blkCLS11", "lastPOOL", "lastBLK", "concatBLK12", "stridePOOL_4_3"},
      "vision_transformer"));
}

TEST(FeatureTapsTest, TheVitsFeaturesHaveNothingToPool) {
  TrunkHeadModel vit = vit_model("token");
  FeatureEvalOptions options;
  options.eval_mode_on = true;
  options.freeze_trunk_only = true;
  options.taps = {{"lastCLS", "AdaptiveAvgPool2d", {1}, 0, 0}};
  EvalHeadOptions head;
  head.in_channels = 32;
  head.dims = {32, 10};
  options.heads = {head};
  LinearEvalModel eval(vit, options);
  const std::string error = error_of([&] { eval->forward(torch::randn({2, 3, 32, 32})); });
  EXPECT_NE(error.find("Identity for feature lastCLS: it is [2, 32]"), std::string::npos) << error;
  // With Identity, VISSL's eval_mlp takes [b, d] as [b, d, 1, 1].
  options.taps[0].pool = "Identity";
  LinearEvalModel identity(vit, options);
  EXPECT_EQ(identity->forward(torch::randn({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 10}));
}

} // namespace
} // namespace largo::models::feature_taps_test
