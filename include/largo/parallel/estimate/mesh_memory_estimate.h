// What every rank of a run will hold, from the model, the mesh and the library's options,
// before any process group exists: `largo estimate` prints it; a library user sizes a run
// with it. Per rank:
//   - model state (parameters, gradients, optimizer state; memory_estimate.h's accounting)
//     of the parameters that rank holds: with tensor parallelism ("tp" > 1) the plan's
//     shards (tensor_parallel_plan.h), then under the data-parallel mode over "dp": DDP, or
//     ZeRO-1/2/3 (FSDP) sharding over the replicas;
//   - with a pipeline ("pp" > 1), per pipeline rank: its stages' model state and its
//     activations per micro-batch and at the schedule's peak (pipeline_rank_estimate.h);
//   - with FSDP's stage 3, the units it gathers during a step (transient).
// Activations without a pipeline are not estimated (they depend on the batch the caller
// runs; sequential_checkpoint_plan.h measures them for checkpointing).
//
// With tensor parallelism (composing with DDP, ZeRO-1/2 and FSDP, parallelize.h) the rows
// are over each rank's slices; FSDP's transient gathers are then not estimated. With a
// pipeline too
// (pp x dp x tp), each pipeline rank's figures are one tp rank's shards of its stages, cut
// where the trainer cuts the split model; their activations are not measured (a split
// block runs only with its group; pipeline_rank_estimate.h).
//
// No collectives.
#pragma once

#include <largo/optim/param_groups.h>
#include <largo/parallel/estimate/memory_estimate.h>
#include <largo/parallel/mesh/device_mesh.h>
#include <largo/parallel/parallelize.h>
#include <largo/parallel/pipeline/pipeline_rank_estimate.h>

#include <torch/nn/module.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace largo::parallel {

struct RunMemoryEstimateOptions {
  // The modes (data_parallelism, pipeline, tensor_parallel_size, fsdp) and the precision
  // policy: O2/O3 cast the parameters (O2 with float32 master weights in the optimizer).
  ParallelOptions parallel;
  optim::OptimizerSpec optimizer;
  // Which parameters train (a linear evaluation's head_prefix) and the groups' order, which
  // is ZeRO's flat layout (optim::build_param_groups).
  optim::ParamGroupOptions param_groups;
  // For a pipeline's activations: one sample without the batch dimension, and the rows of
  // one step's batch per data-parallel replica (cut into the micro-batches).
  std::vector<int64_t> sample_shape;
  int64_t batch_per_replica = 1;
};

// One ZeRO stage's row: Largo's layout and the paper's formula (memory_estimate.h).
struct ZeroStageEstimate {
  ModelStateBytes estimated;
  ModelStateBytes formula;
};

// FSDP (stage 3) gathers units during a step: those kept whole (the root, the float32 unit)
// throughout, one block unit at a time (two with prefetch).
struct FsdpGatherEstimate {
  std::vector<std::string> kept_units; // "root", "float32"
  int64_t kept_bytes = 0;
  int64_t num_block_units = 0;
  std::string largest_block_unit = "none";
  int64_t largest_block_unit_bytes = 0;
};

struct MeshMemoryEstimate {
  std::vector<MeshDimension> mesh;
  int data_parallel_size = 1;   // "dp": the replicas ZeRO shards over
  int tensor_parallel_size = 1; // "tp"
  at::ScalarType parameter_dtype = at::kFloat;
  std::optional<at::ScalarType> master_weights_dtype;
  int64_t trained_numel = 0; // the whole model's, unsplit
  int64_t frozen_numel = 0;
  // What one rank holds before ZeRO shards it (one of "tp" when > 1: every tp rank holds
  // the same sizes), in the optimizer groups' order.
  std::vector<ParameterSize> rank_parameters;
  int64_t rank_parameter_numel = 0;
  MemoryEstimateOptions state_options; // optimizer, master weights, dp, the run's stage, rank 0
  // Without a pipeline: rank 0's model state (the largest: ZeRO's padding sits in the last
  // shard) at every ZeRO stage over "dp", [0] DDP .. [3] FSDP; the run's is
  // zero_stages[state_options.stage].
  std::array<ZeroStageEstimate, 4> zero_stages{};
  std::optional<FsdpGatherEstimate> fsdp_gathers; // without tensor parallelism and a pipeline
  std::optional<PipelineEstimate> pipeline;       // "pp" > 1: per pipeline rank
};

// `module`: the model as the run trains it, built the same way (a pipeline needs a
// models::TrunkHeadModel, the chain parallelize() cuts). It is cast to the precision's
// parameter dtype (O2, O3), as parallelize() would; nothing else is changed. `mesh`:
// mesh_dimensions(options.parallel, world size). Throws OptionError for options the mesh
// does not take (a "tp" or "pp" size other than the options'; with both, what
// check_parallel_options refuses: a cut by time, recomputed stages) and what
// check_tensor_parallel_plan and estimate_pipeline_ranks throw.
MeshMemoryEstimate estimate_memory(
    const std::shared_ptr<torch::nn::Module>& module,
    const std::vector<MeshDimension>& mesh,
    const RunMemoryEstimateOptions& options);

} // namespace largo::parallel
