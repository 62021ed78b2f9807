// What each pipeline rank of a run will hold, before any process group exists (`largo
// estimate`, through mesh_memory_estimate.h). The blocks are cut as parallelize() cuts them
// (PipelineParallelOptions::boundaries, else balanced by its balance into pipeline size x
// virtual_stages stages, stage s on pipeline rank s % pipeline size); each rank's stages
// then give:
//   - model state: its stages' parameters, gradients and optimizer state. A stage's replicas
//     run DDP or ZeRO-1 (ZeRO-2 and FSDP do not compose with a pipeline), so this is ZeRO
//     stage 0's or 1's accounting (memory_estimate.h) over that rank's parameters;
//   - activations: what one micro-batch leaves alive in its stages, measured on a micro-batch
//     of zeros, times the most stage passes the schedule keeps in flight on that rank
//     (pipeline_memory.h). Measured on the CPU only (core/memory_tracker.h).
// With tensor parallelism inside the stages (tensor_parallel_size > 1) the trainer splits the
// model first and cuts the split one, so a balance by parameters weighs each block by the
// shards one tensor-parallel rank holds of it: the cut here weighs the blocks by `sizes`
// (those shards), and the model state is the shards'. Activations are then not measured:
// the blocks here are unsplit, and a split block's activations need its process group.
// No collectives; runs the blocks forward once per stage (and, for balance kTime, times
// every block as the trainer does, so such a cut may differ from the trainer's by noise).
#pragma once

#include <largo/parallel/estimate/memory_estimate.h>
#include <largo/parallel/pipeline/pipeline_memory.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>
#include <largo/precision/precision_policy.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace largo::parallel {

struct PipelineRankEstimate {
  int rank = 0;
  std::vector<int> stages;     // global stage indices, in order
  int64_t parameter_count = 0; // elements of its stages' parameters
  ModelStateBytes state;
  // nullopt when activations cannot be measured here (MemoryTracker::supported).
  std::optional<PipelineRankMemory> activations;
  // With checkpoint_stages: the largest of its stages' input bytes per micro-batch, all a
  // checkpointed stage keeps between its forward and backward.
  int64_t stage_input_bytes = 0;
  // The figure to plan with: the measured peak, or with checkpointing the inputs in flight
  // plus one micro-batch's activations of one stage (its recomputation in the backward).
  int64_t peak_activation_bytes = 0;
};

struct PipelineEstimate {
  PipelineShape shape;
  int num_replicas = 1;            // data-parallel replicas of every stage
  int64_t microbatch_rows = 0;     // the largest micro-batch: ceil(batch per replica / M)
  std::vector<int64_t> boundaries; // stage s = blocks [boundaries[s], boundaries[s + 1])
  std::vector<std::string> block_names;
  std::string autocast_note; // how activations were measured under the precision
  // Why the ranks' activations are nullopt ("" when they were measured).
  std::string activations_not_measured;
  std::vector<PipelineRankEstimate> ranks;
};

struct PipelineEstimateOptions {
  int pipeline_size = 2;                // PipelineOptions::size: the mesh's "pp" dimension
  PipelineParallelOptions stages;       // the cut and the schedule
  int num_replicas = 1;                 // the mesh's "dp" dimension
  int tensor_parallel_size = 1;         // the mesh's "tp": `sizes` are then one rank's shards
  int zero_stage = 0;                   // 0 (DDP) or 1 (ZeRO-1) over each stage's replicas
  MemoryEstimateOptions state;          // optimizer and master weights (world size, stage: above)
  precision::PrecisionPolicy precision; // the forward runs under its autocast, as the trainer's
  std::vector<int64_t> sample_shape;    // one sample, without the batch dimension
  int64_t batch_per_replica = 1;        // rows of one step's batch, cut into the micro-batches
};

// `blocks`: the model's chain (pipeline_blocks()), unsplit; `sizes`: its parameters as the
// optimizer groups see them (memory_estimate.h), named as in the blocks' model, as one
// tensor-parallel rank holds them when tensor_parallel_size > 1
// (tensor_parallel_parameter_sizes). Throws ConfigError for a cut parallelize() would refuse.
PipelineEstimate estimate_pipeline_ranks(
    const std::vector<PipelineBlock>& blocks,
    const std::vector<ParameterSize>& sizes,
    const PipelineEstimateOptions& options);

} // namespace largo::parallel
