#include <largo/parallel/estimate/mesh_memory_estimate.h>

#include <largo/core/error.h>
#include <largo/models/trunk_head_model.h>
#include <largo/parallel/data_parallel/fully_sharded_data_parallel.h>
#include <largo/parallel/pipeline/pipeline_stages.h>
#include <largo/parallel/tensor_parallel/tensor_parallel_plan.h>

#include <fmt/format.h>

namespace largo::parallel {
namespace {

// The size of the dimension named `name`; 1 when the mesh has none.
int dimension_size(const std::vector<MeshDimension>& mesh, const std::string& name) {
  for (const MeshDimension& dimension : mesh) {
    if (dimension.name == name) {
      return dimension.size;
    }
  }
  return 1;
}

int mesh_world_size(const std::vector<MeshDimension>& mesh) {
  int size = 1;
  for (const MeshDimension& dimension : mesh) {
    size *= dimension.size;
  }
  return size;
}

void require_dimension(
    const std::vector<MeshDimension>& mesh, const std::string& name, int size, const char* key) {
  if (dimension_size(mesh, name) != size) {
    throw OptionError(
        fmt::format("estimate_memory mesh \"{}\" dimension", name),
        describe_sizes(mesh),
        fmt::format(
            "{} of ParallelOptions::{} ({}): the mesh of mesh_dimensions(options, world)",
            name,
            key,
            size));
  }
}

// What the precision policy makes of the parameters: Apex O2 keeps low-precision parameters
// with float32 master weights in the optimizer, O3 low-precision parameters only; O1 and
// PyTorch AMP keep float32 parameters (they cast per op, which is activation memory).
void set_precision(const precision::PrecisionPolicy& policy, MeshMemoryEstimate& estimate) {
  if (!policy.cast_model) {
    return;
  }
  estimate.parameter_dtype = policy.low_precision;
  if (policy.master_weights) {
    estimate.master_weights_dtype = at::kFloat;
  }
}

// The model's parameters in the precision's dtype (casting `module`), and what one rank of
// "tp" holds of them.
void size_parameters(
    torch::nn::Module& module,
    const RunMemoryEstimateOptions& options,
    MeshMemoryEstimate& estimate) {
  set_precision(options.parallel.precision, estimate);
  if (estimate.parameter_dtype != at::kFloat) {
    module.to(estimate.parameter_dtype);
  }
  const auto groups = optim::build_param_groups(module, options.param_groups);
  const std::vector<ParameterSize> sizes = parameter_sizes(module, groups);
  for (const auto& size : sizes) {
    (size.trained ? estimate.trained_numel : estimate.frozen_numel) += size.numel;
  }
  estimate.rank_parameters =
      estimate.tensor_parallel_size > 1
          ? tensor_parallel_parameter_sizes(module, sizes, estimate.tensor_parallel_size)
          : sizes;
  for (const auto& size : estimate.rank_parameters) {
    estimate.rank_parameter_numel += size.numel;
  }
}

// Stage 3 holds more than its shards during a step: the units it gathers, in the
// parameters' dtype or as compute copies (the BatchNorm parameters then a float32 unit).
FsdpGatherEstimate fsdp_gathers(
    const std::shared_ptr<torch::nn::Module>& module,
    const FullyShardedDataParallelOptions& options) {
  FsdpGatherEstimate gathers;
  for (const auto& unit : plan_fsdp_units(module, options)) {
    const int64_t bytes = unit.numel * static_cast<int64_t>(c10::elementSize(unit.gathered_dtype));
    if (unit.position < 0) {
      gathers.kept_bytes += bytes;
      gathers.kept_units.push_back(unit.name);
      continue;
    }
    ++gathers.num_block_units;
    if (bytes > gathers.largest_block_unit_bytes) {
      gathers.largest_block_unit_bytes = bytes;
      gathers.largest_block_unit = unit.name;
    }
  }
  return gathers;
}

// Each pipeline rank's stages, from the whole model's chain of blocks.
PipelineEstimate pipeline_ranks(
    const std::shared_ptr<torch::nn::Module>& module,
    const RunMemoryEstimateOptions& options,
    const MeshMemoryEstimate& estimate) {
  auto* model = dynamic_cast<models::TrunkHeadModelImpl*>(module.get());
  if (model == nullptr) {
    throw OptionError(
        "estimate_memory module",
        module->name(),
        "a models::TrunkHeadModel with a pipeline (ParallelOptions::pipeline.size > 1): the "
        "chain of blocks parallelize() cuts into stages");
  }
  PipelineEstimateOptions pipeline;
  pipeline.pipeline_size = options.parallel.pipeline.size;
  pipeline.stages = options.parallel.pipeline.stages;
  pipeline.num_replicas = estimate.data_parallel_size;
  pipeline.tensor_parallel_size = estimate.tensor_parallel_size;
  pipeline.zero_stage = estimate.state_options.stage;
  pipeline.state = estimate.state_options;
  pipeline.precision = options.parallel.precision;
  pipeline.sample_shape = options.sample_shape;
  pipeline.batch_per_replica = options.batch_per_replica;
  return estimate_pipeline_ranks(pipeline_blocks(*model), estimate.rank_parameters, pipeline);
}

} // namespace

MeshMemoryEstimate estimate_memory(
    const std::shared_ptr<torch::nn::Module>& module,
    const std::vector<MeshDimension>& mesh,
    const RunMemoryEstimateOptions& options) {
  const ParallelOptions& parallel = options.parallel;
  require_dimension(mesh, "tp", parallel.tensor_parallel_size, "tensor_parallel_size");
  require_dimension(mesh, "pp", parallel.pipeline.size, "pipeline.size");
  MeshMemoryEstimate estimate;
  estimate.mesh = mesh;
  estimate.data_parallel_size = dimension_size(mesh, "dp");
  estimate.tensor_parallel_size = parallel.tensor_parallel_size;
  if (estimate.tensor_parallel_size > 1 && parallel.pipeline.enabled()) {
    // What parallelize() refuses with both: a cut by time (each shard would time its own)
    // and recomputed stages, which the estimate could not reproduce either.
    check_parallel_options(parallel, mesh_world_size(mesh));
  }
  if (estimate.tensor_parallel_size > 1 && parallel.sequence_parallel) {
    // It changes no parameter's size, but a model whose tokens it cannot split is refused
    // here as apply_tensor_parallel_plan() refuses it.
    TensorParallelPlanOptions plan;
    plan.sequence_parallel = true;
    check_tensor_parallel_plan(*module, estimate.tensor_parallel_size, plan);
  }

  size_parameters(*module, options, estimate);
  MemoryEstimateOptions& state = estimate.state_options;
  state.optimizer = options.optimizer;
  state.master_weights_dtype = estimate.master_weights_dtype;
  state.world_size = estimate.data_parallel_size;
  state.stage = zero_stage(parallel.data_parallelism);
  state.offload_optimizer = parallel.offload_optimizer;
  state.rank = 0; // the padding sits in the last shard: rank 0 holds the most
  if (parallel.pipeline.enabled()) {
    estimate.pipeline = pipeline_ranks(module, options, estimate);
    return estimate;
  }
  for (int stage = 0; stage < 4; ++stage) {
    MemoryEstimateOptions at_stage = state;
    at_stage.stage = stage;
    at_stage.offload_optimizer = state.offload_optimizer && stage > 0; // DDP's is not sharded
    estimate.zero_stages[static_cast<size_t>(stage)] = {
        estimate_model_state_bytes(estimate.rank_parameters, at_stage),
        zero_formula_bytes(estimate.rank_parameters, at_stage)};
  }
  if (estimate.tensor_parallel_size == 1) {
    estimate.fsdp_gathers = fsdp_gathers(module, parallel.fsdp);
  }
  return estimate;
}

} // namespace largo::parallel
