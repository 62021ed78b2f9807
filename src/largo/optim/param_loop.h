// What every optimizer's step() begins with (private to the optim layer): visiting the
// parameters that have a gradient, and PyTorch's per-parameter step counter.
//
// One loop instead of one per optimizer, so that every optimizer skips a parameter without a
// gradient (its state untouched, as in PyTorch) and refuses a sparse gradient by name the
// same way.
#pragma once

#include <largo/core/error.h>
#include <largo/optim/optimizer.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace largo::optim::detail {

// One parameter with a dense gradient: group.params[index].
template <typename Group>
struct GradParam {
  Group& group;
  size_t group_index = 0; // of `group` among the optimizer's groups
  size_t index = 0;
  // Among all parameters of all groups, those without a gradient counted too: the slot of
  // this parameter in per-parameter tensors such as the partial norms (optimizer.h).
  int64_t position = 0;
  const at::Tensor& param;
  const at::Tensor& grad;

  const std::string& name() const {
    return group.names[index];
  }
};

// Calls fn(GradParam) for each parameter of `groups` that has a gradient, in group order.
// Throws TrainingError naming `optimizer` and the parameter for a sparse gradient.
// `Groups` is std::vector<ParamGroup>, const or not.
template <typename Groups, typename Fn>
void for_each_dense_grad(Groups& groups, const char* optimizer, Fn&& fn) {
  using Group = std::remove_reference_t<decltype(groups.front())>;
  int64_t position = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    Group& group = groups[g];
    for (size_t i = 0; i < group.params.size(); ++i, ++position) {
      const at::Tensor& param = group.params[i];
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) {
        continue;
      }
      if (grad.is_sparse()) {
        throw TrainingError(fmt::format(
            "{} does not support sparse gradients (parameter '{}')", optimizer, group.names[i]));
      }
      fn(GradParam<Group>{group, g, i, position, param, grad});
    }
  }
}

// How many parameters `groups` hold, with or without gradients: the slots of the per-parameter
// tensors (GradParam::position).
inline int64_t num_params(const std::vector<ParamGroup>& groups) {
  int64_t count = 0;
  for (const ParamGroup& group : groups) {
    count += static_cast<int64_t>(group.params.size());
  }
  return count;
}

// Adds one to the parameter's "step" (made at 0 on its first step) and returns the new count.
// A 0-dim float32 tensor, as in torch.optim (Adam, AdamW, RMSprop), so that state dicts move
// between the two; it stops counting at 2^24 steps, where Adam's bias corrections are
// already exactly 1.
inline double advance_step(ParamState& state) {
  auto it = state.find("step");
  if (it == state.end()) {
    it = state.emplace("step", at::zeros({}, at::kFloat)).first;
  }
  it->second.add_(1);
  return static_cast<double>(it->second.item<float>());
}

// The parameter's state entry `key`, made as zeros shaped like `param` (its layout kept, as
// torch.zeros_like(p, memory_format=torch.preserve_format)) if absent.
inline const at::Tensor&
state_like(ParamState& state, const std::string& key, const at::Tensor& param) {
  auto it = state.find(key);
  if (it == state.end()) {
    it = state.emplace(key, at::zeros_like(param, at::MemoryFormat::Preserve)).first;
  }
  return it->second;
}

} // namespace largo::optim::detail
