// `largo estimate CONFIG [KEY=VALUE ...]`: per-rank bytes of parameters, gradients and
// optimizer state for ZeRO stages 0-3 at the configured world size, from the config's model,
// optimizer and dataset, without training (parallel/memory_estimate.h; docs/zero_memory.md);
// with a pipeline, per pipeline rank with its peak activations instead (pipeline_estimate.h).
// With a pipeline (DISTRIBUTED.PIPELINE_SIZE > 1), which ZeRO and FSDP do not compose with,
// per pipeline rank instead: its stages' model state and peak activations under the schedule
// (pipeline_estimate.h; docs/pipeline.md).
#pragma once

#include <largo/core/config.h>

namespace largo::app {

// Prints the table to stdout; returns the exit code (0). Throws ConfigError for a config
// `largo train` would reject.
int run_estimate_command(const Config& config);

} // namespace largo::app
