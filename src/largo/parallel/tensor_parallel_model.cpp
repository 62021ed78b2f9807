// Tensor parallelism composed with DDP (torchtitan's 2-D parallelism): the module's planned
// layers are split over ParallelOptions::tensor_parallel_group (apply_tensor_parallel, done
// by the caller before the param groups were built), and DDP replicates that sharded module
// over parallelize()'s group, the data-parallel one: rank r of every replica holds the same
// slices, so DDP averages like with like. What differs from plain DDP is everything that
// must see the unsharded model: the gradient norm (the shards' partial norms summed over the
// tensor-parallel group, the replicated parameters counted once), and the state (model and
// optimizer) which is gathered to the full tensors on save and sliced on load, so that a
// checkpoint of this run is the one an unsharded run writes and reads.
#include "parallel_modes.h"
#include "tensor_parallel_state.h"

#include <largo/core/error.h>
#include <largo/optim/grad_clipping.h>
#include <largo/parallel/tensor_parallel.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>
#include <unordered_map>

namespace largo::parallel {

bool tensor_parallel_enabled(const ParallelOptions& options) {
  return options.tensor_parallel_size > 1 ||
         (options.tensor_parallel_group && options.tensor_parallel_group->world_size() > 1);
}

namespace {

std::string describe_tensor_parallel_group(const ParallelOptions& options) {
  if (!options.tensor_parallel_group) {
    return "null";
  }
  return fmt::format("a group of {} rank(s)", options.tensor_parallel_group->world_size());
}

// The option that switched tensor parallelism on, and its value, for the refusals: the size
// when a run plan set it (checked before any group exists), else the group.
std::pair<std::string, std::string> tensor_parallel_option(const ParallelOptions& options) {
  if (options.tensor_parallel_size > 1) {
    return {"ParallelOptions::tensor_parallel_size", std::to_string(options.tensor_parallel_size)};
  }
  return {"ParallelOptions::tensor_parallel_group", describe_tensor_parallel_group(options)};
}

} // namespace

void check_tensor_parallel_options(const ParallelOptions& options) {
  if (!tensor_parallel_enabled(options)) {
    return;
  }
  const auto [option, group] = tensor_parallel_option(options);
  if (options.data_parallelism != DataParallelism::kDdp) {
    throw OptionError(
        option,
        group,
        fmt::format(
            "1 (off) with ParallelOptions::data_parallelism = {}: tensor parallelism "
            "composes with DDP (kDdp) over the data-parallel group only (ZeRO and "
            "FSDP over tensor-parallel shards are not built)",
            to_string(options.data_parallelism)));
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
        option,
        group,
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
  const std::string group = describe_tensor_parallel_group(options);
  if (!tensor_parallel_enabled(options)) {
    if (!sharded_sizes.empty()) {
      throw OptionError(
          "ParallelOptions::tensor_parallel_group",
          group,
          fmt::format(
              "the group of {} ranks the module's layers were split over by "
              "apply_tensor_parallel (without it, parallelize() would train each "
              "rank's shards as if they were the whole model)",
              *sharded_sizes.begin()));
    }
    return;
  }
  if (!options.tensor_parallel_group ||
      (options.tensor_parallel_size > 1 &&
       options.tensor_parallel_group->world_size() != options.tensor_parallel_size)) {
    throw OptionError(
        "ParallelOptions::tensor_parallel_group",
        group,
        fmt::format(
            "a group of ParallelOptions::tensor_parallel_size = {} ranks (a DeviceMesh's "
            "\"tp\" group), the one apply_tensor_parallel split the module over",
            options.tensor_parallel_size));
  }
  const int64_t size = options.tensor_parallel_group->world_size();
  if (sharded_sizes.empty()) {
    throw OptionError(
        "ParallelOptions::tensor_parallel_group",
        group,
        "null for a module without tensor-parallel layers, or call "
        "apply_tensor_parallel(module, group) before building the param groups "
        "and parallelize()");
  }
  if (sharded_sizes != std::set<int64_t>{size}) {
    throw OptionError(
        "ParallelOptions::tensor_parallel_group",
        group,
        fmt::format(
            "the group the module was sharded over: its layers are split "
            "over {} rank(s)",
            fmt::join(sharded_sizes, ", ")));
  }
}

namespace {

class TensorParallelDdpModel : public ParallelModel {
 public:
  TensorParallelDdpModel(
      torch::nn::AnyModule model,
      std::shared_ptr<comm::ProcessGroup> group,
      ParallelOptions options,
      std::unique_ptr<precision::MixedPrecision> precision,
      std::vector<optim::ParamGroup> param_groups,
      const OptimizerFactory& make_optimizer)
      : ParallelModel(std::move(model), std::move(group), std::move(options), std::move(precision)),
        tp_(*module_, options_.tensor_parallel_group),
        // With the run's mesh, `group` is its world and the replicas are its "dp" group;
        // without, `group` is the replicas (the caller laid out the groups).
        dp_group_(options_.mesh ? options_.mesh->group("dp") : group_) {
    optimizer_ = make_optimizer(std::move(param_groups));
    for (const auto& param_group : optimizer_->param_groups()) {
      trained_parameters_.insert(
          trained_parameters_.end(), param_group.params.begin(), param_group.params.end());
    }
    if (dp_group_->world_size() > 1) { // broadcasts the replicas' rank 0's shards
      ddp_ = std::make_unique<DistributedDataParallel>(module_, dp_group_, options_.ddp);
    }
  }

  comm::ProcessGroup& data_parallel_group() const override {
    return *dp_group_;
  }

  comm::ProcessGroup* tensor_parallel_group() const override {
    return &tp_.group();
  }
  // local_state() is the module's tensors: this rank's slices of the sharded layers, which a
  // checkpoint of a per-rank average (the model EMA) gathers through model_state_dict().
  bool local_state_is_sharded() const override {
    return true;
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
    ParallelModel::load_model_state_dict(tp_.shard(state));
  }

  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    return parallel::full_parameters(*module_, tp_.group());
  }

  void update_full_parameter(
      const std::string& name, const std::function<void(at::Tensor&)>& update) override {
    if (!tp_.update_full_value(*module_, name, update)) {
      ParallelModel::update_full_parameter(name, update);
    }
  }

  c10::IValue optimizer_state_dict() override {
    return tp_.map_optimizer_state(
        optimizer_->state_dict(), optimizer_->param_groups(), /*gather=*/true);
  }

  void load_optimizer_state_dict(const c10::IValue& state) override {
    optimizer_->load_state_dict(
        tp_.map_optimizer_state(state, optimizer_->param_groups(), /*gather=*/false));
  }

  std::map<std::string, std::vector<int64_t>> trained_parameter_shapes() const override {
    return tp_.full_shapes(optimizer_->param_groups());
  }

 protected:
  void before_forward() override {
    if (ddp_) {
      ddp_->before_forward();
    }
  }
  std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync() override {
    return ddp_ ? std::make_unique<DistributedDataParallel::NoSyncGuard>(*ddp_) : nullptr;
  }
  void reduce_gradients() override {
    if (ddp_ && options_.ddp.manual_reduction) {
      ddp_->reduce_gradients();
    }
  }

  // After DDP every replica holds the same (averaged) gradients, so the global norm is the
  // tensor-parallel one; it goes through optim::clip_grad_norm's reducer so that the scaling
  // is that function's.
  double clip_gradients(double max_norm, double norm_type) override {
    return optim::clip_grad_norm(
        trained_parameters_, max_norm, norm_type, tp_.norm_reducer(trained_parameters_, norm_type));
  }

  std::string describe_mode() const override {
    const std::string tensor_parallel = fmt::format(
        "tensor parallel over {} ranks ({}), {} sharded parameters",
        tp_.group().world_size(),
        tp_.group().backend(),
        tp_.num_sharded());
    if (!ddp_) {
      return tensor_parallel + ", one data-parallel replica";
    }
    return fmt::format(
        "{}; DDP over {} ranks ({}), {} gradient buckets",
        tensor_parallel,
        dp_group_->world_size(),
        dp_group_->backend(),
        ddp_->num_buckets());
  }

 private:
  TensorParallelState tp_;
  std::shared_ptr<comm::ProcessGroup> dp_group_;
  std::unique_ptr<DistributedDataParallel> ddp_;
};

} // namespace

std::unique_ptr<ParallelModel> make_tensor_parallel_model(
    torch::nn::AnyModule model,
    std::shared_ptr<comm::ProcessGroup> group,
    ParallelOptions options,
    std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer) {
  return std::make_unique<TensorParallelDdpModel>(
      std::move(model),
      std::move(group),
      std::move(options),
      std::move(precision),
      std::move(param_groups),
      make_optimizer);
}

} // namespace largo::parallel
