// ModelEma against VISSL's EMA (tests/reference/gen_model_ema_baselines.py), and its
// state_dict round trip.
#include <largo/core/error.h>
#include <largo/optim/model_ema.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <fstream>
#include <string>

#include "test_paths.h"

namespace largo::optim::model_ema_test {
namespace {

nlohmann::json load_baselines() {
  std::ifstream file(
      std::string(largo::test_paths::data_dir()) + "/optim/baselines/model_ema_baselines.json");
  EXPECT_TRUE(file.good()) << "run tests/reference/gen_model_ema_baselines.py";
  return nlohmann::json::parse(file);
}

at::Tensor tensor_of(const nlohmann::json& entry) {
  const std::string dtype = entry["dtype"];
  const auto shape = entry["shape"].get<std::vector<int64_t>>();
  at::Tensor values = torch::tensor(entry["values"].get<std::vector<double>>(), torch::kFloat64);
  const at::ScalarType type = dtype == "float32"    ? at::kFloat
                              : dtype == "bfloat16" ? at::kBFloat16
                              : dtype == "int64"    ? at::kLong
                                                    : at::kDouble;
  return values.to(type).reshape(shape); // every value is exact in float64
}

NamedTensors state_of(const nlohmann::json& states, const nlohmann::json& order) {
  NamedTensors tensors;
  for (const auto& name : order) {
    tensors.insert(name.get<std::string>(), tensor_of(states[name.get<std::string>()]));
  }
  return tensors;
}

// The same float32 operations in the same order as VISSL's: the averages are equal bit for
// bit (elementwise IEEE multiplies and adds, no reduction, so on any x86-64 CPU).
TEST(ModelEmaTest, EqualsVisslsEmaHookBitForBit) {
  const nlohmann::json baselines = load_baselines();
  ASSERT_EQ(baselines["cases"].size(), 2u);
  for (const auto& c : baselines["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    ModelEmaOptions options;
    options.decay = c["decay"];
    options.update_iter = c["update_iter"];
    options.warmup = c["warmup"];
    ModelEma ema(state_of(c["initial"], c["order"]), options);
    const int64_t total_steps = c["total_steps"];
    int64_t iteration = 0;
    for (const auto& step : c["steps"]) {
      const double where = static_cast<double>(iteration) / static_cast<double>(total_steps);
      EXPECT_EQ(
          ema.on_update(state_of(step["model"], c["order"]), iteration, where),
          step["updated"].get<bool>());
      NamedTensors expected = state_of(step["ema"], c["order"]);
      for (const auto& item : expected) {
        const at::Tensor& average = ema.averages()[item.key()];
        EXPECT_EQ(average.scalar_type(), item.value().scalar_type()) << item.key();
        EXPECT_TRUE(average.equal(item.value()))
            << item.key() << " after iteration " << iteration << ": max difference "
            << (average.to(at::kDouble) - item.value().to(at::kDouble)).abs().max().item<double>();
      }
      ++iteration;
    }
  }
}

TEST(ModelEmaTest, StateDictRoundTripsAndCopiesIntoAModel) {
  NamedTensors model;
  model.insert("w", at::arange(6, at::kFloat).reshape({2, 3}));
  model.insert("n", at::tensor(int64_t{4}));
  ModelEmaOptions options;
  options.decay = 0.5;
  options.warmup = 0.0;
  ModelEma ema(model, options);
  model["w"].add_(2.0);
  ema.update(model);
  EXPECT_TRUE(ema.averages()["w"].equal(at::arange(6, at::kFloat).reshape({2, 3}) + 1.0));

  ModelEma restored(model, options);
  restored.load_state_dict(ema.state_dict());
  EXPECT_TRUE(restored.averages()["w"].equal(ema.averages()["w"]));

  NamedTensors target;
  target.insert("w", at::zeros({2, 3}));
  target.insert("n", at::tensor(int64_t{0}));
  ema.copy_to(target);
  EXPECT_TRUE(target["w"].equal(ema.averages()["w"]));
  EXPECT_EQ(target["n"].item<int64_t>(), 4);
}

TEST(ModelEmaTest, NamesMismatchesAndBadOptions) {
  NamedTensors model;
  model.insert("w", at::zeros({2}));
  ModelEma ema(model, {});
  NamedTensors other;
  other.insert("v", at::zeros({2}));
  try {
    ema.update(other);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("v (not in the average)"), std::string::npos) << message;
    EXPECT_NE(message.find("w (missing)"), std::string::npos) << message;
  }
  ModelEmaOptions bad;
  bad.decay = 1.5;
  EXPECT_THROW(ModelEma(model, bad), ConfigError);
  bad = {};
  bad.update_iter = 0;
  EXPECT_THROW(ModelEma(model, bad), ConfigError);
}

} // namespace
} // namespace largo::optim::model_ema_test
