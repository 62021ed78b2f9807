// VISSL's engines, as a config's engine_name names them (Hydra's top-level key; VISSL's
// tools/run_distributed_engines.py runs the one named, `train` by default). Largo runs each
// through a command of its own: `largo train` and `largo eval` the train engine, `largo
// extract` the extract_features engine (train/feature_extraction.h), so that a command never
// does something other than its name says; a config for another engine is refused naming
// the command that runs it. No collectives.
#pragma once

#include <largo/core/config.h>

#include <string>

namespace largo::train {

enum class Engine { kTrain, kExtractFeatures };

// VISSL's name: "train", "extract_features".
std::string to_string(Engine engine);

// The engine `config` names. Throws ConfigError naming engine_name for VISSL's engines Largo
// lacks (extract_label_predictions, extract_cluster) and for a name VISSL lacks too.
Engine engine_of(const Config& config);

// Throws ConfigError when `config` names an engine other than `engine`, naming the Largo
// command that runs the config's engine; `command` is the one that was run ("largo train").
void require_engine(const Config& config, Engine engine, const std::string& command);

} // namespace largo::train
