#include <largo/optim/sgd.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

namespace largo::optim {

SGD::SGD(std::vector<ParamGroup> param_groups, SGDOptions options)
    : Optimizer(std::move(param_groups)), options_(options) {
  if (!(options_.momentum >= 0.0)) {
    throw ConfigError(fmt::format(
        "OPTIMIZER.momentum = {} is invalid; use a value >= 0 (0 turns momentum off)",
        options_.momentum));
  }
  if (options_.nesterov && (options_.momentum <= 0.0 || options_.dampening != 0.0)) {
    throw ConfigError(fmt::format(
        "OPTIMIZER.nesterov = true needs OPTIMIZER.momentum > 0 and dampening = 0, got "
        "momentum = {} and dampening = {}; set nesterov to false or fix those values",
        options_.momentum,
        options_.dampening));
  }
}

std::vector<std::pair<std::string, c10::IValue>> SGD::hyperparameters() const {
  return {
      {"momentum", options_.momentum},
      {"dampening", options_.dampening},
      {"nesterov", options_.nesterov}};
}

void SGD::step() {
  torch::NoGradGuard no_grad;
  const double momentum = options_.momentum;
  for (ParamGroup& group : param_groups()) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      at::Tensor& param = group.params[i];
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) {
        continue;
      }
      if (grad.is_sparse()) {
        throw TrainingError(
            fmt::format("SGD does not support sparse gradients (parameter '{}')", group.names[i]));
      }
      // Same operations in the same order as torch.optim.SGD, so results match bit for bit.
      at::Tensor update = grad;
      if (group.weight_decay != 0.0) {
        update = update.add(param, group.weight_decay);
      }
      if (momentum != 0.0) {
        ParamState& param_state = state(group.names[i]);
        auto it = param_state.find("momentum_buffer");
        at::Tensor buffer;
        if (it == param_state.end()) {
          buffer = update.clone().detach();
          param_state["momentum_buffer"] = buffer;
        } else {
          buffer = it->second;
          buffer.mul_(momentum).add_(update, 1.0 - options_.dampening);
        }
        update = options_.nesterov ? update.add(buffer, momentum) : buffer;
      }
      param.add_(update, -group.lr);
    }
  }
}

} // namespace largo::optim
