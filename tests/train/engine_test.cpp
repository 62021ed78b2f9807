// VISSL's engine_name as Largo's commands read it: train and extract_features are Largo's
// two engines; a command given a config for the other one is refused naming the command
// that runs it; VISSL's engines Largo lacks, and names VISSL lacks too, are refused by name.
#include <largo/train/engine.h>

#include <largo/core/error.h>

#include <gtest/gtest.h>

#include <string>

namespace largo::train {
namespace {

Config with_engine(const std::string& name) {
  Config config = Config::defaults();
  config.apply_override("engine_name=" + name);
  return config;
}

// The ConfigError message of `body`, or "(no ConfigError)".
template <typename Body>
std::string error_of(Body body) {
  try {
    body();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(EngineTest, NamesLargosTwoEngines) {
  EXPECT_EQ(engine_of(Config::defaults()), Engine::kTrain); // VISSL's default
  EXPECT_EQ(engine_of(with_engine("train")), Engine::kTrain);
  EXPECT_EQ(engine_of(with_engine("extract_features")), Engine::kExtractFeatures);
  EXPECT_EQ(to_string(Engine::kTrain), "train");
  EXPECT_EQ(to_string(Engine::kExtractFeatures), "extract_features");
}

TEST(EngineTest, RefusesVisslsOtherEnginesAndUnknownNames) {
  for (const std::string name : {"extract_label_predictions", "extract_cluster"}) {
    const std::string message = error_of([&] { engine_of(with_engine(name)); });
    EXPECT_NE(message.find("engine_name: " + name), std::string::npos) << message;
    EXPECT_NE(message.find("not available in Largo yet"), std::string::npos) << message;
  }
  const std::string message = error_of([] { engine_of(with_engine("extract_feature")); });
  EXPECT_NE(message.find("engine_name: unknown engine 'extract_feature'"), std::string::npos)
      << message;
}

TEST(EngineTest, RequireEngineNamesTheCommandThatRunsTheConfig) {
  const Config extraction = with_engine("extract_features");
  EXPECT_NO_THROW(require_engine(extraction, Engine::kExtractFeatures, "largo extract"));
  const std::string message =
      error_of([&] { require_engine(extraction, Engine::kTrain, "largo eval"); });
  EXPECT_NE(
      message.find("engine_name: extract_features: this config is for VISSL's extract_features "
                   "engine, which `largo extract` runs, not `largo eval`"),
      std::string::npos)
      << message;
  EXPECT_NE(message.find("override engine_name=train"), std::string::npos) << message;
  // A training config under extraction names `largo train`.
  const std::string training = error_of(
      [] { require_engine(Config::defaults(), Engine::kExtractFeatures, "largo extract"); });
  EXPECT_NE(training.find("which `largo train` runs"), std::string::npos) << training;
  EXPECT_NO_THROW(require_engine(Config::defaults(), Engine::kTrain, "largo train"));
}

} // namespace
} // namespace largo::train
