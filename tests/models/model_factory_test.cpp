// build_model: trunk-name dispatch and the errors users see for bad model options.
#include "model_test_util.h"

#include <largo/models/model_factory.h>

#include <largo/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace largo::models::model_factory_test {
namespace {

using testing::error_of;

TEST(ModelFactory, BuildsEverySupportedTrunk) {
  ModelOptions options;
  options.in_channels = 3;
  options.image_size = 32;
  options.num_classes = 7;
  options.resnet.depth = 18;
  options.regnet = regnet_preset("regnet_y_400mf");
  options.vit.patch_size = 8;
  options.vit.num_layers = 1;
  options.vit.num_heads = 2;
  options.vit.hidden_dim = 16;
  options.vit.mlp_dim = 32;
  options.resnet_sk.width_multiplier = 1;
  options.resnet_sk.blocks_per_stage = {1, 1, 1, 1};
  for (const std::string& name : supported_trunk_names()) {
    options.trunk_name = name;
    TrunkHeadModel model = build_model(options);
    torch::NoGradGuard no_grad;
    model->eval();
    EXPECT_EQ(
        model->forward(torch::randn({2, 3, 32, 32})).sizes().vec(), (std::vector<int64_t>{2, 7}))
        << name;
  }
}

TEST(ModelFactory, UnknownTrunkNamesTheKeyAndTheChoices) {
  ModelOptions options;
  options.trunk_name = "alexnet";
  const std::string message = error_of(options);
  EXPECT_NE(message.find("ModelOptions::trunk_name"), std::string::npos) << message;
  EXPECT_NE(message.find("alexnet"), std::string::npos) << message;
  EXPECT_NE(
      message.find("mlp, small_cnn, resnet, resnet_sk, regnet, vision_transformer"),
      std::string::npos)
      << message;
}

TEST(ModelFactory, BadInputShapeOrClasses) {
  ModelOptions options;
  options.trunk_name = "small_cnn";
  options.in_channels = 0;
  EXPECT_THROW(build_model(options), ConfigError);
  options.in_channels = 1;
  options.num_classes = 0;
  EXPECT_THROW(build_model(options), ConfigError);
}

TEST(ModelFactory, SameSeedSameWeights) {
  ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = 18;
  options.resnet.stem = "cifar";
  torch::manual_seed(7);
  TrunkHeadModel a = build_model(options);
  torch::manual_seed(7);
  TrunkHeadModel b = build_model(options);
  auto b_params = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), b_params[item.key()])) << item.key();
  }
}

} // namespace
} // namespace largo::models::model_factory_test
