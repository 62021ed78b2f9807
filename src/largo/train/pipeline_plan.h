// What a run with a pipeline (DISTRIBUTED.PIPELINE_SIZE > 1) can be combined with among the
// trainer's own features, checked when the run is resolved (run_plan.h), in the config's
// words. The library's composition rules (the pipeline size against the world, ZeRO-2, FSDP,
// activation checkpointing, O2/O3, tensor parallelism, zb_h1 with CHECKPOINT_STAGES) are
// parallel::check_parallel_options', which resolve_run calls after this. Private to the train
// layer.
#pragma once

#include <largo/train/run_plan.h>

namespace largo::train {

// Throws ConfigError naming the keys for: MODEL.PIPELINE keys set without a pipeline (they
// would change nothing), a schedule shape the schedule does not take, BOUNDARIES of the wrong
// count, SyncBatchNorm, the model EMA, a linear evaluation, and a batch smaller than the
// number of micro-batches.
void check_pipeline_keys(const RunPlan& plan);

// The ranks that read different data: the world without a pipeline, its replicas with one.
int data_replicas(const RunPlan& plan);

} // namespace largo::train
