#include <largo/parallel/pipeline/pipeline_parallel.h>

#include "pipeline_step.h"

#include <largo/core/error.h>
#include <largo/optim/grad_clipping.h>
#include <largo/parallel/pipeline/pipeline_checkpoint.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <unordered_set>

namespace largo::parallel {

struct PipelineParallel::Impl {
  PipelineParallelOptions options;
  std::shared_ptr<comm::ProcessGroup> pipeline;
  std::shared_ptr<comm::ProcessGroup> data_parallel; // null without replicas
  std::vector<int64_t> boundaries;
  std::vector<std::string> block_names; // every block of the full model
  std::vector<std::string> full_names;  // parameters, then buffers
  std::vector<std::string> full_parameter_names;
  PipelineStepContext context;
  std::shared_ptr<torch::nn::Module> module; // this rank's blocks under full-model names
  RankSchedule schedule;                     // this rank's list of a training step
  RankSchedule forward_schedule;             // and of a forward-only step
  std::unique_ptr<DistributedDataParallel> ddp;
  StepTimes last_step;
};

namespace {

// Block costs measured on pipeline rank 0 and broadcast (over the pipeline, then over the
// replicas), so that every rank of the mesh cuts the model alike.
std::vector<double> shared_block_seconds(
    const std::vector<PipelineBlock>& blocks,
    const PipelineParallelOptions& options,
    comm::ProcessGroup& pipeline,
    comm::ProcessGroup* data_parallel) {
  if (!options.balance_sample().defined()) {
    throw ConfigError("PipelineParallelOptions::balance = time needs a sample micro-batch to "
                      "time the blocks on (PipelineParallelOptions::balance_sample)");
  }
  at::Tensor seconds = at::zeros({static_cast<int64_t>(blocks.size())}, at::kDouble);
  if (pipeline.rank() == 0 && (!data_parallel || data_parallel->rank() == 0)) {
    const auto measured = measure_block_seconds(blocks, options.balance_sample());
    seconds.copy_(at::tensor(measured, at::kDouble));
  }
  pipeline.broadcast(seconds, 0);
  if (data_parallel) {
    data_parallel->broadcast(seconds, 0);
  }
  return std::vector<double>(
      seconds.data_ptr<double>(), seconds.data_ptr<double>() + seconds.numel());
}

std::vector<int64_t> cut_model(
    const std::vector<PipelineBlock>& blocks,
    int num_stages,
    const PipelineParallelOptions& options,
    comm::ProcessGroup& pipeline,
    comm::ProcessGroup* data_parallel) {
  return cut_into_stages(blocks, num_stages, options.boundaries(), options.balance(), [&] {
    return shared_block_seconds(blocks, options, pipeline, data_parallel);
  });
}

// Forward passes only, micro-batch by micro-batch through this rank's stages in order.
std::vector<RankSchedule> forward_only_schedule(const PipelineShape& shape) {
  std::vector<RankSchedule> ranks(static_cast<size_t>(shape.num_ranks));
  for (int rank = 0; rank < shape.num_ranks; ++rank) {
    for (int mb = 0; mb < shape.num_microbatches; ++mb) {
      for (int v = 0; v < shape.virtual_stages; ++v) {
        PipelineAction action;
        action.microbatch = mb;
        action.stage = v * shape.num_ranks + rank;
        ranks[static_cast<size_t>(rank)].push_back(action);
      }
    }
  }
  return add_communication(ranks, shape);
}

} // namespace

void check_pipeline_parallel_options(const PipelineParallelOptions& options) {
  require_option(
      !(options.checkpoint_stages() && options.schedule() == PipelineScheduleKind::kZeroBubbleH1),
      "PipelineParallelOptions::checkpoint_stages",
      "true",
      "false with PipelineParallelOptions::schedule = zb_h1: a checkpointed stage is one "
      "autograd node, so zb_h1's weight pass would recompute the stage a second time; "
      "recompute stages with gpipe, 1f1b or interleaved_1f1b, or run zb_h1 without");
}

PipelineParallel::PipelineParallel(
    std::vector<PipelineBlock> blocks,
    std::shared_ptr<comm::ProcessGroup> pipeline_group,
    std::shared_ptr<comm::ProcessGroup> data_parallel_group,
    PipelineParallelOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  impl.options = std::move(options);
  impl.pipeline = std::move(pipeline_group);
  if (data_parallel_group && data_parallel_group->world_size() > 1) {
    impl.data_parallel = std::move(data_parallel_group);
  }
  PipelineShape& shape = impl.context.shape;
  shape = {
      impl.pipeline->world_size(), impl.options.num_microbatches(), impl.options.virtual_stages()};
  check_pipeline_shape(impl.options.schedule(), shape);
  check_pipeline_parallel_options(impl.options);
  impl.boundaries =
      cut_model(blocks, shape.num_stages(), impl.options, *impl.pipeline, impl.data_parallel.get());
  std::vector<std::string> buffer_names;
  for (const auto& block : blocks) {
    impl.block_names.push_back(block.name);
    for (const auto& item : block.module.ptr()->named_parameters()) {
      impl.full_parameter_names.push_back(block.name + "." + item.key());
    }
    for (const auto& item : block.module.ptr()->named_buffers()) {
      buffer_names.push_back(block.name + "." + item.key());
    }
  }
  impl.full_names = impl.full_parameter_names;
  impl.full_names.insert(impl.full_names.end(), buffer_names.begin(), buffer_names.end());

  impl.context.rank = impl.pipeline->rank();
  impl.context.group = impl.pipeline.get();
  impl.context.checkpoint_stages = impl.options.checkpoint_stages();
  std::vector<PipelineBlock> local_blocks;
  for (int stage : stages()) {
    std::vector<PipelineBlock> stage_blocks(
        blocks.begin() + impl.boundaries[stage], blocks.begin() + impl.boundaries[stage + 1]);
    local_blocks.insert(local_blocks.end(), stage_blocks.begin(), stage_blocks.end());
    PipelineStage module(std::move(stage_blocks));
    impl.context.stage_parameters.push_back(module->parameters());
    impl.context.stages.push_back(module);
  }
  impl.module = PipelineStage(std::move(local_blocks)).ptr();
  for (const auto& parameter : impl.module->parameters()) {
    impl.context.device = parameter.device();
    break;
  }
  const auto full_schedule = pipeline_schedule(impl.options.schedule(), shape);
  validate_schedule(full_schedule, shape);
  impl.schedule = full_schedule[static_cast<size_t>(impl.context.rank)];
  impl.forward_schedule = forward_only_schedule(shape)[static_cast<size_t>(impl.context.rank)];
  if (impl.data_parallel) {
    DistributedDataParallelOptions ddp_options = impl.options.data_parallel();
    ddp_options.manual_reduction = true; // gradients come from many backward calls per step
    impl.ddp =
        std::make_unique<DistributedDataParallel>(impl.module, impl.data_parallel, ddp_options);
  }
}

PipelineParallel::~PipelineParallel() = default;

double PipelineParallel::forward_backward(
    const at::Tensor& inputs,
    const at::Tensor& targets,
    const LossFunction& loss,
    const LossScaling& scale_loss) {
  Impl& impl = *impl_;
  if (impl.ddp) {
    impl.ddp->before_forward(); // replica 0's BatchNorm statistics, when broadcast_buffers
  }
  const auto start = std::chrono::steady_clock::now();
  PipelineStep step(impl.context, inputs, targets, &loss, &scale_loss, /*forward_only=*/false);
  step.run(impl.schedule);
  impl.last_step.step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  impl.last_step.busy_seconds = step.busy_seconds();
  at::Tensor mean_loss = at::full(
      {1},
      step.weighted_loss_sum(),
      at::TensorOptions().dtype(at::kDouble).device(impl.context.device));
  impl.pipeline->broadcast(mean_loss, pipeline_size() - 1);
  return mean_loss.item<double>();
}

at::Tensor PipelineParallel::forward(const at::Tensor& inputs, bool broadcast_outputs) {
  Impl& impl = *impl_;
  torch::NoGradGuard no_grad;
  PipelineStep step(impl.context, inputs, at::Tensor(), nullptr, nullptr, /*forward_only=*/true);
  step.run(impl.forward_schedule);
  at::Tensor outputs = step.outputs();
  if (!broadcast_outputs || pipeline_size() == 1) {
    return outputs;
  }
  // The last rank's outputs: first their dtype and shape, then the data (on the stages'
  // device: NCCL moves only CUDA tensors).
  const int root = pipeline_size() - 1;
  std::vector<int64_t> values(16, 0);
  if (pipeline_rank() == root) {
    values[0] = static_cast<int64_t>(outputs.scalar_type());
    values[1] = std::min<int64_t>(outputs.dim(), 14);
    for (int64_t d = 0; d < values[1]; ++d) {
      values[static_cast<size_t>(2 + d)] = outputs.size(d);
    }
    outputs = outputs.contiguous();
  }
  at::Tensor header = at::tensor(values, at::kLong).to(impl.context.device);
  impl.pipeline->broadcast(header, root);
  if (pipeline_rank() != root) {
    const at::Tensor host = header.cpu();
    const auto* received = host.data_ptr<int64_t>();
    outputs = at::empty(
        std::vector<int64_t>(received + 2, received + 2 + received[1]),
        at::TensorOptions()
            .dtype(static_cast<at::ScalarType>(received[0]))
            .device(impl.context.device));
  }
  impl.pipeline->broadcast(outputs, root);
  return outputs;
}

void PipelineParallel::reduce_gradients() {
  if (impl_->ddp) {
    impl_->ddp->reduce_gradients();
  }
}

double PipelineParallel::clip_grad_norm(double max_norm, double norm_type) {
  return optim::clip_grad_norm(parameters(), max_norm, norm_type, norm_reducer());
}

optim::PartialNormReducer PipelineParallel::norm_reducer(bool over_replicas) const {
  auto pipeline = impl_->pipeline;
  auto replicas = over_replicas ? impl_->data_parallel : nullptr;
  return [pipeline, replicas](const at::Tensor& partials, optim::NormReduceOp op) {
    at::Tensor total = partials.clone();
    const auto reduce =
        op == optim::NormReduceOp::sum ? comm::ReduceOp::kSum : comm::ReduceOp::kMax;
    pipeline->all_reduce(total, reduce);
    if (replicas) {
      replicas->all_reduce(total, reduce);
    }
    return total;
  };
}

precision::FoundInfReducer PipelineParallel::found_inf_reducer() const {
  auto pipeline = impl_->pipeline;
  auto replicas = impl_->data_parallel;
  return [pipeline, replicas](at::Tensor& found_inf) {
    pipeline->all_reduce(found_inf, comm::ReduceOp::kMax);
    if (replicas) {
      replicas->all_reduce(found_inf, comm::ReduceOp::kMax);
    }
  };
}

const std::shared_ptr<torch::nn::Module>& PipelineParallel::module() const {
  return impl_->module;
}

std::vector<at::Tensor> PipelineParallel::parameters() const {
  return impl_->module->parameters();
}

int64_t PipelineParallel::parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& parameter : parameters()) {
    bytes += static_cast<int64_t>(parameter.numel() * parameter.element_size());
  }
  return bytes;
}

c10::impl::GenericDict PipelineParallel::state_dict() const {
  c10::impl::GenericDict state(c10::StringType::get(), c10::TensorType::get());
  for (const auto& item : impl_->module->named_parameters()) {
    state.insert(item.key(), item.value().detach());
  }
  for (const auto& item : impl_->module->named_buffers()) {
    state.insert(item.key(), item.value().detach());
  }
  return state;
}

void PipelineParallel::load_state_dict(const c10::impl::GenericDict& state) {
  const auto own = state_dict();
  std::vector<std::string> problems;
  for (const auto& entry : own) {
    auto it = state.find(entry.key());
    if (it == state.end()) {
      problems.push_back(fmt::format("'{}' missing", entry.key().toStringRef()));
    } else if (
        !it->value().isTensor() ||
        it->value().toTensor().sizes() != entry.value().toTensor().sizes()) {
      problems.push_back(fmt::format("'{}' has another shape", entry.key().toStringRef()));
    }
  }
  if (!problems.empty()) {
    throw CheckpointError(fmt::format(
        "the model state does not fit pipeline rank {}'s stages ({} of its {} entries): {}",
        pipeline_rank(),
        problems.size(),
        own.size(),
        fmt::join(problems, ", ")));
  }
  torch::NoGradGuard no_grad;
  for (const auto& entry : own) {
    entry.value().toTensor().copy_(state.at(entry.key()).toTensor());
  }
}

c10::impl::GenericDict PipelineParallel::full_state_dict() const {
  return full_state_dict(state_dict());
}

c10::impl::GenericDict
PipelineParallel::full_state_dict(const c10::impl::GenericDict& own_part) const {
  auto parts = gather_to_root(*impl_->pipeline, own_part, 0);
  c10::impl::GenericDict full(c10::StringType::get(), c10::TensorType::get());
  if (pipeline_rank() != 0) {
    return full;
  }
  std::unordered_map<std::string, at::Tensor> by_name;
  for (const auto& part : parts) {
    for (const auto& entry : part.toGenericDict()) {
      by_name[entry.key().toStringRef()] = entry.value().toTensor();
    }
  }
  const size_t parameters = impl_->full_parameter_names.size(); // the first full_names
  for (size_t i = 0; i < impl_->full_names.size(); ++i) {
    const std::string& name = impl_->full_names[i];
    auto it = by_name.find(name);
    if (it != by_name.end()) {
      full.insert(name, it->second);
    } else if (i < parameters) {
      throw Error(fmt::format("full_state_dict: no stage holds '{}'", name));
    }
  }
  return full;
}

const std::vector<std::string>& PipelineParallel::full_model_names() const {
  return impl_->full_names;
}

const std::vector<std::string>& PipelineParallel::full_parameter_names() const {
  return impl_->full_parameter_names;
}

int PipelineParallel::pipeline_rank() const {
  return impl_->pipeline->rank();
}

int PipelineParallel::pipeline_size() const {
  return impl_->pipeline->world_size();
}

std::vector<int> PipelineParallel::stages() const {
  return impl_->context.shape.stages_of_rank(impl_->pipeline->rank());
}

const std::vector<int64_t>& PipelineParallel::boundaries() const {
  return impl_->boundaries;
}

const PipelineShape& PipelineParallel::shape() const {
  return impl_->context.shape;
}

const PipelineParallelOptions& PipelineParallel::options() const {
  return impl_->options;
}

comm::ProcessGroup& PipelineParallel::pipeline_group() const {
  return *impl_->pipeline;
}

const std::shared_ptr<comm::ProcessGroup>& PipelineParallel::data_parallel_group() const {
  return impl_->data_parallel;
}

PipelineParallel::StepTimes PipelineParallel::last_step_times() const {
  return impl_->last_step;
}

std::string PipelineParallel::describe() const {
  const Impl& impl = *impl_;
  const PipelineShape& shape = impl.context.shape;
  std::vector<std::string> own;
  for (int stage : stages()) {
    own.push_back(fmt::format(
        "stage {} = blocks {}..{}",
        stage,
        impl.block_names[static_cast<size_t>(impl.boundaries[stage])],
        impl.block_names[static_cast<size_t>(impl.boundaries[stage + 1] - 1)]));
  }
  int64_t count = 0;
  for (const auto& parameter : parameters()) {
    count += parameter.numel();
  }
  return fmt::format(
      "pipeline parallel: schedule {}, {} micro-batches, {} ranks x {} stage(s) over {} blocks "
      "cut at [{}]{}{}; pipeline rank {}: {}, {} parameters{}",
      to_string(impl.options.schedule()),
      shape.num_microbatches,
      shape.num_ranks,
      shape.virtual_stages,
      impl.block_names.size(),
      fmt::join(impl.boundaries, ", "),
      impl.options.boundaries().empty() ? " balanced by " + to_string(impl.options.balance()) : "",
      impl.options.checkpoint_stages() ? ", stages checkpointed" : "",
      pipeline_rank(),
      fmt::join(own, ", "),
      count,
      impl.data_parallel
          ? fmt::format("; data parallel over {} replicas (DDP)", impl.data_parallel->world_size())
          : "");
}

} // namespace largo::parallel
