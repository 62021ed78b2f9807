#include <largo/train/unavailable_keys.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace largo::train {
namespace {

std::vector<UnavailableKey> build_list() {
  const std::string data_keys[][2] = {
      {"USE_DEBUGGING_SAMPLER", "the debugging sampler (an unshuffled split)"},
      {"BASE_DATASET", "a base dataset other than generic_ssl"},
      {"DATA_LIMIT_SAMPLING.IS_BALANCED", "a class-balanced DATA_LIMIT subset"},
      {"DATA_LIMIT_SAMPLING.SKIP_NUM_SAMPLES", "skipping samples before the DATA_LIMIT subset"},
      {"INPUT_KEY_NAMES", "a sample key other than data"},
      {"TARGET_KEY_NAMES", "a sample key other than label"},
      {"ENABLE_QUEUE_DATASET", "replacing unreadable images from a queue"},
      {"RANDOM_SYNTHETIC_IMAGES",
       "VISSL's random synthetic image source (use DATA_SOURCES: [synthetic])"},
      {"RANDOM_SYNTHETIC_LABELS",
       "VISSL's random synthetic label source (use DATA_SOURCES: [synthetic])"},
  };
  std::vector<UnavailableKey> keys{
      {"REPRODUCIBILITY.CUDDN_DETERMINISTIC", "switching cuDNN to deterministic kernels"},
      // DATA.TRAIN's is read (padded multi-crop batches, train/model_config.cpp).
      {"DATA.TEST.COLLATE_FUNCTION_PARAMS", "a collate function's parameters"},
  };
  for (const char* split : {"TRAIN", "TEST"}) {
    for (const auto& [key, what] : data_keys) {
      keys.push_back({fmt::format("DATA.{}.{}", split, key), what});
    }
  }
  const std::string vit = "MODEL.TRUNK.VISION_TRANSFORMERS.";
  const std::string loss = "LOSS.cross_entropy_multiple_output_single_target.";
  std::vector<UnavailableKey> more{
      {"MODEL.INPUT_TYPE", "an input type other than rgb"},
      {"MODEL.TRUNK.RESNETS.STANDARDIZE_CONVOLUTIONS",
       "weight standardization of the convolutions"},
      {vit + "name", "a ViT preset by name (set NUM_LAYERS, HIDDEN_DIM, ... instead)"},
      {vit + "QK_SCALE", "a custom attention scale"},
      {vit + "CHECKPOINT_MLP",
       "checkpointing inside ViT blocks (use MODEL.ACTIVATION_CHECKPOINTING)"},
      {vit + "CHECKPOINT_BLOCK",
       "checkpointing inside ViT blocks (use MODEL.ACTIVATION_CHECKPOINTING)"},
  };
  keys.insert(keys.end(), more.begin(), more.end());
  keys.push_back(
      {loss + "reduction", "a reduction other than mean (VISSL passes it to nothing either)"});
  std::vector<UnavailableKey> rest{
      {"OPTIMIZER.param_group_constructor",
       "a parameter group constructor other than default and dino",
       {"dino"}},
      {"METERS.name", "a meter other than accuracy_list_meter", {"accuracy_list_meter"}},
      {"METERS.names", "a meter other than accuracy_list_meter", {"[accuracy_list_meter]"}},
      {"TRAINER.TRAIN_STEP_NAME", "a train step other than standard_train_step"},
      {"CHECKPOINT.APPEND_DISTR_RUN_ID", "a RUN_ID subfolder of the checkpoint directory"},
      {"CHECKPOINT.BACKEND", "a checkpoint backend other than disk"},
      {"CHECKPOINT.LATEST_CHECKPOINT_RESUME_FILE_NUM",
       "resuming from an older checkpoint than the newest"},
  };
  keys.insert(keys.end(), rest.begin(), rest.end());
  return keys;
}

} // namespace

const std::vector<UnavailableKey>& unavailable_keys() {
  static const std::vector<UnavailableKey> keys = build_list();
  return keys;
}

void refuse_unavailable_keys(const Config& config) {
  static const Config defaults = Config::defaults();
  for (const auto& entry : unavailable_keys()) {
    const YAML::Node value = config.node(entry.key);
    const YAML::Node default_value = defaults.node(entry.key);
    if (same_config_value(value, default_value)) {
      continue;
    }
    const bool accepted = std::any_of(
        entry.also_accepted.begin(), entry.also_accepted.end(), [&](const std::string& text) {
          return same_config_value(value, YAML::Load(text));
        });
    if (accepted) {
      continue;
    }
    std::string alternatives;
    for (const auto& text : entry.also_accepted) {
      alternatives += " or " + text;
    }
    throw ConfigError(fmt::format(
        "config key {} = {}: {} is not available in this version of Largo{}; set it to {}{}",
        entry.key,
        config_value_text(value),
        entry.what,
        entry.not_built_yet ? " yet" : "",
        config_value_text(default_value),
        alternatives));
  }
}

} // namespace largo::train
