// VISSL's config keys that Largo's defaults lack (configs/vissl_keys.yaml, generated from
// VISSL's own defaults by scripts/gen_vissl_keys.py): SLURM, PROFILING, other trunks
// (XCIT, Swin, BEiT, ...), other losses (DINO, MoCo, ...), benchmarks (SVM, retrieval, ...).
//
// A VISSL config may set them. At VISSL's default such a key changes nothing (the feature
// behind it is off), so it is accepted and not merged into the tree; any other value is
// refused as a VISSL feature Largo does not have, instead of as an unknown key:
//   user.yaml: config key SLURM.USE_SLURM = true: VISSL's SLURM is not available in this
//   version of Largo; Largo accepts the key only at VISSL's default, false (which changes
//   nothing): remove it
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace largo {

// VISSL's default at the dotted `key` (a value, or the map of a section such as
// LOSS.dino_loss); an undefined node when VISSL's defaults lack the key too.
YAML::Node vissl_only_default(const std::string& key);

// Throws ConfigError (above) unless every value `value` sets under `key` equals VISSL's
// default; a name under `key` that VISSL's defaults lack is an unknown key. `key` is the
// topmost key Largo's defaults lack (the section named in the message); `origin` names the
// file or override.
void check_vissl_only_value(
    const std::string& key, const YAML::Node& value, const std::string& origin);

} // namespace largo
