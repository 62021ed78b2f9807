// `largo estimate` with a pipeline (DISTRIBUTED.PIPELINE_SIZE > 1): what each pipeline rank
// will hold. The model is cut as the trainer cuts it (MODEL.PIPELINE.BOUNDARIES, else
// balanced by MODEL.PIPELINE.BALANCE into PIPELINE_SIZE x VIRTUAL_STAGES stages, stage s on
// pipeline rank s % PIPELINE_SIZE); each rank's stages then give:
//   - model state: its stages' parameters, gradients and optimizer state. A stage's replicas
//     run DDP or ZeRO-1 (ZeRO-2 and FSDP do not compose with a pipeline), so this is ZeRO
//     stage 0's or 1's accounting (parallel/memory_estimate.h) over that rank's parameters;
//   - activations: what one micro-batch leaves alive in its stages, measured on a micro-batch
//     of zeros, times the most stage passes the schedule keeps in flight on that rank
//     (parallel/pipeline_memory.h). Measured on the CPU only (core/memory_tracker.h).
// No collectives; runs the model forward once per stage (and, for BALANCE time, times every
// block as the trainer does, so such a cut may differ from the trainer's by noise).
#pragma once

#include <largo/models/trunk_head_model.h>
#include <largo/parallel/memory_estimate.h>
#include <largo/parallel/pipeline_memory.h>
#include <largo/train/run_plan.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace largo::app {

struct PipelineRankEstimate {
  int rank = 0;
  std::vector<int> stages;     // global stage indices, in order
  int64_t parameter_count = 0; // elements of its stages' parameters
  parallel::ModelStateBytes state;
  // nullopt when activations cannot be measured here (MemoryTracker::supported).
  std::optional<parallel::PipelineRankMemory> activations;
  // With MODEL.PIPELINE.CHECKPOINT_STAGES: the largest of its stages' input bytes per
  // micro-batch, all a checkpointed stage keeps between its forward and backward.
  int64_t stage_input_bytes = 0;
  // The figure to plan with: the measured peak, or with checkpointing the inputs in flight
  // plus one micro-batch's activations of one stage (its recomputation in the backward).
  int64_t peak_activation_bytes = 0;
};

struct PipelineEstimate {
  parallel::PipelineShape shape;
  int num_replicas = 1;            // data-parallel replicas of every stage
  int64_t microbatch_rows = 0;     // the largest micro-batch: ceil(batch per rank / M)
  std::vector<int64_t> boundaries; // stage s = blocks [boundaries[s], boundaries[s + 1])
  std::vector<std::string> block_names;
  std::string autocast_note; // how activations were measured under the precision
  std::vector<PipelineRankEstimate> ranks;
};

// `sizes`: the model's parameters as the optimizer groups see them (memory_estimate.h), named
// as in `model`; `state_options`: optimizer and master weights (world size and stage are set
// here). Throws ConfigError for a cut the trainer would refuse.
PipelineEstimate estimate_pipeline(
    const train::RunPlan& plan,
    models::TrunkHeadModelImpl& model,
    const std::vector<parallel::ParameterSize>& sizes,
    parallel::MemoryEstimateOptions state_options);

} // namespace largo::app
