// ResNet trunks: shapes for both stems, block layout, parameter counts of every depth
// (torchvision's), initialization and option validation.
#include "model_test_util.h"

#include <largo/models/model_factory.h>

#include <largo/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

namespace largo::models::resnet_test {
namespace {

ModelOptions resnet_options(int64_t depth, const std::string& stem, int64_t num_classes = 10) {
  ModelOptions options;
  options.trunk_name = "resnet";
  options.in_channels = 3;
  options.image_size = stem == "cifar" ? 16 : 64;
  options.num_classes = num_classes;
  options.resnet.depth = depth;
  options.resnet.stem = stem;
  return options;
}

using testing::error_of;

struct ShapeCase {
  int64_t depth;
  const char* stem;
  int64_t image_size;
  int64_t final_map; // spatial size of the last stage's output
};

class ResNetShapes : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(ResNetShapes, TrunkAndHeadShapes) {
  const ShapeCase c = GetParam();
  torch::manual_seed(0);
  ModelOptions options = resnet_options(c.depth, c.stem);
  TrunkHeadModel model = build_model(options);
  const int64_t features = c.depth < 50 ? 512 : 2048;
  EXPECT_EQ(model->trunk_output_dim(), features);

  at::Tensor images = torch::randn({2, 3, c.image_size, c.image_size});
  torch::NoGradGuard no_grad;
  model->eval();
  // The last residual block's output still has its spatial map; the pool block removes it.
  const int64_t n = model->num_trunk_blocks();
  at::Tensor maps = model->forward_trunk_range(images, 0, n - 1);
  EXPECT_EQ(maps.sizes().vec(), (std::vector<int64_t>{2, features, c.final_map, c.final_map}));
  EXPECT_EQ(model->forward_trunk(images).sizes().vec(), (std::vector<int64_t>{2, features}));
  EXPECT_EQ(model->forward(images).sizes().vec(), (std::vector<int64_t>{2, 10}));
}

INSTANTIATE_TEST_SUITE_P(
    Stems,
    ResNetShapes,
    ::testing::Values(
        ShapeCase{18, "imagenet", 64, 2}, // 64 /2 (conv) /2 (pool) /2 /2 /2 = 2
        ShapeCase{18, "cifar", 16, 2},    // 16 /2 /2 /2 = 2
        ShapeCase{50, "imagenet", 64, 2},
        ShapeCase{50, "cifar", 16, 2}));

TEST(ResNet, StemBlockShapes) {
  at::Tensor images = torch::randn({1, 3, 20, 20});
  torch::NoGradGuard no_grad;
  TrunkHeadModel imagenet = build_model(resnet_options(18, "imagenet"));
  EXPECT_EQ(
      imagenet->forward_trunk_range(images, 0, 1).sizes().vec(),
      (std::vector<int64_t>{1, 64, 5, 5})); // 7x7/2 conv (20 -> 10) then 3x3/2 max pool (-> 5)
  TrunkHeadModel cifar = build_model(resnet_options(18, "cifar"));
  EXPECT_EQ(
      cifar->forward_trunk_range(images, 0, 1).sizes().vec(),
      (std::vector<int64_t>{1, 64, 20, 20})); // 3x3/1 conv, no pool
}

TEST(ResNet, OneTrunkBlockPerResidualBlockPlusStemAndPool) {
  for (auto [depth, residual_blocks] : {std::pair<int64_t, int64_t>{18, 8}, {34, 16}, {50, 16}}) {
    TrunkHeadModel model = build_model(resnet_options(depth, "cifar"));
    EXPECT_EQ(model->num_trunk_blocks(), residual_blocks + 2) << "depth " << depth;
    EXPECT_NE(model->trunk_block(0)->as<ResNetStemImpl>(), nullptr);
    EXPECT_NE(model->trunk_block(model->num_trunk_blocks() - 1)->as<GlobalAvgPoolImpl>(), nullptr);
    if (depth < 50) {
      EXPECT_NE(model->trunk_block(1)->as<BasicBlockImpl>(), nullptr);
    } else {
      EXPECT_NE(model->trunk_block(1)->as<BottleneckImpl>(), nullptr);
    }
  }
}

// torchvision.models.resnetXX(num_classes=1000) parameter counts.
TEST(ResNet, ParameterCountsEqualTorchvision) {
  const std::pair<int64_t, int64_t> expected[] = {
      {18, 11'689'512}, {34, 21'797'672}, {50, 25'557'032}, {101, 44'549'160}, {152, 60'192'808}};
  for (auto [depth, count] : expected) {
    EXPECT_EQ(count_parameters(*build_model(resnet_options(depth, "imagenet", 1000))), count)
        << "ResNet-" << depth;
  }
}

TEST(ResNet, CifarStemCountDiffersOnlyByTheFirstConv) {
  // 7x7x3x64 -> 3x3x3x64 weights.
  const int64_t imagenet = count_parameters(*build_model(resnet_options(18, "imagenet", 1000)));
  const int64_t cifar = count_parameters(*build_model(resnet_options(18, "cifar", 1000)));
  EXPECT_EQ(imagenet - cifar, (49 - 9) * 3 * 64);
}

TEST(ResNet, ResNeXtGroupsMatchTorchvision) {
  ModelOptions options = resnet_options(50, "imagenet", 1000);
  options.resnet.groups = 32;
  options.resnet.width_per_group = 4;
  EXPECT_EQ(count_parameters(*build_model(options)), 25'028'904); // resnext50_32x4d
}

TEST(ResNet, WidthMultiplierWidensStemAndStages) {
  ModelOptions options = resnet_options(18, "cifar");
  options.resnet.width_multiplier = 2;
  TrunkHeadModel model = build_model(options);
  EXPECT_EQ(model->trunk_output_dim(), 1024);
  EXPECT_EQ(
      model->named_parameters()["trunk.0.conv1.weight"].sizes().vec(),
      (std::vector<int64_t>{128, 3, 3, 3}));
  torch::NoGradGuard no_grad;
  EXPECT_EQ(
      model->forward(torch::randn({2, 3, 8, 8})).sizes().vec(), (std::vector<int64_t>{2, 10}));
}

TEST(ResNet, InputChannels) {
  ModelOptions options = resnet_options(18, "cifar");
  options.in_channels = 1;
  TrunkHeadModel model = build_model(options);
  EXPECT_EQ(model->named_parameters()["trunk.0.conv1.weight"].size(1), 1);
  torch::NoGradGuard no_grad;
  EXPECT_EQ(
      model->forward(torch::randn({2, 1, 12, 12})).sizes().vec(), (std::vector<int64_t>{2, 10}));
}

TEST(ResNet, InitializationLikeTorchvision) {
  torch::manual_seed(0);
  TrunkHeadModel model = build_model(resnet_options(50, "imagenet"));
  auto params = model->named_parameters();
  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (out_channels * k * k)).
  // layer3's 3x3 conv: [256, 256, 3, 3] -> std sqrt(2 / 2304) ~ 0.0295, 589,824 samples.
  at::Tensor conv = params["trunk.8.conv2.weight"];
  ASSERT_EQ(conv.sizes().vec(), (std::vector<int64_t>{256, 256, 3, 3}));
  EXPECT_NEAR(conv.std().item<double>(), std::sqrt(2.0 / (256 * 9)), 0.01 * std::sqrt(2.0 / 2304));
  EXPECT_NEAR(conv.mean().item<double>(), 0.0, 1e-3);
  for (const auto& item : params) {
    const std::string& name = item.key();
    if (name.find("bn") != std::string::npos || name.find("downsample.1") != std::string::npos) {
      const double expected = name.ends_with("weight") ? 1.0 : 0.0;
      EXPECT_TRUE(item.value().eq(expected).all().item<bool>()) << name;
    }
  }
}

TEST(ResNet, ZeroInitResidualZeroesTheLastNormOfEachBlock) {
  for (int64_t depth : {18, 50}) {
    ModelOptions options = resnet_options(depth, "cifar");
    options.resnet.zero_init_residual = true;
    TrunkHeadModel model = build_model(options);
    const std::string last_bn = depth < 50 ? "bn2" : "bn3";
    int64_t zeroed = 0;
    for (const auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      if (name.ends_with(".weight") && name.find("bn") != std::string::npos) {
        const bool is_last = name.ends_with(last_bn + ".weight");
        const double expected = is_last ? 0.0 : 1.0;
        EXPECT_TRUE(item.value().eq(expected).all().item<bool>()) << name;
        zeroed += is_last ? 1 : 0;
      }
    }
    EXPECT_EQ(zeroed, depth < 50 ? 8 : 16);
    // Each residual block starts as ReLU(shortcut): with an identity shortcut and a
    // non-negative input, the block is the identity.
    auto block = model->trunk_block(2);
    at::Tensor x = torch::rand({2, depth < 50 ? 64 : 256, 8, 8});
    model->eval();
    torch::NoGradGuard no_grad;
    at::Tensor y = model->forward_trunk_range(x, 2, 3);
    EXPECT_TRUE(torch::allclose(y, x)) << "depth " << depth;
  }
}

TEST(ResNet, RejectsBadOptions) {
  ModelOptions options = resnet_options(19, "imagenet");
  std::string message = error_of(options);
  EXPECT_NE(message.find("ResNetOptions::depth"), std::string::npos) << message;
  EXPECT_NE(message.find("19"), std::string::npos) << message;
  EXPECT_NE(message.find("18, 34, 50, 101, 152"), std::string::npos) << message;

  options = resnet_options(50, "tiny");
  message = error_of(options);
  EXPECT_NE(message.find("ResNetOptions::stem"), std::string::npos) << message;
  EXPECT_NE(message.find("tiny"), std::string::npos) << message;

  options = resnet_options(50, "cifar");
  options.resnet.width_multiplier = 0;
  message = error_of(options);
  EXPECT_NE(message.find("ResNetOptions::width_multiplier"), std::string::npos) << message;

  options = resnet_options(18, "cifar");
  options.resnet.groups = 32;
  message = error_of(options);
  EXPECT_NE(message.find("ResNetOptions::groups"), std::string::npos) << message;

  options = resnet_options(50, "cifar");
  options.resnet.layer4_stride = 3;
  message = error_of(options);
  EXPECT_NE(message.find("ResNetOptions::layer4_stride"), std::string::npos) << message;
}

TEST(ResNet, Layer4StrideOneKeepsResolution) {
  ModelOptions options = resnet_options(18, "cifar");
  options.resnet.layer4_stride = 1;
  TrunkHeadModel model = build_model(options);
  torch::NoGradGuard no_grad;
  at::Tensor maps = model->forward_trunk_range(torch::randn({1, 3, 16, 16}), 0, 9);
  EXPECT_EQ(maps.sizes().vec(), (std::vector<int64_t>{1, 512, 4, 4})); // 16 -> 16, 8, 4, 4
}

} // namespace
} // namespace largo::models::resnet_test
