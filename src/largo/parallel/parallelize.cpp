#include <largo/parallel/parallelize.h>

#include <largo/core/error.h>
#include <largo/models/module_device.h>
#include <largo/models/trunk_head_model.h>
#include <largo/parallel/activation_checkpointing/checkpointed_segments.h>
#include <largo/parallel/activation_checkpointing/sequential_checkpoint_plan.h>
#include <largo/parallel/data_parallel/host_offload_optimizer.h>
#include <largo/parallel/mesh/device_mesh.h>
#include <largo/parallel/tensor_parallel/tensor_parallel_plan.h>

#include "parallel_modes.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::parallel {
namespace {

// What composes with a pipeline: DDP or ZeRO-1 over the stages' replicas (ZeRO-2 and FSDP
// reduce inside every backward, which the schedule interleaves), recomputation per stage,
// autocast.
void check_pipeline_options(const ParallelOptions& options, int world_size) {
  const PipelineOptions& pipeline = options.pipeline;
  if (!pipeline.enabled()) {
    return;
  }
  const std::string size = std::to_string(pipeline.size);
  mesh_dimensions(options, world_size); // the pipeline size divides the world
  if (options.data_parallelism != DataParallelism::kDdp &&
      options.data_parallelism != DataParallelism::kZero1) {
    throw OptionError(
        "ParallelOptions::pipeline.size",
        size,
        fmt::format(
            "1 with ParallelOptions::data_parallelism = {}: a pipeline composes with DDP or "
            "ZeRO-1 over each stage's replicas (ZeRO-2 and FSDP reduce or gather inside every "
            "backward, which the schedule runs once per micro-batch)",
            to_string(options.data_parallelism)));
  }
  if (options.activation_checkpointing.enabled()) {
    throw OptionError(
        "ParallelOptions::pipeline.size",
        size,
        "1 with ActivationCheckpointingOptions: a pipeline recomputes stage by stage, use "
        "PipelineParallelOptions::checkpoint_stages");
  }
  if (options.precision.cast_model) {
    throw OptionError("ParallelOptions::precision", options.precision.describe(),
                      "autocast (O1, pytorch) or float32 with a pipeline: a cast of the stages "
                      "(O2, O3) is not built");
  }
  check_pipeline_parallel_options(pipeline.stages);
}

// Offload moves a sharded optimizer, one data-parallel replica's pieces of the whole model.
void check_offload_options(const ParallelOptions& options) {
  if (!options.offload_optimizer) {
    return;
  }
  const std::string option = "ParallelOptions::offload_optimizer";
  if (options.data_parallelism == DataParallelism::kDdp) {
    throw OptionError(
        option,
        "true",
        "false with ParallelOptions::data_parallelism = DDP: offload moves a "
        "sharded optimizer's state (ZeRO-1, ZeRO-2 or FSDP)");
  }
  if (options.pipeline.enabled()) {
    throw OptionError(
        option,
        "true",
        "false with a pipeline (ParallelOptions::pipeline.size > 1): offloading "
        "the stages' optimizers is not built");
  }
  if (options.tensor_parallel_size > 1) {
    throw OptionError(
        option,
        "true",
        "false with tensor parallelism (ParallelOptions::tensor_parallel_size > "
        "1): offloading the shards' optimizer state is not built");
  }
}

} // namespace

std::vector<MeshDimension> mesh_dimensions(const ParallelOptions& options, int world_size) {
  const int pp = options.pipeline.size;
  if (pp < 1 || world_size % pp != 0) {
    throw OptionError(
        "ParallelOptions::pipeline.size",
        std::to_string(pp),
        fmt::format(
            "a divisor of the {} ranks (pipeline ranks x data-parallel "
            "replicas x tensor-parallel shards)",
            world_size));
  }
  const int tp = options.tensor_parallel_size;
  if (tp < 1 || world_size % (pp * tp) != 0) {
    throw OptionError(
        "ParallelOptions::tensor_parallel_size",
        std::to_string(tp),
        fmt::format(
            "a divisor of the {} ranks / pipeline size {} (pipeline ranks x data-parallel "
            "replicas x tensor-parallel shards)",
            world_size,
            pp));
  }
  return pp_dp_tp_dimensions(pp, world_size / (pp * tp), tp);
}

std::shared_ptr<DeviceMesh>
make_device_mesh(std::shared_ptr<comm::ProcessGroup> world, const ParallelOptions& options) {
  if (!world) {
    throw OptionError(
        "make_device_mesh's world",
        "null",
        "a process group (comm::ProcessGroup::single_process() for one process)");
  }
  auto dimensions = mesh_dimensions(options, world->world_size()); // before any group
  return std::make_shared<DeviceMesh>(std::move(world), std::move(dimensions));
}

void apply_tensor_parallel_plan(
    torch::nn::Module& module, const DeviceMesh& mesh, const ParallelOptions& options) {
  if (options.tensor_parallel_size <= 1) {
    return;
  }
  TensorParallelPlanOptions plan;
  plan.sequence_parallel = options.sequence_parallel;
  apply_tensor_parallel(module, mesh.group("tp"), plan);
}

void check_parallel_options(const ParallelOptions& options, int world_size) {
  mesh_dimensions(options, world_size); // the pipeline and tensor-parallel sizes divide it
  const DataParallelism mode = options.data_parallelism;
  if (mode == DataParallelism::kFsdp &&
      (options.precision.cast_model || options.precision.master_weights)) {
    throw OptionError(
        "ParallelOptions::precision",
        options.precision.describe(),
        "no cast of the module with FSDP: FSDP makes its own low-precision copies of float32 "
        "shards (FullyShardedDataParallelOptions::compute_dtype), or runs autocast over "
        "float32 units");
  }
  if (mode != DataParallelism::kDdp && options.precision.master_weights) {
    throw OptionError(
        "ParallelOptions::precision",
        options.precision.describe(),
        fmt::format(
            "a policy without float32 master weights with "
            "ParallelOptions::data_parallelism = {}: sharding float32 master weights "
            "is not built (use O1/autocast, which keeps float32 weights, or O3)",
            to_string(mode)));
  }
  if (mode != DataParallelism::kFsdp && options.fsdp.compute_dtype) {
    throw OptionError("FullyShardedDataParallelOptions::compute_dtype",
                      c10::toString(*options.fsdp.compute_dtype),
                      fmt::format("unset with {} (compute copies are FSDP's)", to_string(mode)));
  }
  const auto& checkpointing = options.activation_checkpointing;
  if (!checkpointing.modules.empty() && checkpointing.num_splits > 0) {
    throw OptionError("ActivationCheckpointingOptions::num_splits",
                      std::to_string(checkpointing.num_splits),
                      "0 when ActivationCheckpointingOptions::modules selects modules (one "
                      "way of cutting at a time)");
  }
  check_offload_options(options);
  check_pipeline_options(options, world_size);
  check_tensor_parallel_options(options);
}

namespace {

// FSDP's compute copies are its own mixed precision: the module is not cast and autocast is
// off; the loss scaling is the dtype's (dynamic for float16).
precision::PrecisionPolicy effective_policy(const ParallelOptions& options) {
  precision::PrecisionPolicy policy = options.precision;
  if (options.data_parallelism == DataParallelism::kFsdp && options.fsdp.compute_dtype) {
    policy.enabled = true;
    policy.opt_level = precision::OptLevel::kO2;
    policy.low_precision = *options.fsdp.compute_dtype;
    policy.autocast = false;
  }
  return policy;
}

torch::nn::Sequential find_sequential(torch::nn::Module& module, const std::string& name) {
  for (const auto& item : module.named_modules()) {
    if (item.key() == name) {
      auto sequential = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(item.value());
      if (!sequential) {
        throw OptionError("ActivationCheckpointingOptions::sequential", name,
                          "the name of a torch::nn::Sequential in the module (it is another "
                          "kind of module)");
      }
      return torch::nn::Sequential(sequential);
    }
  }
  throw OptionError("ActivationCheckpointingOptions::sequential", name,
                    "the name of a torch::nn::Sequential registered in the module");
}

// Every rank must install the same cut: under FSDP the segments' recomputation gathers units
// again, so different cuts would order the collectives differently (a hang). Each rank
// measures its own activation bytes (the CPU counter is process-wide: another thread's
// allocation during a probe counts), so rank 0's boundaries are taken by all. Collective.
std::vector<int64_t> agreed_boundaries(
    const std::vector<int64_t>& boundaries, comm::ProcessGroup& group, torch::Device device) {
  if (group.world_size() == 1) {
    return boundaries;
  }
  auto tensor = torch::tensor(boundaries, torch::kLong).to(device);
  group.broadcast(tensor, 0);
  tensor = tensor.cpu();
  const int64_t* agreed = tensor.data_ptr<int64_t>();
  return {agreed, agreed + tensor.numel()};
}

// ActivationCheckpointingOptions::boundaries against the Sequential's `size` elements.
void check_given_boundaries(const ActivationCheckpointingOptions& options, int64_t size) {
  const std::vector<int64_t>& b = options.boundaries;
  bool valid = static_cast<int64_t>(b.size()) == options.num_splits + 1 && b.front() == 0 &&
               b.back() == size;
  for (size_t i = 1; valid && i < b.size(); ++i) {
    valid = b[i] > b[i - 1];
  }
  if (!valid) {
    throw OptionError(
        "ActivationCheckpointingOptions::boundaries",
        fmt::format("[{}]", fmt::join(b, ", ")),
        fmt::format(
            "num_splits + 1 = {} increasing positions from 0 to {} ({} has {} elements)",
            options.num_splits + 1,
            size,
            options.sequential,
            size));
  }
}

// Step 1: where the Sequential is cut (the same on every rank of `group`) and what it saves,
// probed on the bare module.
struct Cut {
  torch::nn::Sequential container{nullptr};
  SequentialCheckpointPlan plan;
  std::optional<ActivationMemoryReport> report;
};

std::optional<Cut> plan_checkpointing(
    torch::nn::AnyModule model,
    const ActivationCheckpointingOptions& options,
    comm::ProcessGroup& group) {
  if (options.num_splits <= 0) {
    return std::nullopt;
  }
  Cut cut;
  cut.container = find_sequential(*model.ptr(), options.sequential);
  if (options.boundaries.empty()) {
    cut.plan = plan_sequential_checkpointing(
        model,
        *cut.container,
        options.sequential,
        options.num_splits,
        options.cost,
        options.probe_input_shape,
        options.probe_batch_size);
  } else {
    check_given_boundaries(options, static_cast<int64_t>(cut.container->size()));
    cut.plan.boundaries = options.boundaries;
    cut.plan.cut_by = "cut where given";
  }
  cut.plan.boundaries =
      agreed_boundaries(cut.plan.boundaries, group, models::module_device(*model.ptr()));
  if (options.report_batch_size > 0 && !options.probe_input_shape.empty()) {
    cut.report = measure_activation_memory(model, cut.container, cut.plan.boundaries,
                                           options.probe_input_shape, options.report_batch_size,
                                           options.preserve_rng_state);
  }
  return cut;
}

// Steps 2 to 4 for a module: the precision policy, the optimizer, the data-parallel mode.
std::unique_ptr<ParallelModel> wrap_for_data_parallelism(
    torch::nn::AnyModule model,
    std::shared_ptr<DeviceMesh> mesh,
    const ParallelOptions& options,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer) {
  // 2. The precision cast, and the tensors the optimizer steps (O2: the float32 masters).
  precision::GradScalerOptions scaler_options = options.grad_scaler;
  if (mesh->world().world_size() > 1) { // every rank (replica and shard) skips or stops together
    scaler_options.found_inf_reducer = precision::found_inf_all_reduce(mesh->world_group());
  }
  auto precision = std::make_unique<precision::MixedPrecision>(
      effective_policy(options),
      *model.ptr(),
      models::module_device(*model.ptr()),
      scaler_options,
      options.check_finite);
  for (auto& param_group : param_groups) {
    for (size_t i = 0; i < param_group.params.size(); ++i) {
      param_group.params[i] =
          precision->optimizer_param(param_group.names.at(i), param_group.params[i]);
    }
  }

  // 3 and 4. The optimizer (stepping on the host with offload) and the data-parallel
  // wrapper (rank 0's weights broadcast).
  const OptimizerFactory make_shard_optimizer =
      options.offload_optimizer ? offload_to_host(make_optimizer) : make_optimizer;
  std::unique_ptr<ParallelModel> parallel = make_data_parallel_model(
      model, mesh, options, std::move(precision), std::move(param_groups), make_shard_optimizer);
  parallel->precision().copy_model_to_masters(); // O2: from the broadcast weights
  return parallel;
}

// The blocks a pipeline cuts into stages: those given, or the chain a module is.
std::vector<PipelineBlock> blocks_of(ModelToParallelize model, const PipelineOptions& pipeline) {
  if (auto* blocks = std::get_if<std::vector<PipelineBlock>>(&model.model)) {
    return std::move(*blocks);
  }
  const std::shared_ptr<torch::nn::Module> module =
      std::get<torch::nn::AnyModule>(model.model).ptr();
  if (auto trunk_head = std::dynamic_pointer_cast<models::TrunkHeadModelImpl>(module)) {
    return pipeline_blocks(*trunk_head);
  }
  throw OptionError(
      "ParallelOptions::pipeline.size",
      std::to_string(pipeline.size),
      fmt::format(
          "1 for a {}, which is not a chain of blocks: a pipeline cuts a "
          "models::TrunkHeadModel, or the blocks of pipeline_blocks(), into stages",
          module->name()));
}

// The blocks under one module (index names: theirs have dots), for the checks that walk one.
std::shared_ptr<torch::nn::Module> chain_of(const std::vector<PipelineBlock>& blocks) {
  auto chain = std::make_shared<torch::nn::Module>("PipelineBlocks");
  for (size_t i = 0; i < blocks.size(); ++i) {
    chain->register_module(std::to_string(i), blocks[i].module.ptr());
  }
  return chain;
}

// The mesh must be laid out for these options: the sizes of mesh_dimensions() over its world.
void check_mesh(const ParallelOptions& options, const DeviceMesh& mesh) {
  const std::string expected = describe_sizes(mesh_dimensions(options, mesh.world().world_size()));
  const std::string given = describe_sizes(mesh.dimensions());
  if (given != expected) {
    throw OptionError(
        "parallelize's mesh",
        given,
        fmt::format(
            "the mesh of ParallelOptions::pipeline.size and tensor_parallel_size over its "
            "world, {} (make_device_mesh builds it)",
            expected));
  }
}

} // namespace

std::unique_ptr<ParallelModel> parallelize(
    ModelToParallelize input,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer,
    std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options) {
  if (!mesh) {
    throw OptionError("parallelize's mesh", "null", "make_device_mesh(world, options)");
  }
  if (options.pipeline.enabled()) {
    auto blocks = blocks_of(std::move(input), options.pipeline); // the model first, then the world
    check_parallel_options(options, mesh->world().world_size());
    check_mesh(options, *mesh);
    check_tensor_parallel_module(options, *chain_of(blocks));
    return make_pipeline_model(
        std::move(blocks),
        std::move(mesh),
        std::move(options),
        std::move(param_groups),
        make_optimizer);
  }
  check_parallel_options(options, mesh->world().world_size());
  if (!std::holds_alternative<torch::nn::AnyModule>(input.model)) {
    throw OptionError(
        "ParallelOptions::pipeline.size",
        std::to_string(options.pipeline.size),
        "> 1 for a model given as blocks (without a pipeline, give the module)");
  }
  torch::nn::AnyModule model = std::get<torch::nn::AnyModule>(input.model);
  check_mesh(options, *mesh);
  check_tensor_parallel_module(options, *model.ptr()); // 0. was the caller's
  auto cut = plan_checkpointing(model, options.activation_checkpointing, mesh->world()); // 1.

  auto parallel = wrap_for_data_parallelism(
      model,
      mesh,
      options,
      std::move(param_groups),
      make_optimizer); // 2.-4.

  // 5. Checkpointed segments, around whatever the elements run now (FSDP's interceptors).
  const auto& checkpointing = options.activation_checkpointing;
  if (cut) {
    parallel->checkpointing_ = CheckpointedSegments::split_sequential(
        cut->container,
        checkpointing.sequential,
        cut->plan.boundaries,
        checkpointing.preserve_rng_state);
    parallel->checkpoint_plan_ = std::move(cut->plan);
    parallel->activation_memory_report_ = std::move(cut->report);
  } else if (!checkpointing.modules.empty()) {
    parallel->checkpointing_ = CheckpointedSegments::wrap_modules(
        parallel->module_, checkpointing.modules, checkpointing.preserve_rng_state);
  }
  return parallel;
}

std::unique_ptr<ParallelModel> parallelize(
    ModelToParallelize model,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer,
    std::shared_ptr<comm::ProcessGroup> world,
    ParallelOptions options) {
  if (options.tensor_parallel_size > 1) {
    throw OptionError(
        "ParallelOptions::tensor_parallel_size",
        std::to_string(options.tensor_parallel_size),
        "1 when parallelize() is given the world: tensor parallelism splits the module before "
        "its param groups are built, so build the mesh (make_device_mesh), split the module "
        "over it (apply_tensor_parallel_plan) and give parallelize() the mesh");
  }
  if (options.pipeline.enabled()) { // the model first, then the world
    model = ModelToParallelize(blocks_of(std::move(model), options.pipeline));
  }
  auto mesh = make_device_mesh(std::move(world), options);
  return parallelize(
      std::move(model),
      std::move(param_groups),
      make_optimizer,
      std::move(mesh),
      std::move(options));
}

} // namespace largo::parallel
