#include "data_parallel_model.h"

#include <largo/optim/grad_clipping.h>
#include <largo/parallel/mesh/device_mesh.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::parallel {

DataParallelModel::DataParallelModel(
    torch::nn::AnyModule model,
    std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options,
    std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer)
    : ParallelModel(model, std::move(mesh), std::move(options), std::move(precision)),
      stage_(zero_stage(options_.data_parallelism)) {
  // LARC's and LAMB's per-parameter norms are the unsharded parameters' (with ZeRO and FSDP,
  // completed over the replicas first).
  const ParameterNormCompletion complete_norms = tensor_parallel_->parameter_norms();
  if (stage_ == 3) { // FSDP shards the module over "dp" (of the "tp" group's slices)
    fsdp_ = std::make_unique<FullyShardedDataParallel>(std::move(model), replicas_, options_.fsdp);
    set_optimizer(fsdp_->make_optimizer(param_groups, make_optimizer, complete_norms));
    return;
  }
  if (stage_ == 0) {
    set_optimizer(make_optimizer(std::move(param_groups)));
    if (complete_norms) {
      optimizer_->set_norm_reducer(complete_norms(optimizer_->param_groups()));
    }
  } else {
    // The sharded optimizer moves the parameters into flat buffers first: stage 2's reducer
    // reduces into its gradient shards, DDP's buckets view the flattened parameters' grads.
    // The base optimizer's per-parameter norms are completed over the replicas, then by
    // `complete_norms`.
    ShardedOptimizerOptions zero_options;
    zero_options.make_base_optimizer = make_optimizer;
    zero_options.complete_parameter_norms = complete_norms;
    auto sharded =
        std::make_unique<ShardedOptimizer>(std::move(param_groups), replicas_, zero_options);
    sharded_ = sharded.get();
    set_optimizer(std::move(sharded));
  }
  if (replicas_->world_size() == 1) {
    return;
  }
  if (stage_ == 2) {
    sdp_ = std::make_unique<ShardedDataParallel>(module_, *sharded_, replicas_, options_.zero);
  } else { // broadcasts rank 0's weights; stage 1: full gradients, each rank reads its part
    ddp_ = std::make_unique<DistributedDataParallel>(module_, replicas_, options_.ddp);
  }
}

// ---- the whole state (stage 3: FSDP's shards) -----------------------------------------

ParallelModel::NamedTensors DataParallelModel::held_values(int root) {
  return fsdp_ ? fsdp_->full_state_on_rank(root) : ParallelModel::held_values(root);
}

void DataParallelModel::store_values(const Values& values) {
  if (!fsdp_) {
    ParallelModel::store_values(values);
    return;
  }
  fsdp_->load_full_state(values); // each rank keeps its shard
}

void DataParallelModel::update_held(
    const std::string& name, const std::function<void(at::Tensor&)>& update) {
  if (!fsdp_) {
    ParallelModel::update_held(name, update);
    return;
  }
  fsdp_->update_full_parameter(name, update);
}

// Every parameter's value as FSDP holds it whole, frozen ones included, in the module's
// order. Collective.
ParallelModel::NamedTensors DataParallelModel::held_parameters() {
  if (!fsdp_) {
    return ParallelModel::held_parameters();
  }
  std::map<std::string, at::Tensor> gathered;
  for (auto& [name, value] : fsdp_->full_parameters()) {
    gathered.emplace(name, std::move(value));
  }
  NamedTensors values;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    auto found = gathered.find(item.key()); // frozen ones are kept whole
    values.emplace_back(
        item.key(), found != gathered.end() ? found->second : item.value().detach().clone());
  }
  return values;
}

torch::OrderedDict<std::string, at::Tensor> DataParallelModel::local_state() const {
  if (!fsdp_) {
    return ParallelModel::local_state();
  }
  torch::OrderedDict<std::string, at::Tensor> tensors;
  for (const auto& [name, piece] : named_pieces()) {
    tensors.insert(name, piece);
  }
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) {
      tensors.insert(item.key(), item.value());
    }
  }
  for (const auto& buffer : module_->named_buffers()) {
    tensors.insert(buffer.key(), buffer.value());
  }
  return tensors;
}

std::map<std::string, std::vector<int64_t>> DataParallelModel::local_parameter_shapes() const {
  if (!fsdp_) {
    return ParallelModel::local_parameter_shapes();
  }
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) {
      shapes[item.key()] = item.value().sizes().vec();
    }
  }
  return shapes;
}

// ---- the optimizer state --------------------------------------------------------------

std::optional<OptimizerShard> DataParallelModel::optimizer_pieces() {
  if (fsdp_) {
    return OptimizerShard{optimizer_.get(), fsdp_->piece_ownership(), "fsdp"};
  }
  if (sharded_ != nullptr) {
    return OptimizerShard{&sharded_->base(), sharded_->piece_ownership(), "zero"};
  }
  return std::nullopt;
}

void DataParallelModel::load_held_optimizer_state(const c10::IValue& state) {
  if (stage_ == 0 || optimizer_shard()) {
    ParallelModel::load_held_optimizer_state(state);
    return;
  }
  if (sharded_ != nullptr) {
    sharded_->load_whole_state_dict(state);
    return;
  }
  const auto shapes = local_parameter_shapes();
  load_resharded_piece_state(*optimizer_, fsdp_->piece_ownership(), 1, [&](int) {
    return whole_state_as_single_shard(state, shapes);
  });
}

// FSDP's optimizer steps 1-D pieces: the module's trained parameters (names and shapes) are
// what its whole state is over.
std::vector<optim::ParamGroup> DataParallelModel::held_parameter_groups() const {
  if (!fsdp_) {
    return ParallelModel::held_parameter_groups();
  }
  optim::ParamGroup group;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) {
      group.params.push_back(item.value());
      group.names.push_back(item.key());
    }
  }
  return {group};
}

TensorParallelDimension::NamedTensors DataParallelModel::named_pieces() const {
  if (sharded_ != nullptr) {
    return sharded_->named_shard_parameters();
  }
  TensorParallelDimension::NamedTensors named; // FSDP's optimizer steps the pieces
  for (const auto& group : optimizer_->param_groups()) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      named.emplace_back(group.names.at(i), group.params[i]);
    }
  }
  return named;
}

// ---- the step -------------------------------------------------------------------------

at::Tensor DataParallelModel::run_forward(const at::Tensor& input) {
  return fsdp_ ? fsdp_->forward(input) : ParallelModel::run_forward(input);
}

void DataParallelModel::before_forward() {
  if (ddp_) {
    ddp_->before_forward();
  } else if (sdp_) {
    sdp_->before_forward();
  }
}

std::unique_ptr<DistributedDataParallel::NoSyncGuard> DataParallelModel::no_sync() {
  return ddp_ ? std::make_unique<DistributedDataParallel::NoSyncGuard>(*ddp_) : nullptr;
}

// ZeRO's pieces are views of the flat gradients (stage 2: of the gradient shard), which the
// sharded optimizer attaches anew before its step: it leaves the dropped ones out.
void DataParallelModel::drop_piece_gradients(const std::set<std::string>& names) {
  if (sharded_ != nullptr) {
    sharded_->drop_gradients(names);
  }
}

void DataParallelModel::reduce_gradients() {
  if (ddp_ && options_.ddp.manual_reduction) {
    ddp_->reduce_gradients();
  }
}

// ZeRO: each rank unscales, checks and clips only the gradients its shard steps with.
std::vector<at::Tensor> DataParallelModel::gradient_holders() const {
  return sharded_ != nullptr ? sharded_->shard_parameters() : trained_parameters_;
}

// With tensor parallelism the unsharded model's norm, through optim::clip_grad_norm's
// reducer so that the scaling is that function's: after DDP every replica holds the same
// (averaged) gradients, so it is completed over the shards; ZeRO's and FSDP's pieces are
// summed over the replicas first.
double DataParallelModel::clip_gradients(double max_norm, double norm_type) {
  if (!tensor_parallel_->enabled()) {
    return fsdp_                 ? fsdp_->clip_grad_norm(max_norm, norm_type)
           : sharded_ != nullptr ? sharded_->clip_grad_norm(max_norm, norm_type)
                                 : ParallelModel::clip_gradients(max_norm, norm_type);
  }
  const TensorParallelState& tp = tensor_parallel_->state();
  if (stage_ == 0) {
    return optim::clip_grad_norm(
        trained_parameters_, max_norm, norm_type, tp.norm_reducer(trained_parameters_, norm_type));
  }
  const std::vector<at::Tensor> pieces = // gradients attached
      fsdp_ ? fsdp_->shard_parameters() : sharded_->shard_parameters();
  return optim::clip_grad_norm(
      pieces, max_norm, norm_type, tp.piece_norm_reducer(named_pieces(), norm_type, replicas_));
}

// ---- description and measures ---------------------------------------------------------

std::string DataParallelModel::describe_mode() const {
  if (fsdp_) {
    return describe_fully_sharded();
  }
  if (stage_ == 0 && ddp_) {
    return fmt::format(
        "DDP over {} ranks ({}), {} gradient buckets",
        replicas_->world_size(),
        replicas_->backend(),
        ddp_->num_buckets());
  }
  if (stage_ == 0) { // tensor parallelism's shards are processes of one replica
    return group_->world_size() == 1 ? "one process" : "one data-parallel replica";
  }
  std::string text = fmt::format("ZeRO stage {}: optimizer state{} sharded over {} rank(s)",
                                 stage_, stage_ == 2 ? " and gradients" : "",
                                 replicas_->world_size());
  if (sdp_ || ddp_) {
    text += fmt::format(" ({}), {} gradient buckets", replicas_->backend(),
                        sdp_ ? sdp_->num_buckets() : ddp_->num_buckets());
  }
  return text;
}

std::string DataParallelModel::describe_fully_sharded() const {
  std::vector<std::string> units;
  for (const auto& unit : fsdp_->units()) {
    units.push_back(fmt::format("{} ({} parameters)", unit.name, unit.layout.total_numel()));
  }
  const auto& options = fsdp_->options();
  const std::string compute =
      options.compute_dtype
          ? fmt::format(
                "{} compute copies of float32 shards (BatchNorm in float32), gradients "
                "reduced in {}",
                c10::toString(*options.compute_dtype),
                options.fp32_reduce_scatter ? "float32" : c10::toString(*options.compute_dtype))
          : std::string("compute in the parameters' dtype");
  return fmt::format(
      "ZeRO stage 3 (FSDP): parameters, gradients and optimizer state sharded "
      "over {} rank(s) ({}), {:.2f} MiB of parameter shards per rank; units ({}): "
      "{}; reshard_after_forward {}, prefetch {}; {}",
      replicas_->world_size(),
      replicas_->backend(),
      static_cast<double>(fsdp_->shard_bytes()) / (1024.0 * 1024.0),
      options.wrap_policy.describe(),
      fmt::join(units, ", "),
      options.reshard_after_forward,
      options.prefetch,
      compute);
}

void DataParallelModel::place(StatePlacements& placements) const {
  if (stage_ > 0) {
    const ParameterPlacement planned = data_parallel_placement(options_.data_parallelism);
    placements.place_all("dp", planned.value.at("dp"), planned.optimizer_state.at("dp"));
  }
}

void DataParallelModel::measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const {
  if (fsdp_) {
    measure_fully_sharded(report, spec);
    return;
  }
  if (sharded_ != nullptr) {
    report.zero_stage = sdp_ ? 2 : 1; // one rank: no gradient shards, stage 1's layout
  }
  ParallelModel::measure(report, spec);
}

void DataParallelModel::measure_fully_sharded(
    ModelStateReport& report, const optim::OptimizerSpec* spec) const {
  report.zero_stage = 3;
  report.measured = measure_model_state_bytes(*fsdp_, *optimizer_);
  report.peak_gathered_bytes = fsdp_->peak_gathered_bytes();
  if (!spec) {
    return;
  }
  MemoryEstimateOptions estimate;
  estimate.optimizer = *spec;
  estimate.world_size = replicas_->world_size();
  estimate.rank = replicas_->rank();
  estimate.stage = 3;
  estimate.offload_optimizer = options_.offload_optimizer;
  std::vector<ParameterSize> sizes = parameter_sizes(*module_);
  if (fsdp_->options().compute_dtype) {
    // The module's parameters are views of the compute copies; the shards are float32.
    for (auto& size : sizes) {
      if (size.trained) {
        size.dtype = at::kFloat;
      }
    }
  }
  report.estimated = estimate_model_state_bytes(sizes, estimate);
}

std::unique_ptr<ParallelModel> make_data_parallel_model(
    torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups, const OptimizerFactory& make_optimizer) {
  return std::make_unique<DataParallelModel>(std::move(model), std::move(mesh), std::move(options),
                                             std::move(precision), std::move(param_groups),
                                             make_optimizer);
}

} // namespace largo::parallel
