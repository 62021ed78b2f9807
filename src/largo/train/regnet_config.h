// MODEL.TRUNK.REGNET -> models::RegNetOptions. Like VISSL's, the key is a map of ClassyVision's
// RegNetParams keyword arguments (lower case: name, depth, w_0, ...), so its default stays
// VISSL's `{}`; this mapping is where each entry is checked, and an entry that would change
// nothing is refused rather than ignored. Private to the train layer.
#pragma once

#include <largo/core/config.h>
#include <largo/models/regnet.h>

#include <string>
#include <vector>

namespace largo::train {

// The entries MODEL.TRUNK.REGNET takes, in the order errors list them.
const std::vector<std::string>& regnet_config_keys();

// The RegNet of MODEL.TRUNK.REGNET: `name` (a ClassyVision preset, whose other keyword
// arguments may be set beside it, as ClassyVision's preset constructors take them), the
// explicit parameters, or `name: anynet` with one list entry per stage (depths, widths,
// group_widths, bottleneck_multipliers, strides: ClassyVision's AnyNetParams, as VISSL's
// regnet trunks take it). Throws ConfigError naming MODEL.TRUNK.REGNET.<key> for: an entry
// that is not a RegNet parameter (listing them), a value of the wrong type or range, a preset
// with a parameter the preset fixes (depth, w_0, w_a, w_m, group_width; use_se for
// regnet_x_*), anynet with a ramp parameter or a missing or shorter list, a list without
// anynet, VISSL's per-group stage_checkpointing flags, and a non-empty map when
// MODEL.TRUNK.NAME is not regnet (it would change nothing).
models::RegNetOptions regnet_options_from(const Config& config);

// VISSL's MODEL.TRUNK.REGNET.stage_checkpoints (e.g. SEER's [[2], [7], [9, 17], []]): per
// stage, the block indices at which its checkpoint groups end (a stage's start ends one too),
// as boundaries of the trunk's elements (the stem is element 0, the pool the last) for
// ActivationCheckpointingOptions::boundaries: the stem, then each group, the last group
// through the pool. Empty when the entry is absent or []. Throws ConfigError naming the key
// for more lists than stages or indices that are not increasing within (0, stage depth].
std::vector<int64_t>
regnet_checkpoint_boundaries(const Config& config, const models::RegNetOptions& regnet);

} // namespace largo::train
