#include "data_parallel_model.h"
#include "../tensor_parallel/tensor_parallel_dimension.h"

#include <largo/optim/grad_clipping.h>

#include <fmt/format.h>

namespace largo::parallel {

DataParallelModel::DataParallelModel(
    torch::nn::AnyModule model,
    std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options,
    std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer)
    : ParallelModel(std::move(model), std::move(mesh), std::move(options), std::move(precision)),
      stage_(zero_stage(options_.data_parallelism)) {
  // LARC's and LAMB's per-parameter norms are the unsharded parameters' (with ZeRO,
  // completed over the replicas first).
  const ParameterNormCompletion complete_norms = tensor_parallel_->parameter_norms();
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

std::optional<OptimizerShard> DataParallelModel::optimizer_pieces() {
  if (sharded_ == nullptr) {
    return std::nullopt;
  }
  return OptimizerShard{&sharded_->base(), sharded_->piece_ownership(), "zero"};
}

c10::IValue DataParallelModel::optimizer_state_dict() {
  if (sharded_ == nullptr || optimizer_shard()) { // whole, or pieces written per rank
    return ParallelModel::optimizer_state_dict();
  }
  const c10::IValue slices = consolidate_on_first_rank(
      sharded_->base(),
      sharded_->piece_ownership(),
      sharded_->type(),
      *replicas_,
      local_parameter_shapes());
  return tensor_parallel_->optimizer_state(slices, optimizer_->param_groups(), /*gather=*/true);
}

void DataParallelModel::load_optimizer_state_dict(const c10::IValue& state) {
  if (sharded_ == nullptr || optimizer_shard()) {
    ParallelModel::load_optimizer_state_dict(state);
    return;
  }
  sharded_->load_whole_state_dict(
      tensor_parallel_->optimizer_state(state, optimizer_->param_groups(), /*gather=*/false));
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
// (averaged) gradients, so it is completed over the shards; ZeRO's pieces are summed over the
// replicas first.
double DataParallelModel::clip_gradients(double max_norm, double norm_type) {
  if (!tensor_parallel_->enabled()) {
    return sharded_ != nullptr ? sharded_->clip_grad_norm(max_norm, norm_type)
                               : ParallelModel::clip_gradients(max_norm, norm_type);
  }
  const TensorParallelState& tp = tensor_parallel_->state();
  if (sharded_ == nullptr) {
    return optim::clip_grad_norm(
        trained_parameters_, max_norm, norm_type, tp.norm_reducer(trained_parameters_, norm_type));
  }
  const std::vector<at::Tensor> pieces = sharded_->shard_parameters(); // gradients attached
  return optim::clip_grad_norm(
      pieces,
      max_norm,
      norm_type,
      tp.piece_norm_reducer(sharded_->named_shard_parameters(), norm_type, replicas_));
}

std::string DataParallelModel::describe_mode() const {
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

void DataParallelModel::place(StatePlacements& placements) const {
  if (sharded_ != nullptr) {
    const ParameterPlacement planned = data_parallel_placement(options_.data_parallelism);
    placements.place_all("dp", planned.value.at("dp"), planned.optimizer_state.at("dp"));
  }
}

void DataParallelModel::measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const {
  if (sharded_ != nullptr) {
    report.zero_stage = sdp_ ? 2 : 1; // one rank: no gradient shards, stage 1's layout
  }
  ParallelModel::measure(report, spec);
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
