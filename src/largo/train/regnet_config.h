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
// anynet, VISSL's FSDP-only stage_checkpoints / stage_checkpointing, and a non-empty map when
// MODEL.TRUNK.NAME is not regnet (it would change nothing).
models::RegNetOptions regnet_options_from(const Config& config);

} // namespace largo::train
