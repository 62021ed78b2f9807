// RegNet trunks: ClassyVision's stage widths for every preset, torchvision's parameters and
// names (tests/reference/gen_regnet_baselines.py -> tests/models/baselines/
// regnet_baselines.json), one trunk block per RegNet block, and the options' errors.
// (Numerical parity with torchvision: tests/checkpoint/weights_init_test.cpp.)
#include "models/model_test_util.h"
#include "test_paths.h"

#include <largo/models/model_factory.h>
#include <largo/models/module_swap.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <set>

namespace largo::models::regnet_test {
namespace {

using testing::error_of;

const nlohmann::json& baselines() {
  static const nlohmann::json json = [] {
    std::ifstream in(
        std::string(largo::test_paths::data_dir()) + "/models/baselines/regnet_baselines.json");
    EXPECT_TRUE(in.good()) << "missing regnet_baselines.json; run " LARGO_PYTHON
                              " tests/reference/gen_regnet_baselines.py";
    return nlohmann::json::parse(in);
  }();
  return json;
}

ModelOptions regnet_model(const RegNetOptions& regnet, int64_t num_classes, int64_t image_size) {
  ModelOptions options;
  options.trunk_name = "regnet";
  options.in_channels = 3;
  options.image_size = image_size;
  options.num_classes = num_classes;
  options.regnet = regnet;
  return options;
}

// depth 6, w_0 8, w_a 8, w_m 2, group width 4, stem width 8: stages [8, 16, 32, 64] of
// [1, 1, 3, 1] blocks (the weights-init parity model).
RegNetOptions small_regnet() {
  RegNetOptions options;
  options.depth = 6;
  options.w_0 = 8;
  options.w_a = 8;
  options.w_m = 2;
  options.group_width = 4;
  options.stem_width = 8;
  return options;
}

TEST(RegNet, PresetsHaveClassyVisionsStages) {
  const auto& presets = baselines().at("presets");
  ASSERT_EQ(presets.size(), regnet_preset_names().size());
  for (const auto& preset : presets) {
    const std::string name = preset.at("name");
    SCOPED_TRACE(name);
    std::vector<int64_t> widths, depths, group_widths;
    for (const RegNetStageSpec& stage : regnet_stages(regnet_preset(name))) {
      widths.push_back(stage.width);
      depths.push_back(stage.depth);
      group_widths.push_back(stage.group_width);
      EXPECT_EQ(stage.stride, 2);
    }
    EXPECT_EQ(widths, preset.at("widths").get<std::vector<int64_t>>());
    EXPECT_EQ(depths, preset.at("depths").get<std::vector<int64_t>>());
    EXPECT_EQ(group_widths, preset.at("group_widths").get<std::vector<int64_t>>());
  }
}

// torchvision's spelling names the same preset; the X presets have no SE.
TEST(RegNet, PresetNamesInBothSpellings) {
  EXPECT_EQ(regnet_stages(regnet_preset("regnet_y_1_6gf")).back().width, 888);
  EXPECT_EQ(regnet_stages(regnet_preset("regnet_y_1.6gf")).back().width, 888);
  EXPECT_FALSE(regnet_preset("regnet_x_3_2gf").use_se);
  EXPECT_TRUE(regnet_preset("regnet_y_256gf").use_se);
  try {
    regnet_preset("regnet_y_42gf");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("RegNetOptions::name = regnet_y_42gf"), std::string::npos);
    EXPECT_NE(message.find("regnet_y_128gf"), std::string::npos) << message;
  }
}

// Built models (presets up to ~20 M parameters, to keep the test fast) have the parameter
// count of torchvision's RegNet class with the same stages and a 1000-class Linear head; the
// larger presets' stages are checked above.
TEST(RegNet, ParameterCountsEqualTorchvision) {
  int64_t built = 0;
  for (const auto& preset : baselines().at("presets")) {
    const int64_t expected = preset.at("num_parameters");
    if (expected > 20'000'000) {
      continue;
    }
    const std::string name = preset.at("name");
    TrunkHeadModel model = build_model(regnet_model(regnet_preset(name), 1000, 224));
    EXPECT_EQ(count_parameters(*model), expected) << name;
    if (preset.contains("torchvision") &&
        preset["torchvision"].at("widths") == preset.at("widths")) {
      // torchvision's own constructor agrees (all but regnet_y_800mf, _8gf, regnet_x_400mf)
      EXPECT_EQ(count_parameters(*model), preset["torchvision"].at("num_parameters").get<int64_t>())
          << name;
    }
    ++built;
  }
  EXPECT_GE(built, 8);
}

// torchvision's float32 widths differ from ClassyVision's (VISSL's) for three presets; Largo
// builds ClassyVision's (its comments: "Output size: 768 feature maps" for regnet_y_800mf).
TEST(RegNet, FollowsClassyVisionWhereTorchvisionsWidthsDiffer) {
  std::set<std::string> differ;
  for (const auto& preset : baselines().at("presets")) {
    if (preset.contains("torchvision") &&
        preset["torchvision"].at("widths") != preset.at("widths")) {
      differ.insert(preset.at("name").get<std::string>());
    }
  }
  EXPECT_EQ(differ, (std::set<std::string>{"regnet_y_800mf", "regnet_y_8gf", "regnet_x_400mf"}));
  EXPECT_EQ(regnet_stages(regnet_preset("regnet_y_800mf")).back().width, 768);
}

TEST(RegNet, TorchvisionNamesMapOntoLargosOneToOne) {
  const RegNetOptions options = regnet_preset("regnet_y_400mf");
  TrunkHeadModel model = build_model(regnet_model(options, 1000, 224));
  std::map<std::string, at::Tensor> largo;
  for (const auto& item : model->named_parameters()) {
    largo.emplace(item.key(), item.value());
  }
  for (const auto& item : model->named_buffers()) {
    largo.emplace(item.key(), item.value());
  }
  std::set<std::string> mapped;
  for (const auto& entry : baselines().at("regnet_y_400mf_state_dict")) {
    const std::string torchvision = entry[0];
    const std::string name = regnet_name_from_torchvision(torchvision, options);
    ASSERT_EQ(largo.count(name), 1u) << torchvision << " -> " << name;
    EXPECT_EQ(largo.at(name).sizes().vec(), entry[1].get<std::vector<int64_t>>()) << name;
    EXPECT_TRUE(mapped.insert(name).second) << name << " twice";
  }
  EXPECT_EQ(mapped.size(), largo.size());
}

// VISSL's regnet trunk holds ClassyVision's modules: the stem as conv1.stem, each stage as
// res<r> with blocks block<s>-<i>, and ClassyVision's names inside a block.
TEST(RegNet, VisslNamesMapOntoLargos) {
  const RegNetOptions options = regnet_preset("regnet_y_400mf"); // stages of 1, 3, 6, 6
  const std::map<std::string, std::string> cases{
      {"trunk._feature_blocks.conv1.stem.0.weight", "trunk.0.0.weight"},
      {"trunk._feature_blocks.conv1.stem.1.running_var", "trunk.0.1.running_var"},
      {"trunk._feature_blocks.res2.block1-0.proj.weight", "trunk.1.proj.0.weight"},
      {"trunk._feature_blocks.res2.block1-0.bn.bias", "trunk.1.proj.1.bias"},
      {"trunk._feature_blocks.res3.block2-2.f.a.0.weight", "trunk.4.f.a.0.weight"},
      {"trunk._feature_blocks.res4.block3-0.f.b.1.running_mean", "trunk.5.f.b.1.running_mean"},
      {"trunk._feature_blocks.res5.block4-5.f.se.excitation.0.bias", "trunk.16.f.se.fc1.bias"},
      {"trunk._feature_blocks.res5.block4-5.f.se.excitation.2.weight", "trunk.16.f.se.fc2.weight"},
      {"trunk._feature_blocks.res5.block4-5.f.c.weight", "trunk.16.f.c.0.weight"},
      {"trunk._feature_blocks.res5.block4-5.f.final_bn.weight", "trunk.16.f.c.1.weight"},
      // torchvision's, and names outside the model, for contrast
      {"trunk_output.block4.block4-5.f.c.1.weight", "trunk.16.f.c.1.weight"},
      {"trunk_output.block4.block4-6.f.c.1.weight", "trunk_output.block4.block4-6.f.c.1.weight"},
      {"trunk._feature_blocks.res6.block5-0.f.a.0.weight",
       "trunk._feature_blocks.res6.block5-0.f.a.0.weight"},
  };
  for (const auto& [vissl, largo] : cases) {
    EXPECT_EQ(regnet_name_from_torchvision(vissl, options), largo) << vissl;
  }
}

TEST(RegNet, OneTrunkBlockPerRegNetBlockPlusStemAndPool) {
  for (const char* preset : {"regnet_y_400mf", "regnet_x_800mf"}) {
    const RegNetOptions options = regnet_preset(preset);
    int64_t blocks = 0;
    for (const RegNetStageSpec& stage : regnet_stages(options)) {
      blocks += stage.depth;
    }
    TrunkHeadModel model = build_model(regnet_model(options, 10, 32));
    EXPECT_EQ(model->num_trunk_blocks(), 1 + blocks + 1) << preset;
    EXPECT_NE(model->trunk_block(0)->as<RegNetStemImpl>(), nullptr);
    for (int64_t k = 1; k <= blocks; ++k) {
      EXPECT_NE(model->trunk_block(k)->as<RegNetBlockImpl>(), nullptr) << k;
    }
    EXPECT_NE(model->trunk_block(blocks + 1)->as<GlobalAvgPoolImpl>(), nullptr);
    EXPECT_EQ(model->trunk_output_dim(), regnet_stages(options).back().width);
  }
}

// What activation checkpointing, FSDP units and pipeline stages rely on: running the trunk
// in two ranges cut at any block boundary is running it whole.
TEST(RegNet, ForwardOverBlockRangesComposes) {
  torch::manual_seed(0);
  TrunkHeadModel model = build_model(regnet_model(small_regnet(), 10, 32));
  model->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor images = torch::randn({2, 3, 32, 32});
  const at::Tensor whole = model->forward_trunk(images);
  ASSERT_EQ(whole.sizes().vec(), (std::vector<int64_t>{2, 64}));
  const int64_t n = model->num_trunk_blocks();
  EXPECT_EQ(n, 1 + 6 + 1);
  for (int64_t cut = 0; cut <= n; ++cut) {
    const at::Tensor first = model->forward_trunk_range(images, 0, cut);
    EXPECT_TRUE(torch::equal(model->forward_trunk_range(first, cut, n), whole)) << cut;
  }
  // 32 -> 16 (stem) -> 8 -> 4 -> 2 -> 1: each stage's first block halves the map.
  EXPECT_EQ(
      model->forward_trunk_range(images, 0, 1).sizes().vec(), (std::vector<int64_t>{2, 8, 16, 16}));
  EXPECT_EQ(
      model->forward_trunk_range(images, 0, 7).sizes().vec(), (std::vector<int64_t>{2, 64, 1, 1}));
}

// Block shapes: the projection only where the shape changes, SE on the block input's width,
// grouped 3x3 convs, and the stems' strides.
TEST(RegNet, BlockSpecsAndStems) {
  const std::vector<RegNetBlockSpec> blocks = regnet_blocks(small_regnet());
  ASSERT_EQ(blocks.size(), 6u);
  EXPECT_EQ(blocks[0].in_channels, 8);
  EXPECT_EQ(blocks[0].stride, 2);
  EXPECT_TRUE(blocks[0].projection()); // 8 -> 8 channels, but stride 2
  EXPECT_EQ(blocks[3].in_channels, 32);
  EXPECT_FALSE(blocks[3].projection());
  EXPECT_EQ(blocks[5].groups, 64 / 4);
  EXPECT_EQ(blocks[5].se_width, 8); // round(0.25 * 32)
  RegNetOptions no_se = small_regnet();
  no_se.use_se = false;
  EXPECT_EQ(regnet_blocks(no_se)[5].se_width, 0);

  const at::Tensor images = torch::randn({1, 3, 32, 32});
  for (const auto& [stem, side] : std::map<std::string, int64_t>{
           {"simple_stem_in", 16}, {"res_stem_in", 8}, {"res_stem_cifar", 32}}) {
    RegNetOptions options = small_regnet();
    options.stem_type = stem;
    options.activation = "silu";
    TrunkHeadModel model = build_model(regnet_model(options, 10, 32));
    model->eval(); // one image: BatchNorm on a 1x1 map needs running statistics
    EXPECT_EQ(
        model->forward_trunk_range(images, 0, 1).sizes().vec(),
        (std::vector<int64_t>{1, 8, side, side}))
        << stem;
    EXPECT_EQ(model->forward(images).sizes().vec(), (std::vector<int64_t>{1, 10})) << stem;
  }
}

// ClassyVision's init: convs N(0, sqrt(2 / (k * k * out))), BN weight 1 bias 0, and
// bn_epsilon / bn_momentum reach every BatchNorm.
TEST(RegNet, InitializationAndBatchNormSettings) {
  torch::manual_seed(0);
  RegNetOptions options = regnet_preset("regnet_y_400mf");
  options.bn_epsilon = 1e-3;
  options.bn_momentum = 0.05;
  TrunkHeadModel model = build_model(regnet_model(options, 10, 32));
  int64_t norms = 0;
  for (const auto& item : model->named_modules()) {
    if (auto* bn = item.value()->as<torch::nn::BatchNorm2d>()) {
      EXPECT_EQ(bn->options.eps(), 1e-3) << item.key();
      EXPECT_EQ(bn->options.momentum().value(), 0.05) << item.key();
      EXPECT_TRUE(torch::equal(bn->weight, torch::ones_like(bn->weight)));
      ++norms;
    }
  }
  EXPECT_GT(norms, 40);
  // The last stage's 1x1 "c" conv: 440 x 440 weights, std sqrt(2 / 440).
  auto* conv = model->trunk_block(16)->named_modules()["f.c.0"]->as<torch::nn::Conv2d>();
  ASSERT_NE(conv, nullptr);
  // 193,600 samples: the sample std is within 1 % of the true one (its relative error is
  // about 1 / sqrt(2 n) = 0.16 %).
  EXPECT_NEAR(conv->weight.std().item<double>(), std::sqrt(2.0 / 440), 0.01 * std::sqrt(2.0 / 440));
}

// SyncBatchNorm conversion swaps every BatchNorm2d: the stem and ConvNormActivation let it.
TEST(RegNet, EveryBatchNormCanBeSwapped) {
  TrunkHeadModel model = build_model(regnet_model(small_regnet(), 10, 32));
  int64_t swapped = 0;
  auto root = swap_modules(model.ptr(), [&](const std::string&, torch::nn::Module& module) {
    auto* bn = module.as<torch::nn::BatchNorm2d>();
    if (bn == nullptr) {
      return torch::nn::AnyModule();
    }
    ++swapped;
    return torch::nn::AnyModule(torch::nn::BatchNorm2d(bn->options));
  });
  EXPECT_EQ(root, model.ptr());
  EXPECT_EQ(swapped, 1 + 4 + 6 * 3); // stem, 4 projections, a / b / c of 6 blocks
  EXPECT_EQ(
      model->forward(torch::randn({2, 3, 32, 32})).sizes().vec(), (std::vector<int64_t>{2, 10}));
}

// ClassyVision's RegNet is AnyNet over the ramp's stages, so RegNetOptions::stages holding a
// preset's stages builds the preset's trunk: the same blocks, and with the same seed the same
// tensors and outputs. Every block says whether it starts a stage, a stride-1 stage included.
TEST(RegNet, AnyNetStagesBuildThePresetsTrunk) {
  const RegNetOptions preset = regnet_preset("regnet_y_400mf");
  RegNetOptions anynet;
  anynet.stages = regnet_stages(preset);
  const std::vector<RegNetBlockSpec> expected = regnet_blocks(preset);
  const std::vector<RegNetBlockSpec> blocks = regnet_blocks(anynet);
  ASSERT_EQ(blocks.size(), expected.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(blocks[i].in_channels, expected[i].in_channels) << i;
    EXPECT_EQ(blocks[i].out_channels, expected[i].out_channels) << i;
    EXPECT_EQ(blocks[i].stride, expected[i].stride) << i;
    EXPECT_EQ(blocks[i].bottleneck_width, expected[i].bottleneck_width) << i;
    EXPECT_EQ(blocks[i].groups, expected[i].groups) << i;
    EXPECT_EQ(blocks[i].se_width, expected[i].se_width) << i;
    EXPECT_EQ(blocks[i].starts_stage, expected[i].starts_stage) << i;
    EXPECT_EQ(blocks[i].starts_stage, blocks[i].stride == 2) << i; // the ramp's stages
  }
  torch::manual_seed(3);
  TrunkHeadModel from_preset = build_model(regnet_model(preset, 10, 32));
  torch::manual_seed(3);
  TrunkHeadModel from_stages = build_model(regnet_model(anynet, 10, 32));
  const auto expected_tensors = from_preset->named_parameters();
  for (const auto& item : from_stages->named_parameters()) {
    ASSERT_TRUE(expected_tensors.contains(item.key())) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), expected_tensors[item.key()])) << item.key();
  }
  from_preset->eval();
  from_stages->eval();
  const at::Tensor images = torch::randn({2, 3, 32, 32});
  EXPECT_TRUE(torch::equal(from_stages->forward(images), from_preset->forward(images)));

  RegNetOptions same_size; // a second stage that keeps the map's size still starts a stage
  same_size.stages = {{16, 1, 2, 8, 1.0}, {24, 2, 1, 8, 1.0}};
  const std::vector<RegNetBlockSpec> kept = regnet_blocks(same_size);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_TRUE(kept[1].starts_stage);
  EXPECT_EQ(kept[1].stride, 1);
  EXPECT_FALSE(kept[2].starts_stage);
  EXPECT_EQ(kept[1].groups, 24 / 8);
}

TEST(RegNet, RejectsBadOptionsNamingTheKey) {
  auto error_for = [](auto change) {
    RegNetOptions options = small_regnet();
    change(options);
    return error_of(regnet_model(options, 10, 32));
  };
  const std::vector<std::pair<std::string, std::string>> cases{
      {error_for([](RegNetOptions& o) { o.w_0 = 12; }), "RegNetOptions::w_0 = 12"},
      {error_for([](RegNetOptions& o) { o.w_m = 1; }), "RegNetOptions::w_m = 1"},
      {error_for([](RegNetOptions& o) { o.w_a = -1; }), "RegNetOptions::w_a = -1"},
      {error_for([](RegNetOptions& o) { o.depth = -3; }), "RegNetOptions::depth = -3"},
      {error_for([](RegNetOptions& o) { o.group_width = 0; }), "RegNetOptions::group_width = 0"},
      {error_for([](RegNetOptions& o) { o.stem_type = "res_stem"; }),
       "RegNetOptions::stem_type = res_stem"},
      {error_for([](RegNetOptions& o) { o.block_type = "vanilla_block"; }),
       "RegNetOptions::block_type = vanilla_block: expected res_bottleneck_block"},
      {error_for([](RegNetOptions& o) { o.activation = "gelu"; }),
       "RegNetOptions::activation = gelu: expected relu or silu"},
      {error_for([](RegNetOptions& o) { o.se_ratio = 0.01; }), "RegNetOptions::se_ratio = 0.01"},
      {error_for([](RegNetOptions& o) { o.bn_momentum = 2; }), "RegNetOptions::bn_momentum = 2"},
      {error_for([](RegNetOptions& o) { o.bn_epsilon = 0; }), "RegNetOptions::bn_epsilon = 0"},
      {error_for([](RegNetOptions& o) { o = RegNetOptions{}; }), "no RegNet is set"},
      {error_for([](RegNetOptions& o) {
         o.stages = {{16, 1, 2, 8, 1.0}};
       }),
       "RegNetOptions::stages = 1 stages: expected stages alone"},
      {error_for([](RegNetOptions& o) {
         o = RegNetOptions{};
         o.stages = {{16, 0, 2, 8, 1.0}};
       }),
       "RegNetOptions::stages[0].depth = 0"},
      {error_for([](RegNetOptions& o) {
         o = RegNetOptions{};
         o.stages = {{16, 1, 2, 8, 1.0}, {24, 1, 2, 32, 1.0}};
       }),
       "RegNetOptions::stages[1].group_width = 32: expected a group width that splits the "
       "bottleneck width 24"},
  };
  for (const auto& [message, expected] : cases) {
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

} // namespace
} // namespace largo::models::regnet_test
