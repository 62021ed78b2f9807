// The ParallelModel of each data-parallel mode (parallelize.h), built by parallelize() after
// the precision policy was applied and the optimizer's groups point at what it steps (the
// O2 masters). Each constructor builds the optimizer and the mode's wrapper (steps 3 and 4
// of the order in parallelize.h). Private to the parallel layer.
#pragma once

#include <largo/parallel/parallelize.h>

namespace largo::parallel {

// Every mode composes with the mesh's "tp" dimension, which ParallelModel holds
// (tensor_parallel/tensor_parallel_dimension.h): no mode has a class of its own for it.

// DDP, ZeRO-1, ZeRO-2 and FSDP (or one process): the data-parallel strategy over the mesh's
// "dp" group, at the ZeRO stage (0-3) of options.data_parallelism (data_parallel_model.cpp).
std::unique_ptr<ParallelModel> make_data_parallel_model(
    torch::nn::AnyModule model,
    std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options,
    std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer);

// Whether options.tensor_parallel_size > 1.
bool tensor_parallel_enabled(const ParallelOptions& options);
// The checks of the options alone (check_parallel_options; tensor_parallel_checks.cpp): the
// modes tensor parallelism composes with. Throws OptionError.
void check_tensor_parallel_options(const ParallelOptions& options);
// That `module` is sharded for options.tensor_parallel_size (the mesh's "tp" size), and not
// sharded without tensor parallelism. Throws OptionError naming
// ParallelOptions::tensor_parallel_size.
void check_tensor_parallel_module(const ParallelOptions& options, const torch::nn::Module& module);

// Pipeline stages over the mesh's "pp" groups, DDP over each stage's replicas ("dp").
std::unique_ptr<ParallelModel> make_pipeline_model(
    std::vector<PipelineBlock> blocks, std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options, std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer);

} // namespace largo::parallel
