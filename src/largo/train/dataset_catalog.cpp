#include <largo/train/dataset_catalog.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>

namespace largo::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kCatalogVariable = "VISSL_DATASET_CATALOG_PATH";

ConfigError catalog_error(const fs::path& file, const std::string& what) {
  return ConfigError(fmt::format(
      "dataset catalog {}: {} (expected VISSL's dataset_catalog.json format: "
      "{{\"<name>\": {{\"train\": [images, labels], \"val\": [images, labels]}}}})",
      file.string(),
      what));
}

CatalogSplit read_split(const YAML::Node& paths, const fs::path& file, const std::string& where) {
  if (!paths.IsSequence() || paths.size() < 1 || paths.size() > 2) {
    throw catalog_error(file, where + " is not a list of [images, labels]");
  }
  for (const auto& path : paths) {
    if (!path.IsScalar()) {
      throw catalog_error(file, where + " holds a value that is not a path");
    }
  }
  return CatalogSplit{paths[0].Scalar(), paths.size() > 1 ? paths[1].Scalar() : std::string()};
}

std::string names_text(const std::vector<std::string>& values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}

} // namespace

DatasetCatalog DatasetCatalog::read(const fs::path& file) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string()); // JSON is read as the YAML it is
  } catch (const YAML::Exception& e) {
    throw catalog_error(file, fmt::format("cannot be read: {}", e.what()));
  }
  if (!root.IsMap()) {
    throw catalog_error(file, "the top level is not a map of dataset names");
  }
  DatasetCatalog catalog;
  catalog.file_ = file;
  for (const auto& dataset : root) {
    const std::string name = dataset.first.as<std::string>();
    if (!dataset.second.IsMap()) {
      throw catalog_error(file, fmt::format("\"{}\" is not a map of splits", name));
    }
    for (const auto& split : dataset.second) {
      const std::string split_name = split.first.as<std::string>();
      catalog.datasets_[name][split_name] =
          read_split(split.second, file, fmt::format("\"{}\".\"{}\"", name, split_name));
    }
  }
  return catalog;
}

std::optional<CatalogSplit>
DatasetCatalog::find(const std::string& name, const std::string& split) const {
  const auto dataset = datasets_.find(name);
  if (dataset == datasets_.end()) {
    return std::nullopt;
  }
  const auto paths = dataset->second.find(split);
  if (paths == dataset->second.end()) {
    return std::nullopt;
  }
  return paths->second;
}

std::vector<std::string> DatasetCatalog::names() const {
  std::vector<std::string> names;
  for (const auto& dataset : datasets_) {
    names.push_back(dataset.first);
  }
  return names;
}

std::optional<fs::path> find_dataset_catalog(
    const fs::path& config_root, const std::function<const char*(const char*)>& getenv) {
  const char* variable = getenv ? getenv(kCatalogVariable) : std::getenv(kCatalogVariable);
  if (variable != nullptr && *variable != '\0') {
    if (!fs::is_regular_file(variable)) {
      throw ConfigError(fmt::format(
          "{}={}: no such file (point it at a dataset_catalog.json, or unset it)",
          kCatalogVariable,
          variable));
    }
    return fs::path(variable);
  }
  const fs::path beside_configs = config_root / "config" / "dataset_catalog.json";
  if (fs::is_regular_file(beside_configs)) {
    return beside_configs;
  }
  return std::nullopt;
}

namespace {

// Whether `prefix`'s DATASET_NAMES leave its DATA_PATHS for the catalog to give.
bool names_datasets_without_paths(const Config& config, const std::string& prefix) {
  static const Config defaults = Config::defaults();
  const std::string names = prefix + ".DATASET_NAMES";
  if (!config.given(names) ||
      config.get_string_list(prefix + ".DATA_SOURCES") == std::vector<std::string>{"synthetic"}) {
    return false;
  }
  const bool paths_given = config.given(prefix + ".DATA_PATHS");
  if (paths_given && !config.get_string_list(prefix + ".DATA_PATHS").empty()) {
    return false;
  }
  // Largo's own dataset at Largo's default path is what the defaults say, not a guess.
  return paths_given || config.get_string_list(names) != defaults.get_string_list(names);
}

std::string unresolved_message(
    const std::string& key,
    const std::vector<std::string>& names,
    const std::string& dataset,
    const std::string& split,
    const std::optional<DatasetCatalog>& catalog) {
  const std::string start = fmt::format(
      "config key {} = {}: {} has no DATA_PATHS",
      key,
      names_text(names),
      key.substr(0, key.rfind('.')));
  if (!catalog) {
    return fmt::format(
        "{} and no dataset catalog was found to resolve {} (set {} to a dataset_catalog.json, "
        "put one at config/dataset_catalog.json under LARGO_CONFIG_ROOT, or give DATA_PATHS)",
        start,
        dataset,
        kCatalogVariable);
  }
  return fmt::format(
      "{}, and the dataset catalog {} has no \"{}\" split of {} (it names: {}); add it there or "
      "give DATA_PATHS",
      start,
      catalog->file().string(),
      split,
      dataset,
      fmt::join(catalog->names(), ", "));
}

} // namespace

std::vector<std::string>
resolve_dataset_names(Config& config, const std::optional<fs::path>& catalog_file) {
  std::optional<DatasetCatalog> catalog;
  std::vector<std::string> notes;
  for (const auto& [prefix, split] : {std::pair{"DATA.TRAIN", "train"}, {"DATA.TEST", "val"}}) {
    if (!names_datasets_without_paths(config, prefix)) {
      continue;
    }
    if (!catalog && catalog_file) {
      catalog = DatasetCatalog::read(*catalog_file);
    }
    const std::string key = std::string(prefix) + ".DATASET_NAMES";
    const std::vector<std::string> names = config.get_string_list(key);
    YAML::Node images(YAML::NodeType::Sequence), labels(YAML::NodeType::Sequence);
    for (const std::string& name : names) {
      const auto paths = catalog ? catalog->find(name, split) : std::nullopt;
      if (!paths) {
        throw ConfigError(unresolved_message(key, names, name, split, catalog));
      }
      images.push_back(paths->images);
      labels.push_back(paths->labels);
    }
    config.set_resolved(std::string(prefix) + ".DATA_PATHS", images);
    const bool file_list = config.get_string_list(std::string(prefix) + ".DATA_SOURCES") ==
                           std::vector<std::string>{"disk_filelist"};
    if (file_list && !config.given(std::string(prefix) + ".LABEL_PATHS")) {
      config.set_resolved(std::string(prefix) + ".LABEL_PATHS", labels);
    }
    notes.push_back(fmt::format(
        "{} {} through the dataset catalog {}: DATA_PATHS {}{}",
        key,
        names_text(names),
        catalog->file().string(),
        names_text(config.get_string_list(std::string(prefix) + ".DATA_PATHS")),
        file_list ? fmt::format(
                        ", LABEL_PATHS {}",
                        names_text(config.get_string_list(std::string(prefix) + ".LABEL_PATHS")))
                  : ""));
  }
  return notes;
}

} // namespace largo::train
