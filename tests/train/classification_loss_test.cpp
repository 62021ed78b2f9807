// classification_loss against VISSL's cross_entropy_multiple_output_single_target
// (tests/reference/gen_classification_loss_baselines.py): temperature, normalize_output,
// class weights, ignore_index, several outputs.
#include <largo/core/error.h>
#include <largo/train/classification_loss.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>

#include "test_paths.h"

namespace largo::train::classification_loss_test {
namespace {

TEST(ClassificationLossTest, EqualsVisslsLossAndGradientInFloat64) {
  std::ifstream file(
      std::string(largo::test_paths::data_dir()) +
      "/train/baselines/classification_loss_baselines.json");
  ASSERT_TRUE(file.good()) << "run tests/reference/gen_classification_loss_baselines.py";
  const auto baselines = nlohmann::json::parse(file);
  const auto shape = baselines["shape"].get<std::vector<int64_t>>();
  const at::Tensor targets = torch::tensor(baselines["target"].get<std::vector<int64_t>>());
  for (const auto& c : baselines["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::vector<at::Tensor> outputs;
    for (const auto& values : baselines["outputs"]) {
      outputs.push_back(torch::tensor(values.get<std::vector<double>>(), torch::kFloat64)
                            .reshape(shape)
                            .requires_grad_());
    }
    ClassificationLossOptions options;
    options.temperature = c["temperature"];
    options.normalize_output = c["normalize_output"];
    if (!c["weight"].is_null()) {
      options.weight = c["weight"].get<std::vector<double>>();
    }
    at::Tensor loss = classification_loss(outputs, targets, options);
    loss.backward();
    // float64 throughout, the same operations as PyTorch's: agreement to ~1e-15 relative;
    // 1e-12 leaves room for a different summation order.
    const double expected = c["loss"];
    EXPECT_NEAR(loss.item<double>(), expected, 1e-12 * std::abs(expected));
    for (size_t i = 0; i < outputs.size(); ++i) {
      at::Tensor grad = torch::tensor(c["grads"][i].get<std::vector<double>>(), torch::kFloat64);
      EXPECT_LE((outputs[i].grad().flatten() - grad).abs().max().item<double>(), 1e-12);
    }
  }
}

TEST(ClassificationLossTest, SumReductionAddsTheCountedSamples) {
  at::Tensor logits = torch::randn({4, 3}, torch::kFloat64);
  at::Tensor targets = torch::tensor({0, -1, 2, 1});
  ClassificationLossOptions options;
  const double mean = classification_loss(logits, targets, options).item<double>();
  options.sum = true;
  EXPECT_NEAR(classification_loss(logits, targets, options).item<double>(), 3 * mean, 1e-12);
}

TEST(ClassificationLossTest, RejectsBadTemperatureAndWeights) {
  at::Tensor logits = torch::randn({2, 3});
  at::Tensor targets = torch::tensor({0, 1});
  ClassificationLossOptions options;
  options.temperature = 0;
  EXPECT_THROW(classification_loss(logits, targets, options), ConfigError);
  options = {};
  options.weight = {1.0, 2.0};
  EXPECT_THROW(classification_loss(logits, targets, options), ConfigError);
}

} // namespace
} // namespace largo::train::classification_loss_test
