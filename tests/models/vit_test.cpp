// Vision Transformer trunk: shapes, the closed-form parameter count, the block layout,
// classifier variants, dropout/drop-path behaviour and option validation.
#include "model_test_util.h"

#include <largo/models/model_factory.h>

#include <largo/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace largo::models::vit_test {
namespace {

ModelOptions vit_options() {
  ModelOptions options;
  options.trunk_name = "vision_transformer";
  options.in_channels = 3;
  options.image_size = 32;
  options.num_classes = 10;
  options.vit.patch_size = 8;
  options.vit.num_layers = 3;
  options.vit.num_heads = 4;
  options.vit.hidden_dim = 48;
  options.vit.mlp_dim = 96;
  return options;
}

// Written out from the architecture, independently of the code under test.
int64_t vit_parameter_count(const ModelOptions& o) {
  const int64_t c = o.in_channels, p = o.vit.patch_size, d = o.vit.hidden_dim;
  const int64_t m = o.vit.mlp_dim, layers = o.vit.num_layers, k = o.num_classes;
  const int64_t patches = (o.image_size / p) * (o.image_size / p);
  const bool token = o.vit.classifier == "token";
  const int64_t embedding = c * p * p * d + d                      // patch conv weight + bias
                            + (token ? d : 0)                      // class token
                            + (patches + (token ? 1 : 0)) * d;     // positional embedding
  const int64_t layer = 2 * d                                      // norm1
                        + 3 * d * d + (o.vit.qkv_bias ? 3 * d : 0) // qkv
                        + d * d + d                                // proj
                        + 2 * d                                    // norm2
                        + d * m + m                                // fc1
                        + m * d + d;                               // fc2
  const int64_t final_norm = 2 * d;
  const int64_t head = d * k + k;
  return embedding + layers * layer + final_norm + head;
}

using testing::error_of;

TEST(Vit, OutputShapesPerBlock) {
  TrunkHeadModel model = build_model(vit_options());
  EXPECT_EQ(model->num_trunk_blocks(), 3 + 2); // embedding, 3 layers, final norm
  EXPECT_EQ(model->trunk_output_dim(), 48);
  at::Tensor images = torch::randn({2, 3, 32, 32});
  torch::NoGradGuard no_grad;
  model->eval();
  at::Tensor tokens = model->forward_trunk_range(images, 0, 1);
  EXPECT_EQ(tokens.sizes().vec(), (std::vector<int64_t>{2, 16 + 1, 48})); // 4x4 patches + cls
  at::Tensor encoded = model->forward_trunk_range(tokens, 1, 4);
  EXPECT_EQ(encoded.sizes().vec(), (std::vector<int64_t>{2, 17, 48}));
  EXPECT_EQ(model->forward_trunk_range(encoded, 4, 5).sizes().vec(), (std::vector<int64_t>{2, 48}));
  EXPECT_EQ(model->forward(images).sizes().vec(), (std::vector<int64_t>{2, 10}));
}

TEST(Vit, ParameterCountMatchesClosedForm) {
  ModelOptions options = vit_options();
  EXPECT_EQ(count_parameters(*build_model(options)), vit_parameter_count(options));
  options.vit.qkv_bias = true;
  EXPECT_EQ(count_parameters(*build_model(options)), vit_parameter_count(options));
  options.vit.classifier = "gap";
  EXPECT_EQ(count_parameters(*build_model(options)), vit_parameter_count(options));
  options.in_channels = 1;
  options.image_size = 28;
  options.vit.patch_size = 7;
  EXPECT_EQ(count_parameters(*build_model(options)), vit_parameter_count(options));
}

// The formula gives torchvision's count for vit_b_16 (86,567,656: qkv bias, 1000 classes),
// and the model gives the formula's count (above); building ViT-B itself takes seconds.
TEST(Vit, FormulaGivesTorchvisionVit_B_16Count) {
  ModelOptions options;
  options.trunk_name = "vision_transformer";
  options.in_channels = 3;
  options.image_size = 224;
  options.num_classes = 1000;
  options.vit.qkv_bias = true; // the other VitOptions defaults are ViT-B/16's
  EXPECT_EQ(vit_parameter_count(options), 86'567'656);
}

TEST(Vit, GapClassifierHasNoClassToken) {
  ModelOptions options = vit_options();
  options.vit.classifier = "gap";
  TrunkHeadModel model = build_model(options);
  EXPECT_FALSE(model->named_parameters().contains("trunk.0.class_token"));
  torch::NoGradGuard no_grad;
  at::Tensor tokens = model->forward_trunk_range(torch::randn({2, 3, 32, 32}), 0, 1);
  EXPECT_EQ(tokens.sizes().vec(), (std::vector<int64_t>{2, 16, 48}));
  EXPECT_EQ(
      model->forward(torch::randn({2, 3, 32, 32})).sizes().vec(), (std::vector<int64_t>{2, 10}));
}

TEST(Vit, InitializationIsTruncatedNormal) {
  torch::manual_seed(0);
  ModelOptions options = vit_options();
  options.vit.hidden_dim = 192;
  options.vit.mlp_dim = 768;
  TrunkHeadModel model = build_model(options);
  auto params = model->named_parameters();
  at::Tensor fc1 = params["trunk.1.fc1.weight"]; // 147,456 samples
  // VISSL's trunc_normal_(std=0.02) truncates at -2 and 2, absolute (100 sigma): the weights
  // are N(0, 0.02), whose sample std over 147,456 draws is within 0.02 / sqrt(2 N) = 3.7e-5
  // (one sigma) of 0.02, and of which 4.55 % lie beyond 2 sigma = 0.04 (binomial std 0.054
  // points), which a truncation at +-2 sigma would leave at none.
  EXPECT_NEAR(fc1.std().item<double>(), 0.02, 2e-4);
  const double beyond = fc1.abs().gt(0.04).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(beyond, 0.0455, 0.005);
  EXPECT_TRUE(params["trunk.1.fc1.bias"].eq(0).all().item<bool>());
  EXPECT_TRUE(params["trunk.1.norm1.weight"].eq(1).all().item<bool>());
}

TEST(Vit, DropoutAndDropPathOnlyInTraining) {
  ModelOptions options = vit_options();
  options.vit.dropout = 0.1;
  options.vit.attention_dropout = 0.1;
  options.vit.drop_path_rate = 0.2;
  TrunkHeadModel model = build_model(options);
  at::Tensor images = torch::randn({4, 3, 32, 32});
  torch::NoGradGuard no_grad;
  model->eval();
  EXPECT_TRUE(torch::equal(model->forward(images), model->forward(images)));
  model->train();
  torch::manual_seed(1);
  at::Tensor first = model->forward(images);
  torch::manual_seed(2);
  EXPECT_FALSE(torch::allclose(first, model->forward(images)));
}

TEST(Vit, RejectsInconsistentOptions) {
  ModelOptions options = vit_options();
  options.vit.patch_size = 5;
  std::string message = error_of(options);
  EXPECT_NE(message.find("VitOptions::patch_size"), std::string::npos) << message;
  EXPECT_NE(message.find("5"), std::string::npos) << message;
  EXPECT_NE(message.find("32"), std::string::npos) << message;

  options = vit_options();
  options.vit.num_heads = 5;
  message = error_of(options);
  EXPECT_NE(message.find("VitOptions::num_heads"), std::string::npos) << message;
  EXPECT_NE(message.find("48"), std::string::npos) << message;

  options = vit_options();
  options.vit.image_size = 224; // the data is 32x32
  message = error_of(options);
  EXPECT_NE(message.find("VitOptions::image_size = 224"), std::string::npos) << message;

  options = vit_options();
  options.vit.classifier = "pool";
  message = error_of(options);
  EXPECT_NE(message.find("VitOptions::classifier"), std::string::npos) << message;

  options = vit_options();
  options.vit.dropout = 1.5;
  message = error_of(options);
  EXPECT_NE(message.find("VitOptions::dropout"), std::string::npos) << message;
}

TEST(Vit, WrongInputSizeIsAClearError) {
  TrunkHeadModel model = build_model(vit_options());
  torch::NoGradGuard no_grad;
  try {
    model->forward(torch::randn({1, 3, 28, 28}));
    FAIL() << "expected an error";
  } catch (const largo::Error& error) {
    EXPECT_NE(std::string(error.what()).find("32x32"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("1x3x28x28"), std::string::npos) << error.what();
  }
}

} // namespace
} // namespace largo::models::vit_test
