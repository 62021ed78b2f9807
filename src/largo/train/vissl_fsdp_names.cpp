#include "vissl_fsdp_names.h"

#include "config_checks.h"
#include "parallel_config.h"

#include <largo/models/model_factory.h>

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

namespace largo::train {
namespace {

// VISSL's FSDP-wrapped models (register_model_trunk / register_model_head with an _fsdp
// name) and the plain model each wraps, described for when Largo lacks it.
struct FsdpModel {
  std::string plain;
  std::string description;
};

const std::map<std::string, FsdpModel>& vissl_fsdp_models() {
  static const std::map<std::string, FsdpModel> models{
      {"regnet_fsdp", {"regnet", "the regnet trunk"}},
      {"vision_transformer_fsdp", {"vision_transformer", "the vision_transformer trunk"}},
      {"xcit_fsdp", {"xcit", "VISSL's XCiT trunk (xcit)"}},
      {"swav_head_fsdp", {"swav_head", "the swav_head"}},
      {"mlp_fsdp", {"mlp", "the mlp head"}},
      {"eval_mlp_fsdp", {"eval_mlp", "the eval_mlp head"}},
      {"dino_head_fsdp", {"dino_head", "the dino_head"}},
  };
  return models;
}

// The plain model `name` stands for when it is one of VISSL's _fsdp names, after the checks:
// a plain model Largo has (one of `plain`), FSDP on. Any other name comes back as it is.
std::string architecture(
    const Config& config,
    const std::string& name,
    const std::string& key,
    const std::vector<std::string>& plain) {
  const auto it = vissl_fsdp_models().find(name);
  if (it == vissl_fsdp_models().end()) {
    return name;
  }
  const FsdpModel& model = it->second;
  require(
      std::find(plain.begin(), plain.end(), model.plain) != plain.end(),
      key,
      name,
      fmt::format(
          "a model Largo builds: {} is VISSL's FSDP-wrapped copy of {}, which this version of "
          "Largo does not have",
          name,
          model.description));
  require(
      fsdp_requested(config),
      key,
      name,
      fmt::format(
          "{0} without FSDP: {1} is VISSL's FSDP-wrapped {0}, which runs only under FSDP. Set "
          "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True or TRAINER.TASK_NAME="
          "self_supervision_fsdp_task (Largo then wraps {0} in FSDP), or name the plain {0}",
          model.plain,
          name));
  return model.plain;
}

} // namespace

std::string trunk_architecture(const Config& config) {
  return architecture(
      config,
      config.get_string("MODEL.TRUNK.NAME"),
      "MODEL.TRUNK.NAME",
      models::supported_trunk_names());
}

std::string
head_architecture(const Config& config, const std::string& name, const std::string& key) {
  return architecture(config, name, key, {"mlp", "eval_mlp", "swav_head", "dino_head"});
}

} // namespace largo::train
