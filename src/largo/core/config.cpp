#include <largo/core/config.h>

#include <largo/core/embedded_configs.h>
#include <largo/core/vissl_keys.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <unordered_set>
#include <sstream>

namespace largo {
namespace {

// The largest config file or override value accepted: VISSL configs are a few KiB, and
// yaml-cpp needs ~2 KiB of memory per value, so a 50 MB file would take gigabytes.
constexpr size_t kMaxConfigBytes = 256 * 1024;

// The most values a document may hold once its aliases are expanded. Without aliases a
// value takes at least 2 bytes, so no config file within kMaxConfigBytes comes near; nine
// levels of nested aliases ("billion laughs") in 1 KB would expand to 9^9 values, and
// every walk of the tree (merge, checks, printing) would run for hours.
constexpr size_t kMaxConfigValues = kMaxConfigBytes;

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream stream(key);
  std::string part;
  while (std::getline(stream, part, '.')) {
    parts.push_back(part);
  }
  return parts;
}

std::string join_key(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

// A value as errors show it: long values (a 50,000-digit number, a 2-million-entry list)
// are cut, so a message stays readable and costs nothing to build.
std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) {
    return "null";
  }
  if (node.IsScalar()) {
    return abbreviate(node.Scalar());
  }
  if (node.size() > 64) {
    return fmt::format("a {} of {} entries", node.IsSequence() ? "list" : "map", node.size());
  }
  YAML::Emitter out;
  out << YAML::Flow << node;
  return abbreviate(out.c_str());
}

std::string to_lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The value kinds a default can have; a user value must have the same kind.
enum class Kind { Null, Bool, Int, Float, String, List, Map, OpenMap };

// Maps of keyword arguments passed on to another component: any key is accepted.
// (Empty maps in the defaults, e.g. base_optimizer, REGNET, are open too.)
bool is_open_map(const std::string& key) {
  static const std::vector<std::string> open_maps = {"MODEL.AMP_PARAMS.AMP_ARGS"};
  return std::find(open_maps.begin(), open_maps.end(), key) != open_maps.end();
}

Kind kind_of_default(const YAML::Node& node, const std::string& key) {
  if (!node.IsDefined() || node.IsNull()) {
    return Kind::Null;
  }
  if (node.IsMap()) {
    return node.size() == 0 || is_open_map(key) ? Kind::OpenMap : Kind::Map;
  }
  if (node.IsSequence()) {
    return Kind::List;
  }
  // Quoted scalars ("01", "float32") are strings whatever they look like.
  if (node.Tag() == "!") {
    return Kind::String;
  }
  if (yaml_scalar_is_bool(node)) {
    return Kind::Bool;
  }
  if (yaml_scalar_is_int(node)) {
    return Kind::Int;
  }
  if (yaml_scalar_is_number(node)) {
    return Kind::Float;
  }
  return Kind::String;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Null:
      return "any value";
    case Kind::Bool:
      return "a boolean (True/False)";
    case Kind::Int:
      return "an integer";
    case Kind::Float:
      return "a number";
    case Kind::String:
      return "a string";
    case Kind::List:
      return "a list";
    case Kind::Map:
    case Kind::OpenMap:
      return "a map";
  }
  return "?";
}

bool matches_kind(const YAML::Node& value, Kind kind) {
  switch (kind) {
    case Kind::Null:
      return true;
    case Kind::Bool:
      return value.IsScalar() && yaml_scalar_is_bool(value);
    case Kind::Int:
      return value.IsScalar() && yaml_scalar_is_int(value);
    case Kind::Float:
      return value.IsScalar() && yaml_scalar_is_number(value);
    case Kind::String:
      return value.IsScalar() || value.IsNull();
    case Kind::List:
      return value.IsSequence();
    case Kind::Map:
    case Kind::OpenMap:
      return value.IsMap() || value.IsNull();
  }
  return false;
}

// A list of numbers by default must stay a list of numbers (e.g. milestones, betas).
void check_list_elements(const YAML::Node& value, const YAML::Node& schema, const std::string& key) {
  if (schema.size() == 0) {
    return;
  }
  bool numeric_default = true;
  for (const auto& element : schema) {
    numeric_default = numeric_default && element.IsScalar() && yaml_scalar_is_number(element);
  }
  if (!numeric_default) {
    return;
  }
  for (const auto& element : value) {
    if (!element.IsScalar() || !yaml_scalar_is_number(element)) {
      throw config_error(key, describe(value), "a list of numbers");
    }
  }
}

void collect_paths(const YAML::Node& node, const std::string& path, std::vector<std::string>& out) {
  if (!node.IsMap()) {
    return;
  }
  for (const auto& entry : node) {
    std::string child = join_key(path, entry.first.as<std::string>());
    out.push_back(child);
    collect_paths(entry.second, child, out);
  }
}

std::string last_part(const std::string& key) {
  auto pos = key.rfind('.');
  return pos == std::string::npos ? key : key.substr(pos + 1);
}

// "did you mean ..." for an unknown key: the same name elsewhere in the tree (a key
// put under the wrong parent), else the closest sibling by edit distance.
std::string suggest_key(const YAML::Node& schema_root, const YAML::Node& schema_parent,
                        const std::string& parent_path, const std::string& name) {
  // The edit distance costs key length x path length per candidate; no valid key is longer
  // than this, so a longer name has no near match and gets none searched for.
  constexpr size_t kLongestSuggestedName = 64;
  if (name.size() > kLongestSuggestedName || parent_path.size() > kLongestSuggestedName * 4) {
    return "a key listed in docs/config_keys.md";
  }
  std::vector<std::string> all_paths;
  collect_paths(schema_root, "", all_paths);
  for (const auto& path : all_paths) {
    if (to_lower(last_part(path)) == to_lower(name)) {
      return path;
    }
  }
  std::string best;
  size_t best_distance = std::string::npos;
  if (schema_parent.IsMap()) {
    for (const auto& entry : schema_parent) {
      auto candidate = entry.first.as<std::string>();
      size_t distance = edit_distance(to_lower(candidate), to_lower(name));
      if (distance < best_distance) {
        best_distance = distance;
        best = join_key(parent_path, candidate);
      }
    }
  }
  if (!best.empty() && best_distance <= std::max<size_t>(3, name.size() / 2)) {
    return best;
  }
  // Nothing close among the siblings: the closest full path anywhere.
  std::string full = join_key(parent_path, name);
  best.clear();
  best_distance = std::string::npos;
  for (const auto& path : all_paths) {
    size_t distance = edit_distance(to_lower(path), to_lower(full));
    if (distance < best_distance) {
      best_distance = distance;
      best = path;
    }
  }
  return best;
}

// Every map key in `document` is a plain scalar and appears once per map (yaml-cpp keeps
// both entries of a duplicated key and reads the first, so the second, usually the intended
// one, would be ignored without a word), and the document holds at most kMaxConfigValues
// values with its aliases expanded (yaml-cpp shares an alias's node, so parsing is cheap,
// but every walk of the tree visits it once per alias).
void check_map_keys(const YAML::Node& document, const std::string& origin) {
  std::vector<YAML::Node> pending = {document};
  size_t visited = 0;
  while (!pending.empty()) {
    YAML::Node node = pending.back();
    pending.pop_back();
    if (++visited > kMaxConfigValues) {
      throw ConfigError(fmt::format(
          "{}: holds more than {} values once its YAML aliases (*name) are expanded; aliases "
          "nested in aliases multiply (a config of a few KiB holds a few hundred), so this is "
          "not a config: write the values out or nest fewer aliases",
          origin, kMaxConfigValues));
    }
    if (node.IsSequence()) {
      for (const auto& element : node) {
        pending.push_back(element);
      }
      continue;
    }
    if (!node.IsMap()) {
      continue;
    }
    std::unordered_set<std::string> seen;
    for (const auto& entry : node) {
      const YAML::Mark mark = entry.first.Mark();
      const std::string where = mark.is_null()
          ? origin
          : fmt::format("{} (line {}, column {})", origin, mark.line + 1, mark.column + 1);
      if (!entry.first.IsScalar()) {
        throw ConfigError(fmt::format("{}: a map key must be a name, got {}", where,
                                      describe(entry.first)));
      }
      if (!seen.insert(entry.first.Scalar()).second) {
        throw ConfigError(fmt::format(
            "{}: key '{}' appears twice in the same map; keep one", where,
            abbreviate(entry.first.Scalar())));
      }
      pending.push_back(entry.second);
    }
  }
}

YAML::Node parse_yaml(const std::string& text, const std::string& origin) {
  if (text.size() > kMaxConfigBytes) {
    throw ConfigError(fmt::format(
        "{}: {} bytes of YAML; a config is at most {} KiB (VISSL's are a few KiB), so this "
        "is not a config file",
        origin, text.size(), kMaxConfigBytes / 1024));
  }
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: not valid YAML: {} (line {}, column {})", origin,
                                  abbreviate(e.msg), e.mark.line + 1, e.mark.column + 1));
  }
  if (documents.size() > 1) {
    throw ConfigError(fmt::format(
        "{}: holds {} YAML documents (separated by '---'); a config is one document, so "
        "merge them or pass them as separate files",
        origin, documents.size()));
  }
  if (documents.empty()) {
    return YAML::Node();
  }
  check_map_keys(documents.front(), origin);
  return documents.front();
}

} // namespace

bool yaml_scalar_is_bool(const YAML::Node& node) {
  if (!node.IsScalar()) {
    return false;
  }
  static const std::vector<std::string> spellings = {"true", "True", "TRUE", "false", "False", "FALSE"};
  return std::find(spellings.begin(), spellings.end(), node.Scalar()) != spellings.end();
}

bool yaml_scalar_is_int(const YAML::Node& node) {
  // [-+]?[0-9]+, checked by hand: std::regex_match recurses once per character and
  // overflows the stack on a number of ~30,000 digits.
  if (!node.IsScalar()) {
    return false;
  }
  const std::string& text = node.Scalar();
  const size_t digits_start = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  return text.size() > digits_start &&
      std::all_of(text.begin() + static_cast<std::ptrdiff_t>(digits_start), text.end(),
                  [](unsigned char c) { return std::isdigit(c) != 0; });
}

bool yaml_scalar_is_number(const YAML::Node& node) {
  if (!node.IsScalar() || node.Scalar().empty()) {
    return false;
  }
  const std::string& text = node.Scalar();
  char* end = nullptr;
  errno = 0;
  std::strtod(text.c_str(), &end);
  // strtod also reads "nan"/"inf" and hex; VISSL configs never mean those as numbers.
  bool plain = text.find_first_of("nNiIxX") == std::string::npos;
  return plain && errno == 0 && end == text.c_str() + text.size();
}

double yaml_to_double(const YAML::Node& node, const std::string& key) {
  if (!yaml_scalar_is_number(node)) {
    throw config_error(key, describe(node), "a finite number");
  }
  return std::strtod(node.Scalar().c_str(), nullptr);
}

int64_t yaml_to_int(const YAML::Node& node, const std::string& key) {
  if (!yaml_scalar_is_int(node)) {
    throw config_error(key, describe(node), "an integer");
  }
  errno = 0;
  const long long value = std::strtoll(node.Scalar().c_str(), nullptr, 10);
  if (errno == ERANGE) {
    throw config_error(key, describe(node),
                       "an integer between -9223372036854775808 and 9223372036854775807");
  }
  return value;
}

bool yaml_to_bool(const YAML::Node& node, const std::string& key) {
  if (!yaml_scalar_is_bool(node)) {
    throw config_error(key, describe(node), "a boolean (True/False)");
  }
  return to_lower(node.Scalar()) == "true";
}

ConfigError config_error(const std::string& key, const std::string& value,
                         const std::string& expected) {
  return ConfigError(fmt::format("config key {} = {}: expected {}", abbreviate(key),
                                 abbreviate(value), expected));
}

std::string abbreviate(const std::string& text, size_t max_chars) {
  if (text.size() <= max_chars) {
    return text;
  }
  return fmt::format("{}... ({} characters)", text.substr(0, max_chars), text.size());
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) {
    row[j] = j;
  }
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

Config Config::defaults() {
  Config config;
  YAML::Node document = parse_yaml(embedded::defaults_yaml(), "configs/defaults.yaml");
  config.root_ = YAML::Clone(document["config"]);
  config.schema_ = YAML::Clone(document["config"]);
  return config;
}

Config Config::load(const std::vector<std::filesystem::path>& yaml_files,
                    const std::vector<std::string>& overrides) {
  Config config = defaults();
  for (const auto& file : yaml_files) {
    config.merge_file(file);
  }
  for (const auto& assignment : overrides) {
    config.apply_override(assignment);
  }
  return config;
}

void Config::merge_file(const std::filesystem::path& yaml_file) {
  std::error_code ec;
  if (std::filesystem::is_directory(yaml_file, ec)) {
    throw ConfigError(fmt::format("config file {} is a directory; give a YAML file",
                                  yaml_file.string()));
  }
  if (auto size = std::filesystem::file_size(yaml_file, ec); !ec && size > kMaxConfigBytes) {
    throw ConfigError(fmt::format(
        "config file {} has {} bytes; a config is at most {} KiB (VISSL's are a few KiB), so "
        "this is not a config file",
        yaml_file.string(), size, kMaxConfigBytes / 1024));
  }
  std::ifstream in(yaml_file);
  if (!in) {
    throw ConfigError(fmt::format("cannot read config file {}: {}", yaml_file.string(),
                                  std::filesystem::exists(yaml_file) ? "permission denied"
                                                                     : "no such file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  merge_yaml(text.str(), yaml_file.string());
}

void Config::merge_yaml(const std::string& yaml_text, const std::string& origin) {
  YAML::Node document = parse_yaml(yaml_text, origin);
  if (!document.IsDefined() || document.IsNull()) {
    return; // an empty file changes nothing
  }
  if (!document.IsMap()) {
    throw ConfigError(fmt::format("{}: the top level must be a map of config keys, got {}",
                                  origin, describe(document)));
  }
  if (document["engine_name"]) {
    take_engine_name(document["engine_name"], origin);
  }
  if (document["config"]) {
    // VISSL's layout; its other top-level keys are Hydra's and carry no settings here.
    for (const auto& entry : document) {
      auto name = entry.first.as<std::string>();
      if (name != "config" && name != "VERSION" && name != "node_id" && name != "engine_name") {
        throw ConfigError(fmt::format(
            "{}: unknown top-level key '{}'; config keys go under 'config:'", origin, name));
      }
    }
    merge_node(document["config"], root_, schema_, "", origin);
    return;
  }
  // A bare fragment, without its engine_name if it has one. (A new node: assigning to a
  // YAML::Node that refers to `document` would overwrite the document itself.)
  YAML::Node fragment(YAML::NodeType::Map);
  for (const auto& entry : document) {
    const auto name = entry.first.as<std::string>();
    if (name != "engine_name") {
      fragment[name] = entry.second;
    }
  }
  merge_node(fragment, root_, schema_, "", origin);
}

void Config::take_engine_name(const YAML::Node& value, const std::string& origin) {
  if (!value.IsScalar() || value.Scalar().empty()) {
    throw ConfigError(fmt::format(
        "{}: engine_name = {}: expected the name of one of VISSL's engines, e.g. "
        "extract_features",
        origin, describe(value)));
  }
  engine_name_ = value.Scalar();
}

void Config::merge_node(const YAML::Node& user, YAML::Node& target, const YAML::Node& schema,
                        const std::string& path, const std::string& origin) {
  if (user.IsNull()) {
    return;
  }
  if (!user.IsMap()) {
    throw ConfigError(fmt::format("{}: config key {} = {}: expected a map", origin,
                                  path.empty() ? "config" : path, describe(user)));
  }
  for (const auto& entry : user) {
    const auto name = entry.first.as<std::string>();
    const std::string key = join_key(path, name);
    const YAML::Node& value = entry.second;
    YAML::Node schema_child = schema.IsMap() ? schema[name] : YAML::Node();
    if (!schema_child.IsDefined() && vissl_only_default(key).IsDefined()) {
      // A VISSL key Largo lacks: accepted at VISSL's default, where it changes nothing.
      check_vissl_only_value(key, value, origin);
      continue;
    }
    if (!schema_child.IsDefined()) {
      throw ConfigError(fmt::format("{}: unknown config key {}; did you mean {}?", origin,
                                    abbreviate(key), suggest_key(schema_, schema, path, name)));
    }
    Kind kind = kind_of_default(schema_child, key);
    if (!matches_kind(value, kind)) {
      throw ConfigError(fmt::format("{}: {}", origin,
                                    config_error(key, describe(value), kind_name(kind)).what()));
    }
    if (kind == Kind::Int) {
      try {
        yaml_to_int(value, key); // beyond int64: refused here, not clamped later
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("{}: {}", origin, e.what()));
      }
    }
    if (kind == Kind::Map) {
      YAML::Node target_child = target[name];
      merge_node(value, target_child, schema_child, key, origin);
      continue;
    }
    if (kind == Kind::List) {
      check_list_elements(value, schema_child, key);
    }
    if (kind == Kind::OpenMap && value.IsMap() && target[name].IsMap()) {
      // Keyword maps merge entry by entry, like VISSL's OmegaConf merge.
      YAML::Node target_child = target[name];
      for (const auto& kwarg : value) {
        target_child[kwarg.first.as<std::string>()] = YAML::Clone(kwarg.second);
      }
      record_given(key);
      continue;
    }
    target[name] = YAML::Clone(value);
    record_given(key);
  }
}

void Config::record_given(const std::string& key) {
  if (recording_) {
    given_.insert(key);
  }
}

bool Config::given(const std::string& key) const {
  if (given_.count(key) > 0) {
    return true;
  }
  const std::string below = key + ".";
  const auto child = given_.lower_bound(below);
  return child != given_.end() && child->rfind(below, 0) == 0;
}

void Config::set_resolved(const std::string& key, const YAML::Node& value) {
  YAML::Node wrapped = value;
  const auto parts = split_key(key);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    YAML::Node parent(YAML::NodeType::Map);
    parent[*it] = wrapped;
    wrapped = parent;
  }
  recording_ = false;
  try {
    merge_node(wrapped, root_, schema_, "", "the resolved " + key);
  } catch (...) {
    recording_ = true;
    throw;
  }
  recording_ = true;
}

void Config::apply_override(const std::string& assignment) {
  std::string text = assignment;
  // Hydra's "+KEY=VALUE" adds a key the defaults lack. Here it is checked like any other
  // override: a key nothing reads would change nothing, so only keys of Largo's tree and
  // entries of keyword maps (AMP_ARGS, base_optimizer, ...) are taken.
  if (!text.empty() && text[0] == '+') {
    text.erase(0, 1);
  }
  auto equals = text.find('=');
  if (equals == std::string::npos || equals == 0) {
    throw ConfigError(fmt::format(
        "command-line override '{}': expected KEY=VALUE, e.g. OPTIMIZER.momentum=0.9",
        abbreviate(assignment)));
  }
  std::string key = text.substr(0, equals);
  const std::string value_text = text.substr(equals + 1);
  const std::string origin = fmt::format("command-line override '{}'", abbreviate(assignment));
  YAML::Node value = parse_yaml(value_text, origin);
  if (key == "engine_name") { // Hydra's top level, not a key under config:
    take_engine_name(value, origin);
    return;
  }
  if (key.rfind("config.", 0) == 0) {
    key.erase(0, 7);
  }
  auto parts = split_key(key);

  // Build {A: {B: value}} and merge it like a file, so the same validation applies.
  YAML::Node wrapped = value;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    YAML::Node parent(YAML::NodeType::Map);
    parent[*it] = wrapped;
    wrapped = parent;
  }
  merge_node(wrapped, root_, schema_, "", origin);
}

bool Config::has(const std::string& key) const {
  YAML::Node node = root_;
  for (const auto& part : split_key(key)) {
    const YAML::Node& parent = node;
    if (!parent.IsMap() || !parent[part].IsDefined()) {
      return false;
    }
    node.reset(parent[part]);
  }
  return true;
}

YAML::Node Config::node(const std::string& key) const {
  YAML::Node node = root_;
  for (const auto& part : split_key(key)) {
    const YAML::Node& parent = node;
    if (!parent.IsMap() || !parent[part].IsDefined()) {
      throw ConfigError(fmt::format("config key {} is not set", key));
    }
    node.reset(parent[part]);
  }
  return node;
}

bool Config::get_bool(const std::string& key) const {
  return yaml_to_bool(node(key), key);
}

int64_t Config::get_int(const std::string& key) const {
  return yaml_to_int(node(key), key);
}

double Config::get_double(const std::string& key) const {
  return yaml_to_double(node(key), key);
}

std::string Config::get_string(const std::string& key) const {
  YAML::Node value = node(key);
  if (value.IsNull()) {
    return "";
  }
  if (!value.IsScalar()) {
    throw config_error(key, describe(value), "a string");
  }
  return value.Scalar();
}

std::vector<int64_t> Config::get_int_list(const std::string& key) const {
  YAML::Node value = node(key);
  if (!value.IsSequence()) {
    throw config_error(key, describe(value), "a list of integers");
  }
  std::vector<int64_t> out;
  for (const auto& element : value) {
    out.push_back(yaml_to_int(element, key));
  }
  return out;
}

std::vector<double> Config::get_double_list(const std::string& key) const {
  YAML::Node value = node(key);
  if (!value.IsSequence()) {
    throw config_error(key, describe(value), "a list of numbers");
  }
  std::vector<double> out;
  for (const auto& element : value) {
    out.push_back(yaml_to_double(element, key));
  }
  return out;
}

std::vector<std::string> Config::get_string_list(const std::string& key) const {
  YAML::Node value = node(key);
  if (!value.IsSequence()) {
    throw config_error(key, describe(value), "a list of strings");
  }
  std::vector<std::string> out;
  for (const auto& element : value) {
    if (!element.IsScalar()) {
      throw config_error(key, describe(value), "a list of strings");
    }
    out.push_back(element.Scalar());
  }
  return out;
}

std::string Config::to_yaml() const {
  YAML::Emitter out;
  out << YAML::BeginMap << YAML::Key << "engine_name" << YAML::Value << engine_name_
      << YAML::Key << "config" << YAML::Value << root_ << YAML::EndMap;
  return std::string("# @package _global_\n# The effective config of this run, written by Largo.\n") +
      out.c_str() + "\n";
}

} // namespace largo
