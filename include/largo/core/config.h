// The configuration tree: VISSL's key names and defaults (configs/defaults.yaml),
// merged with a user's YAML file and then with command-line overrides.
//
// Validation happens while merging, so nothing runs on a bad config:
//  - a key the defaults do not have is an error that names the closest valid key, unless
//    VISSL has it (core/vissl_keys.h): then it is accepted at VISSL's default and refused
//    at any other value as a VISSL feature Largo lacks;
//  - a value whose type differs from the default's (bool, int, float, string, list,
//    map) is an error naming key, value and the expected type.
// Maps whose default is empty (`{}`, e.g. AMP_ARGS, base_optimizer) and keys whose
// default is null accept anything. Range checks belong to the components that read
// the values (see train/trainer_config.h), which report them through config_error().
// A file or override is refused when it is larger than 256 KiB, holds more than one YAML
// document, a duplicated key or a key that is not a plain name, or expands through nested
// YAML aliases to more than 262,144 values ("billion laughs"), and integers must fit in
// 64 bits; errors name the file (with line and column) or the key.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <largo/core/error.h>

namespace largo {

class Config {
 public:
  // Largo's defaults only (the embedded configs/defaults.yaml).
  static Config defaults();

  // Defaults, then each file in order (e.g. a base job, then the user's file),
  // then each "KEY=VALUE" override. Throws ConfigError on the first problem.
  static Config load(const std::vector<std::filesystem::path>& yaml_files,
                     const std::vector<std::string>& overrides = {});

  // Merge a YAML document over this config. Accepts VISSL's layout (a top-level
  // `config:` node beside VERSION/node_id/engine_name) or a bare fragment of the
  // tree (as in the tutorials' snippets; an engine_name beside it is taken too). `origin`
  // names the source in errors.
  void merge_yaml(const std::string& yaml_text, const std::string& origin);
  void merge_file(const std::filesystem::path& yaml_file);

  // Apply one command-line override. Forms: "A.B=v", "config.A.B=v" (VISSL/Hydra),
  // "engine_name=NAME" (Hydra's top-level key, see engine_name()),
  // "+A.B=v" (Hydra's form for a key the defaults lack: checked like the others, so it adds
  // only entries of keyword maps such as AMP_ARGS, and VISSL keys at VISSL's default).
  // v is parsed as YAML ("[1,2]", "true").
  void apply_override(const std::string& assignment);

  bool has(const std::string& key) const;
  // Whether a config file or an override set `key` (or a key under it), rather than Largo's
  // defaults alone; its value may still equal the default. (The dataset catalog resolves a
  // DATASET_NAMES whose DATA_PATHS nobody gave.)
  bool given(const std::string& key) const;
  // Sets `key` (one of Largo's) to `value` as a resolution of the config itself (the dataset
  // catalog's paths), without counting it as given. Throws ConfigError as a merge would.
  void set_resolved(const std::string& key, const YAML::Node& value);
  // The node at a dotted key ("OPTIMIZER.param_schedulers.lr"); throws if absent.
  YAML::Node node(const std::string& key) const;

  // Typed getters: throw ConfigError naming the key when the value does not convert.
  bool get_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<int64_t> get_int_list(const std::string& key) const;
  std::vector<double> get_double_list(const std::string& key) const;
  std::vector<std::string> get_string_list(const std::string& key) const;

  // VISSL's engine_name, Hydra's top-level key beside `config:` (VISSL's default: train):
  // which of VISSL's engines runs this config. Taken from a file's top level or an
  // "engine_name=NAME" override, the last one given winning; which engines Largo runs, and
  // with which command, is the train layer's (train/engine.h).
  const std::string& engine_name() const {
    return engine_name_;
  }

  // The effective config as YAML in VISSL's layout (written into the run directory), with
  // its engine_name.
  std::string to_yaml() const;

  const YAML::Node& root() const {
    return root_;
  }

 private:
  Config() = default;
  void merge_node(const YAML::Node& user, YAML::Node& target, const YAML::Node& schema,
                  const std::string& path, const std::string& origin);
  void record_given(const std::string& key);

  void take_engine_name(const YAML::Node& value, const std::string& origin);

  YAML::Node root_; // the tree under `config:`
  std::string engine_name_ = "train";
  YAML::Node schema_; // the defaults, for validating merges
  std::set<std::string> given_; // keys set by merge_yaml / apply_override, dotted
  bool recording_ = true;       // whether a merge counts its keys as given
};

// Conversions of YAML scalars, shared by the config and the components that read
// free-form maps (TRANSFORMS entries, HEAD.PARAMS kwargs). They accept VISSL's
// spellings: True/False/true/false, 1e-5 (as a number), .9.
bool yaml_scalar_is_bool(const YAML::Node& node);
bool yaml_scalar_is_int(const YAML::Node& node);
bool yaml_scalar_is_number(const YAML::Node& node);
double yaml_to_double(const YAML::Node& node, const std::string& key);
int64_t yaml_to_int(const YAML::Node& node, const std::string& key);
bool yaml_to_bool(const YAML::Node& node, const std::string& key);

// A ConfigError for `key` having `value`, saying what was expected:
// "DATA.TRAIN.BATCHSIZE_PER_REPLICA = 0: expected an integer > 0".
ConfigError config_error(const std::string& key, const std::string& value,
                         const std::string& expected);

// `text` itself when short, else its first `max_chars` characters and its length: what
// errors show of user input (a key or value may be megabytes long).
std::string abbreviate(const std::string& text, size_t max_chars = 80);

// The Levenshtein edit distance, used to suggest the closest valid key.
size_t edit_distance(const std::string& a, const std::string& b);

} // namespace largo
