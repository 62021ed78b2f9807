#include "tensor_parallel_dimension.h"

#include <largo/models/module_device.h>

namespace largo::parallel {

TensorParallelDimension::TensorParallelDimension(
    const torch::nn::Module& module, const DeviceMesh& mesh)
    : device_(models::module_device(module)) {
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

TensorParallelDimension::NamedTensors TensorParallelDimension::whole_values(
    NamedTensors state, int /*root*/, Elsewhere /*elsewhere*/) const {
  if (!enabled() || state.empty()) {
    return state;
  }
  std::vector<at::Device> homes;
  for (auto& [name, tensor] : state) {
    homes.push_back(tensor.device());
    if (state_->is_shard(name)) {
      tensor = tensor.to(device_);
    }
  }
  state = state_->unshard(std::move(state));
  for (size_t i = 0; i < state.size(); ++i) {
    state[i].second = state[i].second.to(homes[i]);
  }
  return state;
}

TensorParallelDimension::Values TensorParallelDimension::part_of_values(Values whole) const {
  return enabled() ? state_->shard(std::move(whole)) : whole;
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

c10::IValue TensorParallelDimension::whole_optimizer_state(
    const c10::IValue& part, const std::vector<optim::ParamGroup>& groups) const {
  if (!enabled() || part.isNone()) {
    return part;
  }
  return state_->map_optimizer_state(part, groups, /*gather=*/true);
}

c10::IValue TensorParallelDimension::part_of_optimizer_state(
    const c10::IValue& whole, const std::vector<optim::ParamGroup>& groups) const {
  if (!enabled() || whole.isNone()) {
    return whole;
  }
  return state_->map_optimizer_state(whole, groups, /*gather=*/false);
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
