// Config keys whose feature this version of Largo does not have: a VISSL file that sets
// them loads, but a run whose config changes one from its default stops before anything
// starts, with
//   config key K = V: <what> is not available in this version of Largo; set it to <default>
// instead of training something other than what the config says. Some keys also accept a
// few other values that mean the same as the default here (e.g. METERS.name:
// accuracy_list_meter, which Largo always computes).
//
// Every key of configs/defaults.yaml is either read by the trainer's config mapping
// (train/trainer_config.h), listed here, or listed as having no effect on a run by design;
// tests/train/config_key_audit_test.cpp checks that, so the list cannot rot.
#pragma once

#include <largo/core/config.h>
#include <largo/core/config_value.h>

#include <string>
#include <utility>
#include <vector>

namespace largo::train {

struct UnavailableKey {
  UnavailableKey(std::string key_,
                 std::string what_,
                 std::vector<std::string> also_accepted_ = {},
                 bool not_built_yet_ = false)
      : key(std::move(key_)),
        what(std::move(what_)),
        also_accepted(std::move(also_accepted_)),
        not_built_yet(not_built_yet_) {}
  std::string key;  // dotted config key, a leaf of configs/defaults.yaml
  std::string what; // "synchronized BatchNorm", completing "... is not available ..."
  // YAML values accepted besides the default (they change nothing here), e.g.
  // "accuracy_list_meter".
  std::vector<std::string> also_accepted;
  // The library has the feature and the trainer is to wire it: the message says "yet".
  bool not_built_yet = false;
};

// The keys, in the order of configs/defaults.yaml.
const std::vector<UnavailableKey>& unavailable_keys();

// Throws ConfigError (the message above) for the first listed key whose value in `config`
// differs from its default and from its also_accepted values.
void refuse_unavailable_keys(const Config& config);

} // namespace largo::train
