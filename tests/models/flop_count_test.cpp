// Model FLOP counts: one hand count per layer type, and every zoo model against PyTorch's own
// count (torch.profiler with_flops, tests/reference/gen_flop_baselines.py ->
// tests/models/baselines/flop_baselines.json), per kind of layer and in total.
#include <largo/core/error.h>
#include <largo/models/flop_count.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>
#include <set>

#include "test_paths.h"

namespace largo::models::flop_count_test {
namespace {

TEST(FlopCountTest, ConvolutionByHand) {
  // ResNet-50's stem: 7x7/2 conv, 3 -> 64 channels, 224 -> 112: every one of the
  // 112 * 112 * 64 outputs takes 3 * 7 * 7 multiply-accumulates.
  EXPECT_EQ(conv_output_size(224, 7, 2, 3), 112);
  EXPECT_EQ(conv2d_flops({3, 64, 7, 1, 112, 112}), 2LL * 112 * 112 * 64 * 3 * 49);
  EXPECT_EQ(conv2d_flops({3, 64, 7, 1, 112, 112}), 236'027'904); // 118 M multiply-accumulates
  // Floor division of odd sizes: 7 -> 4 for a 3x3/2 conv with padding 1, 28 -> 14 -> 7 for
  // the max pool 3x3/2 (padding 1) after a 7x7/2 conv.
  EXPECT_EQ(conv_output_size(7, 3, 2, 1), 4);
  EXPECT_EQ(conv_output_size(conv_output_size(28, 7, 2, 3), 3, 2, 1), 7);
  // Grouped (ResNeXt 32x4d, first stage): each of 128 outputs sees 128 / 32 = 4 inputs.
  EXPECT_EQ(conv2d_flops({128, 128, 3, 32, 56, 56}), 2LL * 56 * 56 * 128 * 4 * 9);
}

TEST(FlopCountTest, LinearAndAttentionByHand) {
  EXPECT_EQ(linear_flops(2048, 1000), 2 * 2048 * 1000);            // ResNet-50's head, per image
  EXPECT_EQ(linear_flops(768, 2304, 197), 2LL * 197 * 768 * 2304); // ViT-B/16's qkv
  // ViT-B/16: 197 tokens, 12 heads of 64: q k^T is 12 x [197, 64] x [64, 197], weights v is
  // 12 x [197, 197] x [197, 64]; 197 * 197 * 64 multiply-accumulates each per head.
  EXPECT_EQ(attention_flops(197, 768), 2 * (2LL * 12 * 197 * 197 * 64));
}

// A RegNetY of two blocks on 16x16 images, counted by hand: stem_width 8, depth 2, w_0 16,
// w_a 0 (one stage of width 16), group_width 4, SE ratio 0.25, 10 classes.
TEST(FlopCountTest, RegNetByHand) {
  ModelOptions options;
  options.trunk_name = "regnet";
  options.in_channels = 3;
  options.image_size = 16;
  options.regnet.depth = 2;
  options.regnet.w_0 = 16;
  options.regnet.w_a = 0;
  options.regnet.w_m = 2;
  options.regnet.group_width = 4;
  options.regnet.stem_width = 8;
  const int64_t stem = 2 * 8 * 8 * 8 * 3 * 9; // 3x3/2: 16 -> 8, 8 channels
  // Block 1 (8 -> 16 channels, stride 2 on the 3x3 conv and the projection: 8 -> 4):
  const int64_t block1 = 2 * 4 * 4 * 16 * 8        // proj.0: 1x1/2
                         + 2 * 8 * 8 * 16 * 8      // f.a.0: 1x1 on the 8x8 map
                         + 2 * 4 * 4 * 16 * 4 * 9  // f.b.0: 3x3/2, 4 groups of 4 channels
                         + 2 * 16 * 2 + 2 * 2 * 16 // f.se: 16 -> round(0.25 * 8) = 2 -> 16
                         + 2 * 4 * 4 * 16 * 16;    // f.c.0: 1x1
  // Block 2 (16 -> 16, stride 1, identity shortcut):
  const int64_t block2 =
      2 * 4 * 4 * 16 * 16 + 2 * 4 * 4 * 16 * 4 * 9 + 2 * 16 * 4 + 2 * 4 * 16 + 2 * 4 * 4 * 16 * 16;
  const int64_t head = 2 * 16 * 10;
  const ModelFlops flops = count_model_flops(options);
  EXPECT_EQ(flops.forward_per_sample(), stem + block1 + block2 + head);
  EXPECT_EQ(flops.layers.front().name, "trunk.0.0");
  EXPECT_EQ(flops.layers[1].name, "trunk.1.proj.0");
  EXPECT_EQ(flops.layers[4].name, "trunk.1.f.se.fc1");
  // res_stem_in: 7x7/2 (16 -> 8), then the max pool (8 -> 4) before the blocks.
  options.regnet.stem_type = "res_stem_in";
  options.regnet.use_se = false;
  EXPECT_EQ(count_model_flops(options).layers.front().forward_flops, 2 * 8 * 8 * 8 * 3 * 49);
  EXPECT_EQ(count_model_flops(options).layers[2].forward_flops, 2 * 4 * 4 * 16 * 8); // f.a.0
}

// An MLP 784 -> 512 -> 256 on 28x28 grayscale images, with a Linear(256 -> 10) head.
ModelOptions mlp_on_28x28() {
  ModelOptions options;
  options.trunk_name = "mlp";
  options.in_channels = 1;
  options.image_size = 28;
  options.mlp.hidden_dims = {512, 256};
  return options;
}

TEST(FlopCountTest, TrainingIsThreeForwards) {
  const ModelOptions options = mlp_on_28x28();
  const ModelFlops flops = count_model_flops(options);
  const int64_t forward = 2 * (784 * 512 + 512 * 256 + 256 * 10);
  EXPECT_EQ(flops.forward_per_sample(), forward);
  EXPECT_EQ(flops.training_per_sample(), 3 * forward);
  EXPECT_EQ(training_flops_per_sample(options), 3 * forward);
}

// A linear evaluation: the frozen trunk forward only, up to the deepest tap; the trained heads
// three times (forward and backward), frozen heads once.
TEST(FlopCountTest, LinearEvaluationRunsTheFrozenTrunkForwardOnly) {
  ModelOptions options = mlp_on_28x28();
  options.feature_eval.eval_mode_on = true;
  options.feature_eval.freeze_trunk_only = true;
  const int64_t trunk = 2 * (784 * 512 + 512 * 256);
  EXPECT_EQ(linear_eval_training_flops_per_sample(options, 2), trunk + 3 * 2 * 256 * 10);
  options.feature_eval.freeze_trunk_only = false;
  options.feature_eval.freeze_trunk_and_head = true;
  EXPECT_EQ(linear_eval_training_flops_per_sample(options, 2), trunk + 2 * 256 * 10);
  // One tap after the first block, with a head of two Linear layers.
  options.feature_eval.freeze_trunk_and_head = false;
  options.feature_eval.freeze_trunk_only = true;
  options.feature_eval.taps = {FeatureTap{"res1"}};
  EvalHeadOptions head;
  head.name = "mlp";
  head.dims = {512, 64, 10};
  options.feature_eval.heads = {head};
  EXPECT_EQ(
      linear_eval_training_flops_per_sample(options, 1),
      2 * 784 * 512 + 3 * 2 * (512 * 64 + 64 * 10));
}

TEST(FlopCountTest, MlpHeadCountsEachLinear) {
  ModelOptions options;
  options.trunk_name = "small_cnn";
  options.in_channels = 1;
  options.image_size = 28;
  const int64_t linear_head = count_model_flops(options).forward_per_sample();
  options.head_dims = {576, 128, 10};
  options.head.use_bn = true;
  options.head.use_relu = true;
  const ModelFlops flops = count_model_flops(options);
  EXPECT_EQ(
      flops.forward_per_sample() - linear_head,
      linear_flops(576, 128) + linear_flops(128, 10) - linear_flops(576, 10));
  EXPECT_EQ(flops.layers.back().name, "head.3"); // Linear, BN, ReLU, Linear
}

TEST(FlopCountTest, UnknownTrunkIsAConfigError) {
  ModelOptions options;
  options.trunk_name = "alexnet";
  EXPECT_THROW(count_model_flops(options), ConfigError);
  options.trunk_name = "resnet";
  options.resnet.depth = 42;
  EXPECT_THROW(count_model_flops(options), ConfigError);
}

ModelOptions options_of(const nlohmann::json& json) {
  ModelOptions options;
  options.trunk_name = json.at("trunk");
  options.in_channels = json.at("in_channels");
  options.image_size = json.at("image_size");
  options.num_classes = json.at("num_classes");
  if (json.contains("resnet")) {
    const auto& r = json["resnet"];
    options.resnet.depth = r.at("depth");
    options.resnet.stem = r.at("stem");
    options.resnet.groups = r.value("groups", int64_t{1});
    options.resnet.width_per_group = r.value("width_per_group", int64_t{64});
    options.resnet.layer4_stride = r.value("layer4_stride", int64_t{2});
  }
  if (json.contains("regnet")) {
    const auto& r = json["regnet"];
    if (r.contains("name")) {
      options.regnet = regnet_preset(r["name"]);
    } else {
      options.regnet.depth = r.at("depth");
      options.regnet.w_0 = r.at("w_0");
      options.regnet.w_a = r.at("w_a");
      options.regnet.w_m = r.at("w_m");
      options.regnet.group_width = r.at("group_width");
      options.regnet.stem_width = r.at("stem_width");
    }
  }
  if (json.contains("small_cnn")) {
    options.small_cnn.channels = json["small_cnn"].at("channels").get<std::vector<int64_t>>();
    options.small_cnn.pooled_size = json["small_cnn"].at("pooled_size");
  }
  if (json.contains("mlp")) {
    options.mlp.hidden_dims = json["mlp"].at("hidden_dims").get<std::vector<int64_t>>();
  }
  if (json.contains("vit")) {
    const auto& v = json["vit"];
    options.vit.patch_size = v.at("patch_size");
    options.vit.num_layers = v.at("num_layers");
    options.vit.num_heads = v.at("num_heads");
    options.vit.hidden_dim = v.at("hidden_dim");
    options.vit.mlp_dim = v.at("mlp_dim");
    options.vit.classifier = v.at("classifier");
    options.vit.qkv_bias = v.at("qkv_bias");
  }
  return options;
}

// Largo's layers grouped like the profiler's ops: convolutions, Linear layers, attention.
// (A RegNet trunk is convolutions only, named as torchvision's: f.a.0, proj.0, f.se.fc1, ...)
std::map<std::string, int64_t> by_kind(const ModelFlops& flops, const std::string& trunk) {
  std::map<std::string, int64_t> kinds{{"conv", 0}, {"linear", 0}, {"attention", 0}};
  for (const LayerFlops& layer : flops.layers) {
    const std::string& name = layer.name;
    const bool conv = name.find("conv") != std::string::npos ||
                      name.find("downsample") != std::string::npos ||
                      (trunk == "regnet" && name.rfind("trunk.", 0) == 0);
    const bool attention = name.size() >= 9 && name.substr(name.size() - 9) == "attention";
    kinds[conv ? "conv" : attention ? "attention" : "linear"] += layer.forward_flops;
  }
  return kinds;
}

TEST(FlopCountTest, EveryZooModelMatchesPytorchsProfilerCount) {
  std::ifstream in(
      std::string(largo::test_paths::data_dir()) + "/models/baselines/flop_baselines.json");
  ASSERT_TRUE(in.good()) << "missing flop_baselines.json; run " LARGO_PYTHON
                            " tests/reference/gen_flop_baselines.py";
  const nlohmann::json baselines = nlohmann::json::parse(in);
  ASSERT_GE(baselines.at("cases").size(), 23u);
  for (const auto& entry : baselines["cases"]) {
    const std::string name = entry.at("name");
    const ModelOptions options = options_of(entry.at("options"));
    const ModelFlops flops = count_model_flops(options);
    const auto kinds = by_kind(flops, options.trunk_name);
    const auto& expected = entry.at("forward_flops");
    for (const char* kind : {"conv", "linear", "attention"}) {
      EXPECT_EQ(kinds.at(kind), expected.at(kind).get<int64_t>()) << name << ": " << kind;
    }
    EXPECT_EQ(flops.forward_per_sample(), expected.at("total").get<int64_t>()) << name;
  }
}

// The count names a real module for each convolution and Linear layer of the built model,
// and no other: a layer added to a model but not to its count fails here.
TEST(FlopCountTest, CountsEveryConvAndLinearModuleOnce) {
  std::vector<ModelOptions> models(6);
  models[0].trunk_name = "small_cnn";
  models[1].trunk_name = "mlp";
  models[2].trunk_name = "resnet";
  models[2].resnet.depth = 50;
  models[3].trunk_name = "vision_transformer";
  models[3].vit = {0, 4, 2, 2, 32, 64};
  models[4].trunk_name = "regnet";
  models[4].regnet = regnet_preset("regnet_y_400mf");
  models[5].trunk_name = "regnet";
  models[5].regnet = regnet_preset("regnet_x_400mf");
  models[5].regnet.stem_type = "res_stem_in";
  for (const ModelOptions& options : models) {
    std::set<std::string> modules;
    for (const auto& item : build_model(options)->named_modules()) {
      if (item.value()->as<torch::nn::Conv2d>() || item.value()->as<torch::nn::Linear>()) {
        modules.insert(item.key());
      }
    }
    std::set<std::string> counted;
    for (const LayerFlops& layer : count_model_flops(options).layers) {
      if (layer.name.find("attention") == std::string::npos) {
        EXPECT_TRUE(counted.insert(layer.name).second) << layer.name << " counted twice";
      }
    }
    EXPECT_EQ(counted, modules) << options.trunk_name;
  }
}

TEST(FlopCountTest, FormatsCountsWithAnSiPrefix) {
  EXPECT_EQ(format_flops(0), "0 FLOP");
  EXPECT_EQ(format_flops(999), "999 FLOP");
  EXPECT_EQ(format_flops(11546112), "11.5 MFLOP");
  EXPECT_EQ(format_flops(999.9e6), "1 GFLOP"); // rounds up into the next prefix
  EXPECT_EQ(format_flops(7.11e10), "71.1 GFLOP");
  EXPECT_EQ(format_flops(2.5e21), "2.5e+03 EFLOP"); // past the last prefix
}

} // namespace
} // namespace largo::models::flop_count_test
