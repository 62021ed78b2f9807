#include "tensor_parallel_dimension.h"

namespace largo::parallel {

TensorParallelDimension::TensorParallelDimension(
    const torch::nn::Module& module, const DeviceMesh& mesh) {
  if (mesh.size("tp") > 1) {
    state_ = std::make_shared<const TensorParallelState>(module, mesh.group("tp"));
  }
}

std::string TensorParallelDimension::describe() const {
  return enabled() ? state_->describe() : std::string();
}

void TensorParallelDimension::place(StatePlacements& placements) const {
  if (enabled()) {
    state_->place(placements);
  }
}

TensorParallelDimension::NamedTensors
TensorParallelDimension::whole(NamedTensors state, const at::Device& device) const {
  if (!enabled() || state.empty()) {
    return state;
  }
  std::vector<at::Device> homes;
  for (auto& [name, tensor] : state) {
    homes.push_back(tensor.device());
    if (state_->is_shard(name)) {
      tensor = tensor.to(device);
    }
  }
  state = state_->unshard(std::move(state));
  for (size_t i = 0; i < state.size(); ++i) {
    state[i].second = state[i].second.to(homes[i]);
  }
  return state;
}

std::unordered_map<std::string, at::Tensor>
TensorParallelDimension::slices(std::unordered_map<std::string, at::Tensor> state) const {
  return enabled() ? state_->shard(std::move(state)) : state;
}

TensorParallelDimension::Update
TensorParallelDimension::update_of(const std::string& name, Update update) const {
  if (!enabled() || !state_->is_shard(name)) {
    return update;
  }
  return [state = state_, name, update = std::move(update)](at::Tensor& slice) {
    state->update_full_slice(name, slice, update);
  };
}

std::map<std::string, std::vector<int64_t>>
TensorParallelDimension::whole_shapes(std::map<std::string, std::vector<int64_t>> local) const {
  return enabled() ? state_->full_shapes(std::move(local)) : local;
}

c10::IValue TensorParallelDimension::optimizer_state(
    const c10::IValue& state, const std::vector<optim::ParamGroup>& groups, bool gather) const {
  if (!enabled() || state.isNone()) {
    return state;
  }
  return state_->map_optimizer_state(state, groups, gather);
}

ParameterNormCompletion TensorParallelDimension::parameter_norms() const {
  if (!enabled()) {
    return {};
  }
  return [state = state_](const std::vector<optim::ParamGroup>& groups) {
    return state->parameter_norm_reducer(groups);
  };
}

} // namespace largo::parallel
