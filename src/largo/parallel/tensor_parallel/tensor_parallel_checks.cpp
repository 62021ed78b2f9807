// What parallelize() checks of tensor parallelism before anything is built: the options it
// composes with (check_parallel_options) and that the module was split for the mesh's "tp"
// size. How it composes is tensor_parallel_dimension.h's.
#include "../parallel_modes.h"

#include <largo/core/error.h>
#include <largo/parallel/tensor_parallel/tensor_parallel.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

namespace largo::parallel {

bool tensor_parallel_enabled(const ParallelOptions& options) {
  return options.tensor_parallel_size > 1;
}

void check_tensor_parallel_options(const ParallelOptions& options) {
  if (options.sequence_parallel && options.tensor_parallel_size <= 1) {
    throw OptionError(
        "ParallelOptions::sequence_parallel",
        "true",
        fmt::format(
            "false with ParallelOptions::tensor_parallel_size {} (sequence parallelism splits "
            "the tokens of tensor-parallel layers: set a size > 1)",
            options.tensor_parallel_size));
  }
  if (!tensor_parallel_enabled(options)) {
    return;
  }
  if (options.data_parallelism == DataParallelism::kFsdp && options.fsdp.compute_dtype) {
    throw OptionError(
        "FullyShardedDataParallelOptions::compute_dtype",
        c10::toString(*options.fsdp.compute_dtype),
        "none with tensor parallelism: FSDP's compute copies of tensor-parallel shards are "
        "not built (use autocast for mixed precision)");
  }
  const PipelineParallelOptions& stages = options.pipeline.stages;
  if (options.pipeline.enabled() && stages.balance() == StageBalance::kTime) {
    throw OptionError(
        "PipelineParallelOptions::balance",
        to_string(stages.balance()),
        "parameters with tensor parallelism: each tensor-parallel rank would time the blocks "
        "itself and could cut the model elsewhere (give boundaries, or balance by parameters)");
  }
  if (options.pipeline.enabled() && stages.checkpoint_stages()) {
    throw OptionError(
        "PipelineParallelOptions::checkpoint_stages",
        "true",
        "false with tensor parallelism: recomputing tensor-parallel stages is not built");
  }
  if (options.precision.cast_model) {
    throw OptionError(
        "ParallelOptions::precision",
        options.precision.describe(),
        "autocast (O1, pytorch) or float32 with tensor parallelism: a cast of a tensor-parallel "
        "module (O2, O3) is "
        "not built");
  }
  if (options.activation_checkpointing.enabled()) {
    throw OptionError(
        "ParallelOptions::tensor_parallel_size",
        std::to_string(options.tensor_parallel_size),
        "1 (off) with ActivationCheckpointingOptions: checkpointing a "
        "tensor-parallel module is not built");
  }
}

void check_tensor_parallel_module(const ParallelOptions& options, const torch::nn::Module& module) {
  std::set<int64_t> sharded_sizes; // of the module's tensor-parallel layers
  for (const auto& item : module.named_modules()) {
    if (const auto* layer = dynamic_cast<const TensorParallelModule*>(item.value().get())) {
      sharded_sizes.insert(layer->tensor_parallel_size());
    }
  }
  sharded_sizes.erase(1); // a layer "split" over one rank is whole
  const std::string size = std::to_string(options.tensor_parallel_size);
  if (!tensor_parallel_enabled(options)) {
    if (!sharded_sizes.empty()) {
      throw OptionError(
          "ParallelOptions::tensor_parallel_size",
          size,
          fmt::format(
              "{}, the size of the mesh's \"tp\" group the module's layers were split over "
              "(without it, parallelize() would train each rank's shards as if they were the "
              "whole model)",
              *sharded_sizes.begin()));
    }
    return;
  }
  if (sharded_sizes.empty()) {
    throw OptionError(
        "ParallelOptions::tensor_parallel_size",
        size,
        "1 for a module without tensor-parallel layers, or split the module over the mesh's "
        "\"tp\" group (apply_tensor_parallel_plan, or apply_tensor_parallel for a user's own "
        "layers) before building the param groups and parallelize()");
  }
  if (sharded_sizes != std::set<int64_t>{options.tensor_parallel_size}) {
    throw OptionError(
        "ParallelOptions::tensor_parallel_size",
        size,
        fmt::format(
            "the size the module was sharded for: its layers are split over {} rank(s)",
            fmt::join(sharded_sizes, ", ")));
  }
}

} // namespace largo::parallel
