// Tensor parallelism composed with data parallelism over the replicas (torchtitan's 2-D
// parallelism): the module's planned layers are split over the mesh's "tp" group
// (apply_tensor_parallel_plan, done by the caller before the param groups were built), and
// DDP, ZeRO-1 or ZeRO-2 runs that sharded module over its "dp" group: rank r of every
// replica holds the same slices, so the replicas average (and ZeRO partitions) like with like. What differs from those modes alone is
// everything that must see the unsharded model: the gradient norm (the shards' partial norms
// summed over the tensor-parallel group, the replicated parameters counted once), LARC's and
// LAMB's per-parameter norms likewise, and the state (model and optimizer) which is gathered
// to the full tensors on save and sliced on load, so that a checkpoint of this run is the one
// an unsharded run writes and reads. ZeRO's optimizer state is consolidated over the
// replicas before that gather (as FairScale's OSS consolidates on one rank), so a checkpoint
// holds no per-rank shard files.
#include "../data_parallel/data_parallel_model.h"
#include "tensor_parallel_state.h"

#include <largo/core/error.h>
#include <largo/optim/grad_clipping.h>
#include <largo/parallel/data_parallel/piece_optimizer_state.h>
#include <largo/parallel/data_parallel/sharded_data_parallel.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>
#include <largo/parallel/tensor_parallel/tensor_parallel.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>
#include <unordered_map>

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

namespace {

// Tensor parallelism over a data-parallel model: the data-parallel stage (DDP, ZeRO-1/2) as
// DataParallelModel runs it, with the norms and the state completed over the "tp" group.
class TensorParallelModel : public DataParallelModel {
 public:
  TensorParallelModel(
      torch::nn::AnyModule model,
      std::shared_ptr<DeviceMesh> mesh,
      ParallelOptions options,
      std::unique_ptr<precision::MixedPrecision> precision,
      std::vector<optim::ParamGroup> param_groups,
      const OptimizerFactory& make_optimizer,
      std::shared_ptr<const TensorParallelState> tp)
      // LARC's and LAMB's per-parameter norms are the unsharded parameters' (with ZeRO,
      // completed over the replicas first).
      : DataParallelModel(
            std::move(model),
            std::move(mesh),
            std::move(options),
            std::move(precision),
            std::move(param_groups),
            make_optimizer,
            [tp](const std::vector<optim::ParamGroup>& groups) {
              return tp->parameter_norm_reducer(groups);
            }),
        tp_(std::move(tp)) {}

  // Consolidated over the replicas instead (optimizer_state_dict), not per-rank pieces.
  std::optional<OptimizerShard> optimizer_shard() override {
    return std::nullopt;
  }

  // The module holds this rank's slices of the split layers (its local_state() too, which a
  // checkpoint of a per-rank average, the model EMA, gathers through model_state_dict()).
  void place(StatePlacements& placements) const override {
    DataParallelModel::place(placements);
    tp_->place(placements);
  }

  std::vector<std::pair<std::string, at::Tensor>> model_state_dict(int /*root*/) override {
    std::vector<std::pair<std::string, at::Tensor>> state = full_parameters();
    for (auto& item : state) {
      item.second = item.second.to(at::kCPU);
    }
    for (const auto& item : module_->named_buffers(/*recurse=*/true)) { // replicated
      state.emplace_back(item.key(), item.value().detach().to(at::kCPU, false, /*copy=*/true));
    }
    return state;
  }

  void load_model_state_dict(const std::unordered_map<std::string, at::Tensor>& state) override {
    ParallelModel::load_model_state_dict(tp_->shard(state));
  }

  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    return parallel::full_parameters(*module_, tp_->group());
  }

  void update_full_parameter(
      const std::string& name, const std::function<void(at::Tensor&)>& update) override {
    if (!tp_->update_full_value(*module_, name, update)) {
      ParallelModel::update_full_parameter(name, update);
    }
  }

  // The unsharded model's optimizer state. With ZeRO, on the first replica only (None on the
  // others): its pieces are consolidated there first. Collective (replicas, then shards).
  c10::IValue optimizer_state_dict() override {
    const c10::IValue own =
        sharded_ != nullptr ? consolidated_over_replicas() : optimizer_->state_dict();
    if (own.isNone()) {
      return own;
    }
    return tp_->map_optimizer_state(own, optimizer_->param_groups(), /*gather=*/true);
  }

  void load_optimizer_state_dict(const c10::IValue& state) override {
    const c10::IValue own =
        tp_->map_optimizer_state(state, optimizer_->param_groups(), /*gather=*/false);
    if (sharded_ != nullptr) {
      sharded_->load_whole_state_dict(own);
    } else {
      optimizer_->load_state_dict(own);
    }
  }

  std::map<std::string, std::vector<int64_t>> trained_parameter_shapes() const override {
    return tp_->full_shapes(optimizer_->param_groups());
  }

 protected:
  // The unsharded model's norm, through optim::clip_grad_norm's reducer so that the scaling
  // is that function's. After DDP every replica holds the same (averaged) gradients, so it
  // is the tensor-parallel one; with ZeRO the replicas' pieces are summed first.
  double clip_gradients(double max_norm, double norm_type) override {
    if (sharded_ == nullptr) {
      return optim::clip_grad_norm(
          trained_parameters_,
          max_norm,
          norm_type,
          tp_->norm_reducer(trained_parameters_, norm_type));
    }
    const std::vector<at::Tensor> pieces = sharded_->shard_parameters(); // gradients attached
    return optim::clip_grad_norm(
        pieces,
        max_norm,
        norm_type,
        tp_->piece_norm_reducer(sharded_->named_shard_parameters(), norm_type, replicas_));
  }

  std::string describe_mode() const override {
    std::string text = tp_->describe();
    if (sharded_ != nullptr) {
      text +=
          fmt::format("; ZeRO stage {} over {} replica(s)", sdp_ ? 2 : 1, replicas_->world_size());
    }
    if (ddp_ || sdp_) {
      return fmt::format(
          "{}; {} over {} ranks ({}), {} gradient buckets",
          text,
          sdp_ ? "gradients reduced to their owners" : "DDP",
          replicas_->world_size(),
          replicas_->backend(),
          sdp_ ? sdp_->num_buckets() : ddp_->num_buckets());
    }
    return text + ", one data-parallel replica";
  }

 private:
  // The optimizer state of this rank's slices, consolidated from the replicas' pieces on
  // the first replica (None on the others). Collective (replicas).
  c10::IValue consolidated_over_replicas() {
    return consolidate_on_first_rank(
        sharded_->base(),
        sharded_->piece_ownership(),
        sharded_->type(),
        *replicas_,
        ParallelModel::trained_parameter_shapes());
  }

  std::shared_ptr<const TensorParallelState> tp_;
};

} // namespace

std::unique_ptr<ParallelModel> make_tensor_parallel_model(
    torch::nn::AnyModule model,
    std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options,
    std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer) {
  auto tp = std::make_shared<const TensorParallelState>(*model.ptr(), mesh->group("tp"));
  return std::make_unique<TensorParallelModel>(
      std::move(model),
      std::move(mesh),
      std::move(options),
      std::move(precision),
      std::move(param_groups),
      make_optimizer,
      std::move(tp));
}

} // namespace largo::parallel
