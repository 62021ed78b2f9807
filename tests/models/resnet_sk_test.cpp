// VISSL's resnet_sk trunk (SimCLRv2's ResNet with selective kernels) against a PyTorch
// transcription of VISSL's module (tests/reference/gen_resnet_sk_baselines.py ->
// tests/models/baselines/resnet_sk_baselines.json): VISSL's state_dict names map one to one
// onto Largo's with the same shapes, the forward equals VISSL's in eval and train mode with
// the same weights, and the parameter and convolution FLOP counts are VISSL's.
#include "models/model_test_util.h"
#include "test_paths.h"

#include <largo/models/flop_count.h>
#include <largo/models/model_factory.h>
#include <largo/models/resnet_sk.h>
#include <largo/models/vissl_names.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

namespace largo::models::resnet_sk_test {
namespace {

using testing::error_of;

const nlohmann::json& baselines() {
  static const nlohmann::json json = [] {
    std::ifstream in(
        std::string(largo::test_paths::data_dir()) + "/models/baselines/resnet_sk_baselines.json");
    EXPECT_TRUE(in.good()) << "missing resnet_sk_baselines.json; run " LARGO_PYTHON
                              " tests/reference/gen_resnet_sk_baselines.py";
    return nlohmann::json::parse(in);
  }();
  return json;
}

ModelOptions resnet_sk_model(const nlohmann::json& spec) {
  ModelOptions options;
  options.trunk_name = "resnet_sk";
  options.in_channels = 3;
  options.image_size = spec.at("image_size");
  options.num_classes = 10;
  options.resnet_sk.blocks_per_stage = spec.at("blocks").get<std::vector<int64_t>>();
  options.resnet_sk.width_multiplier = spec.at("width_multiplier");
  options.resnet_sk.sk_ratio = spec.at("sk_ratio");
  return options;
}

// The generator's fill(): every tensor's value by its VISSL name and state_dict index.
at::Tensor filled(const std::string& name, const std::vector<int64_t>& shape, int64_t index) {
  int64_t n = 1;
  for (int64_t side : shape) {
    n *= side;
  }
  const at::Tensor wave = at::sin(at::arange(n, at::kDouble) * 0.37 + static_cast<double>(index));
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  at::Tensor value;
  if (ends_with("running_mean") || ends_with(".bias")) {
    value = 0.1 * wave;
  } else if (ends_with("running_var")) {
    value = 1.0 + 0.5 * wave * wave;
  } else if (shape.size() == 1) { // BatchNorm weight
    value = 1.0 + 0.2 * wave;
  } else { // conv weight: fan-in scaled
    value = wave * (1.5 / std::sqrt(static_cast<double>(n / shape[0])));
  }
  return value.reshape(shape);
}

// Largo's trunk tensors (parameters and buffers) by name.
std::map<std::string, at::Tensor> trunk_tensors(TrunkHeadModel& model) {
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model->named_parameters()) {
    tensors[item.key()] = item.value();
  }
  for (const auto& item : model->named_buffers()) {
    tensors[item.key()] = item.value();
  }
  std::erase_if(tensors, [](const auto& entry) { return entry.first.rfind("trunk.", 0) != 0; });
  return tensors;
}

// Sets every trunk tensor through VISSL's name as the generator set it; each VISSL name
// must map onto a Largo tensor of its shape, and together they must cover the trunk.
void load_vissl_fill(TrunkHeadModel& model, const ModelOptions& options, const nlohmann::json& c) {
  std::map<std::string, at::Tensor> tensors = trunk_tensors(model);
  const auto rename = weights_name_mapping(options);
  std::set<std::string> loaded;
  int64_t index = 0;
  torch::NoGradGuard no_grad;
  for (const auto& entry : c.at("state_dict")) {
    const std::string vissl = entry.at(0);
    const auto shape = entry.at(1).get<std::vector<int64_t>>();
    const std::string largo = rename("trunk." + vissl);
    const auto found = tensors.find(largo);
    ASSERT_NE(found, tensors.end()) << vissl << " -> " << largo;
    EXPECT_EQ(found->second.sizes().vec(), shape) << vissl;
    EXPECT_TRUE(loaded.insert(largo).second) << largo << " loaded twice";
    // (libtorch's Module::to(kDouble) converts num_batches_tracked too: its shape is [])
    if (found->second.is_floating_point() && !shape.empty()) {
      found->second.copy_(filled(vissl, shape, index));
    }
    ++index;
  }
  EXPECT_EQ(loaded.size(), tensors.size()) << "Largo tensors VISSL's state_dict does not name";
}

// Float64 on both sides: the convolutions may sum in another order (relative differences of
// about 1e-15 per layer); a wrong layer, name or order changes the outputs by far more than
// 1e-9 relative.
void expect_summary(const at::Tensor& output, const nlohmann::json& expected, const char* mode) {
  const int64_t stride = 61;
  for (int64_t image = 0; image < output.size(0); ++image) {
    const at::Tensor row = output[image];
    const double sum = expected.at("sum").at(image);
    const double abs_sum = expected.at("abs_sum").at(image);
    EXPECT_NEAR(row.sum().item<double>(), sum, 1e-9 * std::abs(sum)) << mode;
    EXPECT_NEAR(row.abs().sum().item<double>(), abs_sum, 1e-9 * abs_sum) << mode;
    const auto& channels = expected.at("channels").at(image);
    for (size_t k = 0; k < channels.size(); ++k) {
      const double value = channels.at(k);
      EXPECT_NEAR(
          row[static_cast<int64_t>(k) * stride].item<double>(),
          value,
          1e-9 * std::max(1.0, std::abs(value)))
          << mode << " image " << image << " channel " << k * stride;
    }
  }
}

at::Tensor images(int64_t size) {
  return at::cos(at::arange(2 * 3 * size * size, at::kDouble) * 0.05).reshape({2, 3, size, size});
}

TEST(ResNetSk, ForwardEqualsVisslsInEvalAndTrainModeWithVisslsNames) {
  for (const auto& c : baselines().at("cases")) {
    if (!c.at("forward").get<bool>()) {
      continue;
    }
    SCOPED_TRACE(c.at("name").get<std::string>());
    const ModelOptions options = resnet_sk_model(c);
    TrunkHeadModel model = build_model(options);
    model->to(at::kDouble);
    load_vissl_fill(model, options, c);
    ASSERT_EQ(model->trunk_output_dim(), c.at("output_width").get<int64_t>());
    const at::Tensor x = images(c.at("image_size"));
    torch::NoGradGuard no_grad;
    model->eval();
    expect_summary(model->forward_trunk(x), c.at("eval"), "eval");
    model->train();
    expect_summary(model->forward_trunk(x), c.at("train"), "train");
  }
}

TEST(ResNetSk, ParameterAndConvolutionFlopCountsAreVissls) {
  for (const auto& c : baselines().at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    ModelOptions options = resnet_sk_model(c);
    int64_t conv_flops = 0;
    for (const LayerFlops& layer : count_model_flops(options).layers) {
      conv_flops += layer.name.rfind("trunk.", 0) == 0 ? layer.forward_flops : 0;
    }
    EXPECT_EQ(conv_flops, c.at("conv_flops").get<int64_t>());
    if (c.at("forward").get<bool>()) { // the wider case is not built: 100 M parameters
      TrunkHeadModel model = build_model(options);
      int64_t count = 0;
      for (const auto& parameter : model->trunk()->parameters()) {
        count += parameter.numel();
      }
      EXPECT_EQ(count, c.at("parameter_count").get<int64_t>());
      // Every convolution is counted once, under its module's name.
      std::set<std::string> convs;
      std::set<std::string> counted;
      for (const auto& item : model->named_modules()) {
        if (item.value()->as<torch::nn::Conv2d>()) {
          convs.insert(item.key());
        }
      }
      for (const LayerFlops& layer : count_model_flops(options).layers) {
        if (layer.name.rfind("trunk.", 0) == 0) {
          EXPECT_TRUE(counted.insert(layer.name).second) << layer.name;
        }
      }
      EXPECT_EQ(counted, convs);
    }
  }
}

TEST(ResNetSk, VisslsDepthAndBlocks) {
  ResNetSkOptions options;
  EXPECT_EQ(resnet_sk_stage_sizes(options), (std::vector<int64_t>{3, 8, 36, 3}));
  EXPECT_EQ(
      resnet_sk_name_from_vissl("trunk.net.3.blocks.35.net.2.main_conv.0.weight", options),
      "trunk.47.net.2.main_conv.0.weight"); // 1 (stem) + 3 + 8 + 35
  EXPECT_EQ(resnet_sk_name_from_vissl("net.0.1.0.weight", options), "trunk.0.1.0.weight");
  EXPECT_EQ(
      resnet_sk_name_from_vissl("net.3.blocks.36.net.0.weight", options),
      "net.3.blocks.36.net.0.weight"); // no such block: unchanged
  EXPECT_EQ(resnet_sk_name_from_vissl("heads.0.clf.0.weight", options), "heads.0.clf.0.weight");
}

TEST(ResNetSk, RejectsBadOptionsNamingTheOption) {
  ModelOptions options;
  options.trunk_name = "resnet_sk";
  options.image_size = 32;
  options.resnet_sk.depth = 50;
  EXPECT_NE(error_of(options).find("ResNetSkOptions::depth"), std::string::npos);
  options.resnet_sk.depth = 152;
  options.resnet_sk.width_multiplier = 0;
  EXPECT_NE(error_of(options).find("ResNetSkOptions::width_multiplier"), std::string::npos);
  options.resnet_sk.width_multiplier = 1;
  options.resnet_sk.sk_ratio = -0.5;
  EXPECT_NE(error_of(options).find("ResNetSkOptions::sk_ratio"), std::string::npos);
  options.resnet_sk.sk_ratio = 0.0625;
  options.resnet_sk.blocks_per_stage = {1, 1, 1};
  EXPECT_NE(error_of(options).find("ResNetSkOptions::blocks_per_stage"), std::string::npos);
}

} // namespace
} // namespace largo::models::resnet_sk_test
