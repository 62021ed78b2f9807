// The one place where the YAML config tree becomes typed options (STYLE.md rule 3).
// Every range check reports the VISSL key, the value and what is expected; features
// that the config can switch on but this version of Largo does not have yet are
// rejected with a message saying so, instead of being silently ignored.
#pragma once

#include <largo/core/config.h>
#include <largo/train/trainer_options.h>

namespace largo::train {

TrainerOptions trainer_options_from_config(const Config& config);

} // namespace largo::train
