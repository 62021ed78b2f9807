#include <largo/core/vissl_keys.h>

#include <largo/core/config.h>
#include <largo/core/config_value.h>
#include <largo/core/embedded_configs.h>
#include <largo/core/error.h>

#include <fmt/format.h>

#include <sstream>

namespace largo {
namespace {

const YAML::Node& vissl_only_tree() {
  static const YAML::Node tree = YAML::Load(embedded::vissl_keys_yaml())["config"];
  return tree;
}

void check_value(
    const std::string& section,
    const std::string& key,
    const YAML::Node& value,
    const YAML::Node& vissl_default,
    const std::string& origin) {
  if (vissl_default.IsMap() && vissl_default.size() > 0 && value.IsMap()) {
    for (const auto& entry : value) {
      const std::string name = entry.first.Scalar();
      const std::string child = key + "." + name;
      const YAML::Node child_default = vissl_default[name];
      if (!child_default.IsDefined()) {
        throw ConfigError(fmt::format(
            "{}: unknown config key {}: neither Largo nor VISSL has it (VISSL's {} holds {})",
            origin,
            abbreviate(child),
            key,
            config_value_text(vissl_default)));
      }
      check_value(section, child, entry.second, child_default, origin);
    }
    return;
  }
  if (same_config_value(value, vissl_default)) {
    return;
  }
  // VISSL's SLURM section writes and submits a batch script; Largo's workers read what srun
  // sets instead, so the way there is a short batch script.
  const bool slurm = section.rfind("SLURM", 0) == 0;
  if (slurm && key != "SLURM.USE_SLURM" && value.IsMap() == vissl_default.IsMap()) {
    // VISSL reads SLURM's other keys only to submit the job under USE_SLURM, which is refused
    // here when on: with it off they change nothing in VISSL either, so any value is accepted
    // (VISSL's configs name a CONSTRAINT, a PARTITION, ...).
    return;
  }
  throw ConfigError(fmt::format(
      "{}: config key {} = {}: VISSL's {} is not available in this version of Largo; Largo "
      "accepts the key only at VISSL's default, {} (which changes nothing): remove it{}",
      origin,
      key,
      abbreviate(config_value_text(value)),
      section,
      abbreviate(config_value_text(vissl_default)),
      slurm ? ", and start the workers with `srun largo train CONFIG` in an sbatch script "
              "(docs/launch.md, SLURM)"
            : ""));
}

} // namespace

YAML::Node vissl_only_default(const std::string& key) {
  YAML::Node node = vissl_only_tree();
  std::stringstream parts(key);
  std::string part;
  while (std::getline(parts, part, '.')) {
    if (!node.IsMap()) {
      return YAML::Node(YAML::NodeType::Undefined);
    }
    const YAML::Node& parent = node;
    YAML::Node child = parent[part];
    if (!child.IsDefined()) {
      return YAML::Node(YAML::NodeType::Undefined);
    }
    node.reset(child);
  }
  return node;
}

void check_vissl_only_value(
    const std::string& key, const YAML::Node& value, const std::string& origin) {
  check_value(key, key, value, vissl_only_default(key), origin);
}

} // namespace largo
