// `largo estimate CONFIG [KEY=VALUE ...]`: what every rank of the configured run will hold,
// from the config's model, optimizer, dataset and mesh, without training: a printer over
// parallel::estimate_memory (parallel/estimate/mesh_memory_estimate.h; docs/zero_memory.md).
//   - Without a pipeline: per-rank bytes of parameters, gradients and optimizer state for
//     ZeRO stages 0-3 over the data-parallel replicas, the configured stage marked, and what
//     stage 3 gathers during a step. With DISTRIBUTED.TENSOR_PARALLEL_SIZE > 1 the same
//     table over each rank's tensor-parallel shards (docs/tensor_parallel.md).
//   - With a pipeline (DISTRIBUTED.PIPELINE_SIZE > 1), which ZeRO-2 and FSDP do not compose
//     with: per pipeline rank its stages' model state and peak activations under the schedule
//     (docs/pipeline.md).
#pragma once

#include <largo/core/config.h>

namespace largo::app {

// Prints the table to stdout; returns the exit code (0). Throws ConfigError for a config
// `largo train` would reject.
int run_estimate_command(const Config& config);

} // namespace largo::app
