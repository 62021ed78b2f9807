#include <largo/train/config_composition.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <cstdlib>

namespace largo::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrimaryPrefix = "config=";
constexpr const char* kFragmentPrefix = "+config/";

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

// VISSL names configs without their extension; a name with one is taken as written.
fs::path with_yaml_extension(fs::path path) {
  if (path.extension() != ".yaml" && path.extension() != ".yml") {
    path += ".yaml";
  }
  return path;
}

fs::path
existing_config_file(const fs::path& root, const fs::path& file, const std::string& argument) {
  if (fs::is_regular_file(file)) {
    return file;
  }
  throw ConfigError(fmt::format(
      "{}: no config file {} (config names are looked up under the folder that holds VISSL's "
      "config/ tree: {}; set LARGO_CONFIG_ROOT to another one)",
      argument,
      file.string(),
      fs::absolute(root).string()));
}

} // namespace

ConfigArguments parse_config_arguments(const std::vector<std::string>& arguments) {
  ConfigArguments parsed;
  for (const std::string& argument : arguments) {
    if (starts_with(argument, kPrimaryPrefix)) {
      if (parsed.primary || parsed.file) {
        throw ConfigError(fmt::format(
            "unexpected argument '{}': give one config (config=<name> or a file)", argument));
      }
      parsed.primary = argument.substr(std::string(kPrimaryPrefix).size());
    } else if (starts_with(argument, kFragmentPrefix)) {
      parsed.fragments.push_back(argument.substr(std::string(kFragmentPrefix).size()));
    } else if (argument.find('=') != std::string::npos) {
      parsed.overrides.push_back(argument);
    } else if (
        !parsed.file && !parsed.primary && parsed.overrides.empty() && parsed.fragments.empty()) {
      parsed.file = argument;
    } else {
      throw ConfigError(fmt::format(
          "unexpected argument '{}': give at most one config (a file or config=<name>), "
          "before the +config/<group>=<option> fragments and KEY=VALUE overrides",
          argument));
    }
  }
  return parsed;
}

fs::path config_root(const std::function<const char*(const char*)>& getenv) {
  const char* root = getenv ? getenv("LARGO_CONFIG_ROOT") : std::getenv("LARGO_CONFIG_ROOT");
  return root != nullptr && *root != '\0' ? fs::path(root) : fs::path("configs");
}

fs::path primary_config_file(const fs::path& root, const std::string& name) {
  const std::string argument = kPrimaryPrefix + name;
  if (name.empty()) {
    throw ConfigError(
        fmt::format("{}: name a config, e.g. config=pretrain/swav/swav_8node_resnet", argument));
  }
  return existing_config_file(root, with_yaml_extension(root / "config" / name), argument);
}

fs::path fragment_file(const fs::path& root, const std::string& fragment) {
  const std::string argument = kFragmentPrefix + fragment;
  const auto equals = fragment.find('=');
  if (equals == std::string::npos || equals == 0 || equals + 1 == fragment.size()) {
    throw ConfigError(fmt::format(
        "{}: expected +config/<group>=<option>, e.g. "
        "+config/benchmark/linear_image_classification/imagenet1k/models=regnet16Gf",
        argument));
  }
  const fs::path file = root / "config" / fragment.substr(0, equals) / fragment.substr(equals + 1);
  return existing_config_file(root, with_yaml_extension(file), argument);
}

Config compose_config(
    const ConfigArguments& arguments, const fs::path& root, const std::string& default_job) {
  Config config = Config::defaults();
  if (arguments.file) {
    config.merge_file(*arguments.file);
  } else if (arguments.primary) {
    config.merge_file(primary_config_file(root, *arguments.primary));
  } else if (!default_job.empty()) {
    config.merge_yaml(default_job, "configs/default_job.yaml");
  }
  for (const std::string& fragment : arguments.fragments) {
    config.merge_file(fragment_file(root, fragment));
  }
  for (const std::string& assignment : arguments.overrides) {
    config.apply_override(assignment);
  }
  return config;
}

} // namespace largo::train
