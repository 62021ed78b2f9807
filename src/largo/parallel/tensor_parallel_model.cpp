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
  if (options.pipeline.enabled()) {
    throw OptionError(
        option,
        group,
        fmt::format(
            "1 (off) with ParallelOptions::pipeline.size = {}: tensor "
            "parallelism inside pipeline stages is not built",
            options.pipeline.size));
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
        tp_group_(options_.tensor_parallel_group),
        // With the run's mesh, `group` is its world and the replicas are its "dp" group;
        // without, `group` is the replicas (the caller laid out the groups).
        dp_group_(options_.mesh ? options_.mesh->group("dp") : group_),
        specs_(tensor_parallel_sharded_parameters(*module_)) {
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      const auto spec = specs_.find(item.key());
      if (spec != specs_.end()) {
        spec_by_tensor_[item.value().unsafeGetTensorImpl()] = spec->second;
      }
    }
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
    return tp_group_.get();
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
    std::unordered_map<std::string, at::Tensor> local = state;
    for (const auto& [name, spec] : specs_) {
      auto found = local.find(name);
      if (found != local.end()) { // a missing one is named by the base
        found->second = shard_of(found->second, spec, tp_group_->rank(), tp_group_->world_size());
      }
    }
    ParallelModel::load_model_state_dict(local);
  }

  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    return parallel::full_parameters(*module_, *tp_group_);
  }

  void update_full_parameter(
      const std::string& name, const std::function<void(at::Tensor&)>& update) override {
    const auto spec = specs_.find(name);
    if (spec == specs_.end()) {
      ParallelModel::update_full_parameter(name, update);
      return;
    }
    torch::NoGradGuard no_grad;
    at::Tensor full = full_parameter(*module_, name, *tp_group_);
    update(full);
    module_->named_parameters()[name].copy_(
        shard_of(full, spec->second, tp_group_->rank(), tp_group_->world_size()));
  }

  c10::IValue optimizer_state_dict() override {
    return map_optimizer_state(optimizer_->state_dict(), /*gather=*/true);
  }

  void load_optimizer_state_dict(const c10::IValue& state) override {
    optimizer_->load_state_dict(map_optimizer_state(state, /*gather=*/false));
  }

  std::map<std::string, std::vector<int64_t>> trained_parameter_shapes() const override {
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& group : optimizer_->param_groups()) {
      for (size_t i = 0; i < group.params.size(); ++i) {
        shapes[group.names.at(i)] = full_shape(group.params[i]);
      }
    }
    return shapes;
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
  // tensor-parallel one: the shards' partials summed (or, for the max norm, maxed) over the
  // tensor-parallel group, plus the replicated parameters' partial, counted once. It goes
  // through optim::clip_grad_norm's reducer so that the scaling is that function's.
  double clip_gradients(double max_norm, double norm_type) override {
    std::vector<at::Tensor> shards, replicated;
    for (const at::Tensor& parameter : trained_parameters_) {
      (spec_of(parameter) ? shards : replicated).push_back(parameter);
    }
    comm::ProcessGroup& tp_group = *tp_group_;
    const optim::PartialNormReducer reducer = [&](const at::Tensor& /*all_local*/,
                                                  optim::NormReduceOp op) {
      at::Tensor sharded = optim::local_grad_norm_partial(shards, norm_type);
      at::Tensor whole = optim::local_grad_norm_partial(replicated, norm_type);
      const bool is_max = op == optim::NormReduceOp::max;
      if (!trained_parameters_.empty()) { // on the gradients' device for the group
        sharded = sharded.to(trained_parameters_.front().device());
      }
      tp_group.all_reduce(sharded, is_max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum);
      sharded = sharded.to(whole.device());
      return is_max ? at::maximum(sharded, whole) : sharded + whole;
    };
    return optim::clip_grad_norm(trained_parameters_, max_norm, norm_type, reducer);
  }

  std::string describe_mode() const override {
    const std::string tensor_parallel = fmt::format(
        "tensor parallel over {} ranks ({}), {} sharded parameters",
        tp_group_->world_size(),
        tp_group_->backend(),
        specs_.size());
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
  const TensorParallelShardSpec* spec_of(const at::Tensor& parameter) const {
    const auto found = spec_by_tensor_.find(parameter.unsafeGetTensorImpl());
    return found == spec_by_tensor_.end() ? nullptr : &found->second;
  }

  std::vector<int64_t> full_shape(const at::Tensor& parameter) const {
    std::vector<int64_t> shape = parameter.sizes().vec();
    if (const TensorParallelShardSpec* spec = spec_of(parameter)) {
      shape[spec->dim] *= tp_group_->world_size();
    }
    return shape;
  }

  // The optimizer state with each shard's per-element entries (those shaped like the
  // parameter: momentum, exp_avg, exp_avg_sq; not AdamW's step) gathered to the full
  // parameter's shape (gather; a collective, in the groups' parameter order and each entry's
  // key order, the same on every rank) or sliced from it (not gather).
  c10::IValue map_optimizer_state(const c10::IValue& state_dict, bool gather) const {
    if (!state_dict.isGenericDict()) {
      return state_dict; // the optimizer names what is wrong with it
    }
    c10::impl::GenericDict root = state_dict.toGenericDict().copy();
    if (!root.contains("state") || !root.at("state").isGenericDict()) {
      return root;
    }
    const c10::impl::GenericDict saved = root.at("state").toGenericDict();
    c10::impl::GenericDict mapped(c10::StringType::get(), c10::AnyType::get());
    std::unordered_map<std::string, at::Tensor> parameter_by_name;
    std::vector<std::string> names; // the groups' order: the same on every rank
    for (const auto& group : optimizer_->param_groups()) {
      for (size_t i = 0; i < group.params.size(); ++i) {
        parameter_by_name[group.names.at(i)] = group.params[i];
        names.push_back(group.names.at(i));
      }
    }
    std::set<std::string> done;
    auto map_entry = [&](const std::string& name, const c10::IValue& value) {
      const auto parameter = parameter_by_name.find(name);
      const TensorParallelShardSpec* spec =
          parameter == parameter_by_name.end() ? nullptr : spec_of(parameter->second);
      if (spec == nullptr || !value.isGenericDict()) {
        mapped.insert(name, value);
        return;
      }
      const at::Tensor& local = parameter->second;
      const std::vector<int64_t> full = full_shape(local);
      c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
      for (const auto& item : value.toGenericDict()) {
        c10::IValue element = item.value();
        if (element.isTensor()) {
          const at::Tensor tensor = element.toTensor();
          if (gather && tensor.dim() > 0 && tensor.sizes() == local.sizes()) {
            element = unshard(tensor, *spec, *tp_group_);
          } else if (!gather && tensor.dim() > 0 && tensor.sizes().vec() == full) {
            element = shard_of(tensor, *spec, tp_group_->rank(), tp_group_->world_size());
          }
        }
        entry.insert(item.key(), element);
      }
      mapped.insert(name, entry);
    };
    if (gather) { // in the groups' order, which every rank shares
      for (const std::string& name : names) {
        if (saved.contains(name)) {
          map_entry(name, saved.at(name));
          done.insert(name);
        }
      }
    }
    for (const auto& item : saved) { // loading (no collective), or names of no group
      const std::string name = item.key().toStringRef();
      if (done.count(name) == 0) {
        map_entry(name, item.value());
      }
    }
    root.insert_or_assign("state", mapped);
    return root;
  }

  std::shared_ptr<comm::ProcessGroup> tp_group_;
  std::shared_ptr<comm::ProcessGroup> dp_group_;
  std::map<std::string, TensorParallelShardSpec> specs_; // by module parameter name
  std::unordered_map<const c10::TensorImpl*, TensorParallelShardSpec> spec_by_tensor_;
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
