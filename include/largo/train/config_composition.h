// A run's config composed as VISSL's command line writes it (Hydra's forms):
//
//   largo train
//     config=benchmark/linear_image_classification/imagenet1k/eval_resnet_8gpu_transfer_in1k_linear
//     +config/benchmark/linear_image_classification/imagenet1k/models=regnet16Gf
//     config.DATA.TRAIN.DATA_PATHS=[/data/in1k/train] OPTIMIZER.num_epochs=1
//
// `config=<name>` is the primary config, <root>/config/<name>.yaml; each
// `+config/<group>=<option>` a fragment, <root>/config/<group>/<option>.yaml, merged after it
// in the order given (VISSL's model, dataset and optimizer fragments); KEY=VALUE (or
// config.KEY=VALUE) overrides come last. The root is the folder that holds VISSL's `config/`
// tree (VISSL's `configs/`): $LARGO_CONFIG_ROOT, else ./configs. A plain file path in place
// of config= still works. Files carry VISSL's layout (`# @package _global_`, a `config:`
// map), and lists replace lists, as in VISSL's OmegaConf merge. No collectives.
#pragma once

#include <largo/core/config.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace largo::train {

// The config arguments of a command, sorted by form.
struct ConfigArguments {
  std::optional<std::filesystem::path> file; // a config file by path
  std::optional<std::string> primary;        // config=<name>
  std::vector<std::string> fragments;        // +config/<group>=<option>, as "<group>=<option>"
  std::vector<std::string> overrides;        // KEY=VALUE, config.KEY=VALUE, +KEY=VALUE
};

// Sorts `arguments` (what follows the command name). Throws ConfigError for an argument of
// no form (a second file, a file after an override, `config=` twice).
ConfigArguments parse_config_arguments(const std::vector<std::string>& arguments);

// Where config= and +config/... are looked up: $LARGO_CONFIG_ROOT, else "configs" (relative
// to the working directory). `getenv` is for tests (std::getenv by default).
std::filesystem::path config_root(const std::function<const char*(const char*)>& getenv = nullptr);

// The file a `config=` name or a `<group>=<option>` fragment names under `root`; throws
// ConfigError naming the argument, the file looked for and how to point at another root
// when there is none.
std::filesystem::path
primary_config_file(const std::filesystem::path& root, const std::string& name);
std::filesystem::path fragment_file(const std::filesystem::path& root, const std::string& fragment);

// Largo's defaults, then the file (or the primary config), the fragments and the overrides
// in that order; `default_job` (YAML text) when neither a file nor a primary config is given.
Config compose_config(
    const ConfigArguments& arguments,
    const std::filesystem::path& root,
    const std::string& default_job = "");

} // namespace largo::train
