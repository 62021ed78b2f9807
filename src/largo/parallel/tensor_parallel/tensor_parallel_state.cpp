#include "tensor_parallel_state.h"

#include <largo/core/error.h>
#include <largo/optim/grad_clipping.h>

#include <fmt/format.h>

#include <set>

namespace largo::parallel {

TensorParallelState::TensorParallelState(
    const torch::nn::Module& module, std::shared_ptr<comm::ProcessGroup> group)
    : group_(std::move(group)), specs_(tensor_parallel_sharded_parameters(module)) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const auto spec = specs_.find(item.key());
    if (spec != specs_.end()) {
      spec_by_tensor_[item.value().unsafeGetTensorImpl()] = spec->second;
    }
  }
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    const auto* layer = dynamic_cast<const TensorParallelModule*>(item.value().get());
    splits_sequence_ = splits_sequence_ || (layer != nullptr && layer->splits_sequence());
  }
}

const TensorParallelShardSpec* TensorParallelState::spec_of(const at::Tensor& parameter) const {
  const auto found = spec_by_tensor_.find(parameter.unsafeGetTensorImpl());
  return found == spec_by_tensor_.end() ? nullptr : &found->second;
}

std::vector<int64_t> TensorParallelState::full_shape(const at::Tensor& parameter) const {
  std::vector<int64_t> shape = parameter.sizes().vec();
  if (const TensorParallelShardSpec* spec = spec_of(parameter)) {
    shape[spec->dim] *= group_->world_size();
  }
  return shape;
}

std::map<std::string, std::vector<int64_t>>
TensorParallelState::full_shapes(const std::vector<optim::ParamGroup>& groups) const {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& group : groups) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      shapes[group.names.at(i)] = full_shape(group.params[i]);
    }
  }
  return shapes;
}

void TensorParallelState::place(StatePlacements& placements) const {
  for (const ParameterPlacement& parameter : placements.parameters()) {
    auto spec = specs_.find(parameter.name);
    if (spec != specs_.end()) {
      const Placement split = Placement::shard(spec->second.dim, spec->second.num_blocks);
      placements.place(parameter.name, "tp", split, split);
    }
  }
}

std::string TensorParallelState::describe() const {
  return fmt::format(
      "tensor parallel over {} ranks ({}), {} sharded parameters{}",
      group_->world_size(),
      group_->backend(),
      specs_.size(),
      splits_sequence_ ? ", sequence parallel" : "");
}

std::map<std::string, std::vector<int64_t>>
TensorParallelState::full_shapes(std::map<std::string, std::vector<int64_t>> local) const {
  for (auto& [name, shape] : local) {
    const auto spec = specs_.find(name);
    if (spec != specs_.end()) {
      shape[static_cast<size_t>(spec->second.dim)] *= group_->world_size();
    }
  }
  return local;
}

TensorParallelState::NamedTensors TensorParallelState::unshard(NamedTensors state) const {
  for (auto& [name, tensor] : state) {
    const auto spec = specs_.find(name);
    if (spec != specs_.end()) {
      tensor = parallel::unshard(tensor, spec->second, *group_);
    }
  }
  return state;
}

std::unordered_map<std::string, at::Tensor>
TensorParallelState::shard(std::unordered_map<std::string, at::Tensor> state) const {
  for (const auto& [name, spec] : specs_) {
    auto found = state.find(name);
    if (found != state.end()) { // a missing one is named by the loader
      found->second = shard_of(found->second, spec, group_->rank(), group_->world_size());
    }
  }
  return state;
}

bool TensorParallelState::update_full_value(
    torch::nn::Module& module,
    const std::string& name,
    const std::function<void(at::Tensor&)>& update) const {
  if (!is_shard(name)) {
    return false;
  }
  torch::NoGradGuard no_grad;
  at::Tensor slice = module.named_parameters()[name];
  update_full_slice(name, slice, update);
  return true;
}

void TensorParallelState::update_full_slice(
    const std::string& name,
    at::Tensor& slice,
    const std::function<void(at::Tensor&)>& update) const {
  const TensorParallelShardSpec& spec = specs_.at(name);
  torch::NoGradGuard no_grad;
  at::Tensor full = parallel::unshard(slice, spec, *group_);
  update(full);
  slice.copy_(shard_of(full, spec, group_->rank(), group_->world_size()));
}

c10::IValue TensorParallelState::map_optimizer_state(
    const c10::IValue& state_dict,
    const std::vector<optim::ParamGroup>& groups,
    bool gather) const {
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
  for (const auto& group : groups) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      parameter_by_name[group.names.at(i)] = group.params[i];
      names.push_back(group.names.at(i));
    }
  }
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
          element = parallel::unshard(tensor, *spec, *group_);
        } else if (!gather && tensor.dim() > 0 && tensor.sizes().vec() == full) {
          element = shard_of(tensor, *spec, group_->rank(), group_->world_size());
        }
      }
      entry.insert(item.key(), element);
    }
    mapped.insert(name, entry);
  };
  std::set<std::string> done;
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

optim::PartialNormReducer TensorParallelState::norm_reducer(
    std::vector<at::Tensor> parameters, double norm_type, optim::PartialNormReducer outer) const {
  std::vector<at::Tensor> shards, replicated;
  for (const at::Tensor& parameter : parameters) {
    (spec_of(parameter) ? shards : replicated).push_back(parameter);
  }
  return split_norm_reducer(
      std::move(shards), std::move(replicated), norm_type, nullptr, std::move(outer));
}

optim::PartialNormReducer TensorParallelState::piece_norm_reducer(
    const NamedTensors& pieces,
    double norm_type,
    std::shared_ptr<comm::ProcessGroup> replicas,
    optim::PartialNormReducer outer) const {
  std::vector<at::Tensor> shards, replicated;
  for (const auto& [name, piece] : pieces) {
    (specs_.count(name) > 0 ? shards : replicated).push_back(piece);
  }
  return split_norm_reducer(
      std::move(shards), std::move(replicated), norm_type, std::move(replicas), std::move(outer));
}

optim::PartialNormReducer TensorParallelState::split_norm_reducer(
    std::vector<at::Tensor> shards,
    std::vector<at::Tensor> replicated,
    double norm_type,
    std::shared_ptr<comm::ProcessGroup> inner,
    optim::PartialNormReducer outer) const {
  std::shared_ptr<comm::ProcessGroup> group = group_;
  const at::Tensor* first =
      !shards.empty() ? &shards.front() : (!replicated.empty() ? &replicated.front() : nullptr);
  const c10::optional<at::Device> device =
      first != nullptr ? c10::make_optional(first->device()) : c10::nullopt;
  return [shards = std::move(shards),
          replicated = std::move(replicated),
          group,
          inner,
          device,
          norm_type,
          outer](const at::Tensor& /*all_local*/, optim::NormReduceOp op) {
    at::Tensor sharded = optim::local_grad_norm_partial(shards, norm_type);
    at::Tensor whole = optim::local_grad_norm_partial(replicated, norm_type);
    const bool is_max = op == optim::NormReduceOp::max;
    const comm::ReduceOp reduce = is_max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum;
    const at::Device home = whole.device();
    if (device) { // on the gradients' device for the groups
      sharded = sharded.to(*device);
      whole = whole.to(*device);
    }
    if (inner) { // both over the replicas, in one all-reduce
      at::Tensor both = at::stack({sharded.reshape({}), whole.reshape({})});
      inner->all_reduce(both, reduce);
      sharded = both[0].reshape(sharded.sizes()).clone();
      whole = both[1].reshape(whole.sizes()).clone();
    }
    group->all_reduce(sharded, reduce);
    sharded = sharded.to(home);
    whole = whole.to(home);
    at::Tensor total = is_max ? at::maximum(sharded, whole) : sharded + whole;
    return outer ? outer(total, op) : total;
  };
}

optim::PartialNormReducer
TensorParallelState::parameter_norm_reducer(const std::vector<optim::ParamGroup>& groups) const {
  std::vector<uint8_t> is_shard; // per parameter, in the groups' order
  for (const auto& group : groups) {
    for (const std::string& name : group.names) {
      is_shard.push_back(specs_.count(name) > 0 ? 1 : 0);
    }
  }
  const int64_t count = static_cast<int64_t>(is_shard.size());
  // [2 * P]: the parameters' entries, then their gradients' (or updates').
  const at::Tensor mask =
      at::from_blob(is_shard.data(), {count}, at::kByte).to(at::kBool).repeat({2});
  std::shared_ptr<comm::ProcessGroup> group = group_;
  return [mask, count, group](const at::Tensor& partials, optim::NormReduceOp op) {
    if (partials.numel() != 2 * count) {
      throw Error(fmt::format(
          "tensor parallelism's per-parameter norms: {} partials for an optimizer over {} "
          "parameters (expected 2 x {})",
          partials.numel(),
          count,
          count));
    }
    const at::Tensor shards = mask.to(partials.device());
    // at::where, not a product with the mask: an inf partial stays inf (inf * 0 is NaN).
    at::Tensor summed = at::where(shards, partials, at::zeros_like(partials));
    group->all_reduce(
        summed, op == optim::NormReduceOp::max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum);
    return at::where(shards, summed, partials);
  };
}

} // namespace largo::parallel
