// A ViT on inputs of another size than it was built for (DINO's local crops): the positional
// embedding interpolated bit for bit as VISSL's interpolate_pos_encoding
// (tests/reference/gen_vit_position_interpolation_baselines.py), the build size's path
// unchanged, and the inputs it cannot take refused by name.
#include "model_test_util.h"

#include <largo/core/error.h>
#include <largo/models/model_factory.h>
#include <largo/models/vit_position_interpolation.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace largo::models::vit_position_interpolation_test {
namespace {

at::Tensor json_tensor(const nlohmann::json& values, at::IntArrayRef shape) {
  return torch::tensor(values.get<std::vector<double>>(), torch::kFloat64)
      .to(torch::kFloat32)
      .reshape(shape);
}

// The same float32 kernel (upsample_bicubic2d on the CPU) with the same scale factor on the
// same values: each output is the same sum of the same products, so bit for bit.
TEST(VitPositionInterpolation, MatchesVisslBitForBit) {
  for (const char* name : {"grid4_to_2", "grid4_to_3", "grid4_to_6", "grid14_to_6"}) {
    const nlohmann::json baseline = testing::baseline_case(
        "vit_position_interpolation_baselines.json",
        "gen_vit_position_interpolation_baselines.py",
        name);
    ASSERT_FALSE(baseline.is_null()) << name;
    const int64_t dim = baseline.at("dim");
    const int64_t built = baseline.at("built_grid");
    const int64_t input = baseline.at("input_grid");
    const at::Tensor pos = json_tensor(baseline.at("pos_embedding"), {1, 1 + built * built, dim});
    const at::Tensor expected = json_tensor(baseline.at("expected"), {1, 1 + input * input, dim});
    const at::Tensor got = interpolate_position_embedding(pos, built, input);
    ASSERT_EQ(got.sizes(), expected.sizes()) << name;
    EXPECT_TRUE(torch::equal(got, expected))
        << name << ": max difference " << (got - expected).abs().max().item<double>();
  }
}

// sqrt(15^2 / 11^2) * 11 rounds to just under 15, so the interpolated map is 14x14 (in
// PyTorch too): refused, not silently mismatched.
TEST(VitPositionInterpolation, GridTheScaleFactorMissesIsRefused) {
  try {
    interpolate_position_embedding(torch::zeros({1, 1 + 11 * 11, 4}), 11, 15);
    FAIL() << "expected an error";
  } catch (const largo::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("11x11"), std::string::npos) << message;
    EXPECT_NE(message.find("14x14"), std::string::npos) << message;
    EXPECT_NE(message.find("15x15"), std::string::npos) << message;
  }
}

ModelOptions vit_options() {
  ModelOptions options;
  options.trunk_name = "vision_transformer";
  options.in_channels = 3;
  options.image_size = 32;
  options.num_classes = 10;
  options.vit.patch_size = 8;
  options.vit.num_layers = 2;
  options.vit.num_heads = 2;
  options.vit.hidden_dim = 8;
  options.vit.mlp_dim = 16;
  return options;
}

// The patch embedding written out: conv, class token first, positions added.
at::Tensor embedded(TrunkHeadModel& model, const at::Tensor& images, const at::Tensor& positions) {
  auto params = model->named_parameters();
  at::Tensor tokens =
      at::conv2d(images, params["trunk.0.conv_proj.weight"], params["trunk.0.conv_proj.bias"], 8);
  tokens = tokens.flatten(2).transpose(1, 2); // [b, n, d]
  const at::Tensor cls = params["trunk.0.class_token"].expand({images.size(0), -1, -1});
  return at::cat({cls, tokens}, 1) + positions;
}

TEST(VitPositionInterpolation, BuildSizeAddsTheEmbeddingAsBuilt) {
  torch::manual_seed(0);
  TrunkHeadModel model = build_model(vit_options());
  model->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor images = torch::randn({2, 3, 32, 32});
  const at::Tensor positions = model->named_parameters()["trunk.0.pos_embedding"];
  EXPECT_TRUE(
      torch::equal(model->forward_trunk_range(images, 0, 1), embedded(model, images, positions)));
}

TEST(VitPositionInterpolation, OtherSizesAddTheInterpolatedEmbedding) {
  torch::manual_seed(0);
  TrunkHeadModel model = build_model(vit_options());
  model->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor positions = model->named_parameters()["trunk.0.pos_embedding"];
  for (const int64_t side : {16, 24, 48}) { // grids 2, 3, 6 from the built 4
    const at::Tensor images = torch::randn({2, 3, side, side});
    const at::Tensor expected =
        embedded(model, images, interpolate_position_embedding(positions, 4, side / 8));
    EXPECT_TRUE(torch::equal(model->forward_trunk_range(images, 0, 1), expected)) << side;
    EXPECT_EQ(model->forward(images).sizes().vec(), (std::vector<int64_t>{2, 10})) << side;
  }
}

std::string forward_error(const ModelOptions& options, at::IntArrayRef shape) {
  TrunkHeadModel model = build_model(options);
  torch::NoGradGuard no_grad;
  try {
    model->forward(torch::zeros(shape));
  } catch (const largo::Error& error) {
    return error.what();
  }
  return "(no error)";
}

// VISSL asserts the sizes match without a class token; Largo refuses by the options' names.
TEST(VitPositionInterpolation, OtherSizesWithoutClassTokenAreRefused) {
  ModelOptions gap = vit_options();
  gap.vit.classifier = "gap";
  ModelOptions no_token = vit_options();
  no_token.vit.use_class_token = false;
  for (const ModelOptions& options : {gap, no_token}) {
    const std::string message = forward_error(options, {1, 3, 16, 16});
    EXPECT_NE(message.find("VitOptions::use_class_token false"), std::string::npos) << message;
    EXPECT_NE(message.find("VitOptions::classifier gap"), std::string::npos) << message;
    EXPECT_NE(message.find("built for (VitOptions::image_size)"), std::string::npos) << message;
    EXPECT_NE(message.find("32x32"), std::string::npos) << message;
    EXPECT_NE(message.find("1x3x16x16"), std::string::npos) << message;
  }
}

TEST(VitPositionInterpolation, NonSquareOrUnpatchableInputsAreRefused) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 3, 32, 16}, {1, 3, 20, 20}}) {
    const std::string message = forward_error(vit_options(), shape);
    EXPECT_NE(
        message.find("square images whose side is a multiple of VitOptions::patch_size 8"),
        std::string::npos)
        << message;
    EXPECT_NE(message.find(fmt::format("{}x{}", shape[2], shape[3])), std::string::npos) << message;
  }
}

} // namespace
} // namespace largo::models::vit_position_interpolation_test
