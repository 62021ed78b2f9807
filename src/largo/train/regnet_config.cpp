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

// ClassyVision's AnyNetParams lists (VISSL's `name: anynet`), one entry per stage, in the
// order RegNetStageSpec is filled from them.
const std::vector<std::string>& anynet_list_keys() {
  static const std::vector<std::string> keys{
      "depths", "widths", "group_widths", "bottleneck_multipliers", "strides"};
  return keys;
}

bool is_anynet_list(const std::string& entry) {
  const auto& keys = anynet_list_keys();
  return std::find(keys.begin(), keys.end(), entry) != keys.end();
}

// An entry that does not go with `preset` ("" without name): what a ClassyVision preset
// fixes, AnyNet's lists without anynet, and the ramp's parameters beside anynet (VISSL builds
// AnyNetParams from the lists and reads none of them).
void refuse_misplaced_entry(
    const std::string& preset, const std::string& entry, const YAML::Node& value) {
  const std::string key = kRegNetKey + "." + entry;
  if (preset == "anynet") {
    const std::set<std::string> ramp{
        "depth", "w_0", "w_a", "w_m", "group_width", "bottleneck_multiplier"};
    require(
        ramp.count(entry) == 0,
        key,
        config_value_text(value),
        fmt::format(
            "no {} beside name = anynet: its lists (depths, widths, group_widths, "
            "bottleneck_multipliers, strides) give each stage's parameters",
            entry));
    return;
  }
  require(
      !is_anynet_list(entry),
      key,
      config_value_text(value),
      fmt::format("no {} without name = anynet (AnyNet's per-stage lists)", entry));
  if (!preset.empty() && preset_fixed_keys(preset).count(entry) != 0) {
    throw config_error(
        key,
        config_value_text(value),
        fmt::format(
            "no {} beside name = {}: the preset sets it (drop name to give every "
            "parameter yourself)",
            entry,
            preset));
  }
}

// One of AnyNet's lists: a number > 0 per stage.
std::vector<double> anynet_list(const YAML::Node& map, const std::string& entry) {
  const std::string key = kRegNetKey + "." + entry;
  const YAML::Node list = map[entry];
  require(
      list && list.IsSequence() && list.size() > 0,
      key,
      list ? config_value_text(list) : "(not set)",
      "a list with one entry per stage: name = anynet takes depths, widths, group_widths, "
      "bottleneck_multipliers and strides");
  const bool multipliers = entry == "bottleneck_multipliers";
  std::vector<double> values;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string item = fmt::format("{}[{}]", key, i);
    const double value = multipliers ? yaml_to_double(list[i], item)
                                     : static_cast<double>(yaml_to_int(list[i], item));
    require(
        value > 0,
        item,
        config_value_text(list[i]),
        multipliers ? "a number > 0" : "an integer > 0");
    values.push_back(value);
  }
  return values;
}

// The stages of `name: anynet`, from its five lists (as long as each other: ClassyVision's zip
// would drop the longer lists' tails).
std::vector<models::RegNetStageSpec> anynet_stages(const YAML::Node& map) {
  const auto& keys = anynet_list_keys();
  std::vector<std::vector<double>> lists;
  for (const std::string& entry : keys) {
    lists.push_back(anynet_list(map, entry));
    require(
        lists.back().size() == lists.front().size(),
        kRegNetKey + "." + entry,
        config_value_text(map[entry]),
        fmt::format("{} entries, one per stage as depths has", lists.front().size()));
  }
  std::vector<models::RegNetStageSpec> stages(lists.front().size());
  for (size_t i = 0; i < stages.size(); ++i) {
    stages[i].depth = static_cast<int64_t>(lists[0][i]);
    stages[i].width = static_cast<int64_t>(lists[1][i]);
    stages[i].group_width = static_cast<int64_t>(lists[2][i]);
    stages[i].bottleneck_multiplier = lists[3][i];
    stages[i].stride = static_cast<int64_t>(lists[4][i]);
  }
  return stages;
}

void refuse_unknown_regnet_entry(const std::string& entry, const YAML::Node& value) {
  const std::string key = kRegNetKey + "." + entry;
  if (entry == "stage_checkpointing") {
    throw config_error(
        key,
        config_value_text(value),
        "no entry: per-group checkpointing flags are not built; stage_checkpoints' groups are "
        "checkpointed as MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING says");
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
      "bn_momentum",
      "depths",
      "widths",
      "group_widths",
      "bottleneck_multipliers",
      "strides",
      "stage_checkpoints"};
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
    if (preset != "anynet") {
      options = models::regnet_preset(preset);
    }
  }
  for (const auto& entry : map) {
    const std::string key = entry.first.as<std::string>();
    refuse_unknown_regnet_entry(key, entry.second);
    refuse_misplaced_entry(preset, key, entry.second);
    set_regnet_field(options, key, entry.second);
  }
  if (preset == "anynet") {
    options.stages = anynet_stages(map);
  }
  if (trunk == "regnet") {
    models::regnet_blocks(options); // every range and width check, in the config's words
  }
  return options;
}

std::vector<int64_t>
regnet_checkpoint_boundaries(const Config& config, const models::RegNetOptions& regnet) {
  const YAML::Node given = config.node(kRegNetKey)["stage_checkpoints"];
  if (!given || (given.IsSequence() && given.size() == 0)) {
    return {};
  }
  const std::string key = kRegNetKey + ".stage_checkpoints";
  const std::vector<models::RegNetStageSpec> stages = models::regnet_stages(regnet);
  require(
      given.IsSequence() && given.size() <= stages.size(),
      key,
      config_value_text(given),
      fmt::format("a list of at most {} lists (one per stage) of block indices", stages.size()));
  std::vector<int64_t> boundaries{0}; // the stem, element 0, is a segment of its own
  int64_t first_block = 1;
  for (size_t s = 0; s < stages.size(); ++s) {
    boundaries.push_back(first_block); // VISSL's groups do not cross stages
    const int64_t depth = stages[s].depth;
    int64_t previous = 0;
    const YAML::Node ends = s < given.size() ? given[s] : YAML::Node(YAML::NodeType::Sequence);
    require(ends.IsSequence(), key, config_value_text(given), "a list of block indices per stage");
    for (const YAML::Node& entry : ends) {
      const int64_t end = yaml_to_int(entry, key);
      require(
          end > previous && end <= depth,
          key,
          config_value_text(given),
          fmt::format(
              "increasing block indices in (0, {}] for stage {} ({} blocks)", depth, s + 1, depth));
      if (end < depth) {
        boundaries.push_back(first_block + end);
      }
      previous = end;
    }
    first_block += depth;
  }
  boundaries.push_back(first_block + 1); // the last group runs through the pool
  return boundaries;
}

} // namespace largo::train
