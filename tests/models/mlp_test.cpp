// The MLP trunk: shapes, blocks, parameter count and validation.
#include <largo/models/model_factory.h>

#include <largo/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::models::mlp_test {
namespace {

ModelOptions mlp_options(std::vector<int64_t> hidden_dims) {
  ModelOptions options;
  options.trunk_name = "mlp";
  options.in_channels = 1;
  options.image_size = 28;
  options.num_classes = 10;
  options.mlp.hidden_dims = std::move(hidden_dims);
  return options;
}

TEST(Mlp, ShapesBlocksAndParameterCount) {
  TrunkHeadModel model = build_model(mlp_options({512, 256}));
  EXPECT_EQ(model->num_trunk_blocks(), 2);
  EXPECT_EQ(model->trunk_output_dim(), 256);
  EXPECT_EQ(count_parameters(*model), (784 * 512 + 512) + (512 * 256 + 256) + (256 * 10 + 10));
  at::Tensor images = torch::randn({3, 1, 28, 28});
  torch::NoGradGuard no_grad;
  EXPECT_EQ(model->forward_trunk_range(images, 0, 1).sizes().vec(), (std::vector<int64_t>{3, 512}));
  EXPECT_EQ(model->forward(images).sizes().vec(), (std::vector<int64_t>{3, 10}));
  // ReLU outputs.
  EXPECT_TRUE(model->forward_trunk(images).ge(0).all().item<bool>());
}

TEST(Mlp, NoHiddenLayersIsALinearModel) {
  TrunkHeadModel model = build_model(mlp_options({}));
  EXPECT_EQ(model->num_trunk_blocks(), 1);
  EXPECT_EQ(model->trunk_output_dim(), 784);
  EXPECT_EQ(count_parameters(*model), 784 * 10 + 10);
  torch::NoGradGuard no_grad;
  at::Tensor images = torch::randn({2, 1, 28, 28});
  EXPECT_TRUE(torch::equal(model->forward_trunk(images), images.flatten(1)));
}

TEST(Mlp, RejectsNonPositiveWidths) {
  try {
    build_model(mlp_options({128, 0}));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(
        std::string(error.what()).find("MlpOptions::hidden_dims = [128, 0]"), std::string::npos)
        << error.what();
  }
}

} // namespace
} // namespace largo::models::mlp_test
