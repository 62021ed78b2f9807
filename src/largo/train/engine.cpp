#include <largo/train/engine.h>

#include <largo/core/error.h>

#include <fmt/format.h>

namespace largo::train {

namespace {

// The Largo command that runs each engine.
std::string command_of(Engine engine) {
  return engine == Engine::kExtractFeatures ? "largo extract" : "largo train";
}

} // namespace

std::string to_string(Engine engine) {
  return engine == Engine::kExtractFeatures ? "extract_features" : "train";
}

Engine engine_of(const Config& config) {
  const std::string& name = config.engine_name();
  if (name == "train") {
    return Engine::kTrain;
  }
  if (name == "extract_features") {
    return Engine::kExtractFeatures;
  }
  if (name == "extract_label_predictions") {
    throw ConfigError(
        "engine_name: extract_label_predictions (VISSL's engine that saves each sample's top "
        "predicted labels and their scores) is not available in Largo yet; `largo extract` "
        "with MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=False writes each "
        "sample's head outputs (the scores of every class), from which the top labels follow");
  }
  if (name == "extract_cluster") {
    throw ConfigError(
        "engine_name: extract_cluster (VISSL's engine that saves SwAV's cluster assignments "
        "for visualisation) is not available in Largo yet; `largo extract` with "
        "MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=False writes the head's "
        "outputs");
  }
  throw ConfigError(fmt::format(
      "engine_name: unknown engine '{}'; VISSL's engines are train, extract_features, "
      "extract_label_predictions and extract_cluster (Largo runs train and extract_features)",
      name));
}

void require_engine(const Config& config, Engine engine, const std::string& command) {
  const Engine named = engine_of(config);
  if (named == engine) {
    return;
  }
  throw ConfigError(fmt::format(
      "engine_name: {}: this config is for VISSL's {} engine, which `{}` runs, not `{}`; run "
      "`{}` with the same arguments (or override engine_name={} to use it with `{}`)",
      to_string(named),
      to_string(named),
      command_of(named),
      command,
      command_of(named),
      to_string(engine),
      command));
}

} // namespace largo::train
