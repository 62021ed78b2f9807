#include "regnet_config.h"

#include "config_checks.h"
#include "vissl_fsdp_names.h"

#include <largo/train/unavailable_keys.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace largo::train {
namespace {

const std::string kRegNetKey = "MODEL.TRUNK.REGNET";

std::string regnet_string(const YAML::Node& node, const std::string& key) {
  require(node.IsScalar(), key, config_value_text(node), "a string");
  return node.Scalar();
}

// The parameters a ClassyVision preset passes to RegNetParams itself: setting them beside
// `name` is a duplicate keyword argument there.
std::set<std::string> preset_fixed_keys(const std::string& preset) {
  std::set<std::string> fixed{"depth", "w_0", "w_a", "w_m", "group_width"};
  if (preset.rfind("regnet_x", 0) == 0) {
    fixed.insert("use_se");
  }
  return fixed;
}

// Sets the RegNetOptions field of one entry (`name` is handled by the caller).
void set_regnet_field(models::RegNetOptions& o, const std::string& entry, const YAML::Node& value) {
  const std::string key = kRegNetKey + "." + entry;
  if (entry == "depth") {
    o.depth = yaml_to_int(value, key);
  } else if (entry == "w_0") {
    o.w_0 = yaml_to_int(value, key);
  } else if (entry == "w_a") {
    o.w_a = yaml_to_double(value, key);
  } else if (entry == "w_m") {
    o.w_m = yaml_to_double(value, key);
  } else if (entry == "group_width") {
    o.group_width = yaml_to_int(value, key);
  } else if (entry == "bottleneck_multiplier") {
    o.bottleneck_multiplier = yaml_to_double(value, key);
  } else if (entry == "stem_type") {
    o.stem_type = regnet_string(value, key);
  } else if (entry == "stem_width") {
    o.stem_width = yaml_to_int(value, key);
  } else if (entry == "block_type") {
    o.block_type = regnet_string(value, key);
  } else if (entry == "activation") {
    o.activation = regnet_string(value, key);
  } else if (entry == "use_se") {
    o.use_se = yaml_to_bool(value, key);
  } else if (entry == "se_ratio") {
    o.se_ratio = yaml_to_double(value, key);
  } else if (entry == "bn_epsilon") {
    o.bn_epsilon = yaml_to_double(value, key);
  } else if (entry == "bn_momentum") {
    o.bn_momentum = yaml_to_double(value, key);
  }
}

void refuse_unknown_regnet_entry(const std::string& entry, const YAML::Node& value) {
  const std::string key = kRegNetKey + "." + entry;
  if (entry == "stage_checkpoints" || entry == "stage_checkpointing") {
    throw config_error(
        key,
        config_value_text(value),
        "no entry: VISSL's regnet_fsdp checkpoint groups are not built; every RegNet block is "
        "a trunk block, so MODEL.ACTIVATION_CHECKPOINTING and FSDP cut between blocks");
  }
  const auto& keys = regnet_config_keys();
  if (std::find(keys.begin(), keys.end(), entry) == keys.end()) {
    throw config_error(
        key,
        config_value_text(value),
        fmt::format(
            "no such RegNet parameter; MODEL.TRUNK.REGNET takes {}", fmt::join(keys, ", ")));
  }
}

} // namespace

const std::vector<std::string>& regnet_config_keys() {
  static const std::vector<std::string> keys{
      "name",
      "depth",
      "w_0",
      "w_a",
      "w_m",
      "group_width",
      "bottleneck_multiplier",
      "stem_type",
      "stem_width",
      "block_type",
      "activation",
      "use_se",
      "se_ratio",
      "bn_epsilon",
      "bn_momentum"};
  return keys;
}

models::RegNetOptions regnet_options_from(const Config& config) {
  const YAML::Node map = config.node(kRegNetKey);
  require(
      map.IsMap(),
      kRegNetKey,
      config_value_text(map),
      "a map of RegNet parameters, e.g. {name: regnet_y_400mf}");
  const std::string trunk = trunk_architecture(config);
  require(
      trunk == "regnet" || map.size() == 0,
      kRegNetKey,
      config_value_text(map),
      fmt::format(
          "{{}} with MODEL.TRUNK.NAME = {} (the RegNet keys build the regnet trunk only)", trunk));
  models::RegNetOptions options;
  std::string preset;
  if (const YAML::Node name = map["name"]) {
    preset = regnet_string(name, kRegNetKey + ".name");
    require(
        preset != "anynet",
        kRegNetKey + ".name",
        preset,
        "a RegNet preset (ClassyVision's AnyNet with explicit per-stage lists is not built)");
    options = models::regnet_preset(preset);
  }
  for (const auto& entry : map) {
    const std::string key = entry.first.as<std::string>();
    refuse_unknown_regnet_entry(key, entry.second);
    if (!preset.empty() && preset_fixed_keys(preset).count(key) != 0) {
      throw config_error(
          kRegNetKey + "." + key,
          config_value_text(entry.second),
          fmt::format(
              "no {} beside name = {}: the preset sets it (drop name to give every "
              "parameter yourself)",
              key,
              preset));
    }
    set_regnet_field(options, key, entry.second);
  }
  if (trunk == "regnet") {
    models::regnet_blocks(options); // every range and width check, in the config's words
  }
  return options;
}

} // namespace largo::train
