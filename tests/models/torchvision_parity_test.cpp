// Largo's ResNets and ViT against torchvision, using the values written by
// tests/reference/gen_model_baselines.py (tests/models/baselines/model_baselines.json):
//  - structure: ResNet-18/50 have torchvision's parameters and buffers, in the same order,
//    with the same shapes, under the mapped names (so weights can be moved across);
//  - numerics: with every tensor set to the same closed form, the eval-mode outputs match.
#include <largo/models/model_factory.h>

#include "model_test_util.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace largo::models::torchvision_parity_test {
namespace {

const nlohmann::json& baselines() {
  static const nlohmann::json json = [] {
    std::ifstream in(
        std::string(largo::test_paths::data_dir()) + "/models/baselines/model_baselines.json");
    EXPECT_TRUE(in.good()) << "missing model_baselines.json; run " LARGO_PYTHON
                              " tests/reference/gen_model_baselines.py";
    return nlohmann::json::parse(in);
  }();
  return json;
}

const nlohmann::json& find_case(const std::string& kind, const std::string& name) {
  for (const auto& entry : baselines().at(kind)) {
    if (entry.at("name") == name) {
      return entry;
    }
  }
  throw std::runtime_error("no baseline case " + name);
}

std::vector<int64_t> shape_of(const nlohmann::json& json) {
  return json.get<std::vector<int64_t>>();
}

using testing::closed_form;

TrunkHeadModel build_resnet(int64_t depth, const std::string& stem, int64_t num_classes) {
  ModelOptions options;
  options.trunk_name = "resnet";
  options.in_channels = 3;
  options.image_size = 64;
  options.num_classes = num_classes;
  options.resnet.depth = depth;
  options.resnet.stem = stem;
  return build_model(options);
}

class ResNetStructure : public ::testing::TestWithParam<const char*> {};

TEST_P(ResNetStructure, ParametersAndBuffersMatchTorchvisionInOrder) {
  const auto& expected = find_case("structure", GetParam());
  torch::manual_seed(0);
  TrunkHeadModel model = build_resnet(expected.at("depth"), "imagenet", expected.at("num_classes"));

  EXPECT_EQ(count_parameters(*model), expected.at("num_parameters").get<int64_t>());

  const auto params = model->named_parameters();
  const auto& expected_params = expected.at("parameters");
  ASSERT_EQ(params.size(), expected_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& torchvision_name = expected_params[i][0];
    EXPECT_EQ(params[i].key(), expected_params[i][2].get<std::string>())
        << "torchvision " << torchvision_name;
    EXPECT_EQ(params[i].value().sizes().vec(), shape_of(expected_params[i][1])) << params[i].key();
  }

  const auto buffers = model->named_buffers();
  const auto& expected_buffers = expected.at("buffers");
  ASSERT_EQ(buffers.size(), expected_buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_EQ(buffers[i].key(), expected_buffers[i][2].get<std::string>());
    EXPECT_EQ(buffers[i].value().sizes().vec(), shape_of(expected_buffers[i][1]))
        << buffers[i].key();
  }
}

INSTANTIATE_TEST_SUITE_P(Torchvision, ResNetStructure, ::testing::Values("resnet18", "resnet50"));

// Sets every parameter and buffer named in the case to its closed form, then runs the
// case's input through the model in eval mode.
at::Tensor run_numeric_case(TrunkHeadModel& model, const nlohmann::json& entry) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model->named_parameters()) {
    tensors[item.key()] = item.value();
  }
  for (const auto& item : model->named_buffers()) {
    tensors[item.key()] = item.value();
  }
  size_t assigned = 0;
  {
    torch::NoGradGuard no_grad;
    for (const auto& t : entry.at("tensors")) {
      const std::string name = t.at("largo_name");
      auto found = tensors.find(name);
      if (found == tensors.end()) {
        ADD_FAILURE() << "the model has no tensor " << name << " (torchvision "
                      << t.at("torchvision_name") << ")";
        continue;
      }
      at::Tensor value = closed_form(
          t.at("k").get<uint64_t>(), shape_of(t.at("shape")), t.at("scale"), t.at("offset"));
      EXPECT_EQ(found->second.sizes(), value.sizes()) << name;
      found->second.copy_(value);
      ++assigned;
    }
  }
  // Every float tensor of the model must have been set (num_batches_tracked is an int count).
  size_t float_tensors = 0;
  for (const auto& [name, tensor] : tensors) {
    float_tensors += tensor.is_floating_point() ? 1 : 0;
  }
  EXPECT_EQ(assigned, float_tensors);

  model->eval();
  at::Tensor input = closed_form(
      entry.at("input_key").get<uint64_t>(), shape_of(entry.at("input_shape")), 1.0, 0.0);
  torch::NoGradGuard no_grad;
  return model->forward(input);
}

void expect_matches(const at::Tensor& output, const nlohmann::json& entry) {
  const auto expected_values = entry.at("output").get<std::vector<float>>();
  at::Tensor expected = torch::tensor(expected_values).view(shape_of(entry.at("output_shape")));
  ASSERT_EQ(output.sizes(), expected.sizes());
  // float32 through ~50 layers with different summation orders (oneDNN vs PyTorch's
  // kernels): allow 1e-4 of the output's scale.
  const double scale = expected.abs().max().item<double>();
  const double max_error = (output - expected).abs().max().item<double>();
  EXPECT_LE(max_error, 1e-4 * scale) << entry.at("name") << ": output\n"
                                     << output << "\nexpected\n"
                                     << expected;
}

class ResNetNumerics : public ::testing::TestWithParam<const char*> {};

TEST_P(ResNetNumerics, OutputMatchesTorchvision) {
  const auto& entry = find_case("numeric", GetParam());
  TrunkHeadModel model = build_resnet(entry.at("depth"), entry.at("stem"), entry.at("num_classes"));
  expect_matches(run_numeric_case(model, entry), entry);
}

INSTANTIATE_TEST_SUITE_P(
    Torchvision,
    ResNetNumerics,
    ::testing::Values("resnet18_imagenet_stem", "resnet18_cifar_stem", "resnet50_imagenet_stem"));

TEST(VitNumerics, OutputMatchesTorchvisionVisionTransformer) {
  const auto& entry = find_case("numeric", "vit");
  const auto& args = entry.at("vit");
  ModelOptions options;
  options.trunk_name = "vision_transformer";
  options.in_channels = 3;
  options.image_size = args.at("image_size");
  options.num_classes = args.at("num_classes");
  options.vit.patch_size = args.at("patch_size");
  options.vit.num_layers = args.at("num_layers");
  options.vit.num_heads = args.at("num_heads");
  options.vit.hidden_dim = args.at("hidden_dim");
  options.vit.mlp_dim = args.at("mlp_dim");
  options.vit.qkv_bias = true; // torchvision's MultiheadAttention always has one
  TrunkHeadModel model = build_model(options);
  expect_matches(run_numeric_case(model, entry), entry);
}

} // namespace
} // namespace largo::models::torchvision_parity_test
