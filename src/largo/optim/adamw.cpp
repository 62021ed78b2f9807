#include <largo/optim/adamw.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

namespace largo::optim {

AdamW::AdamW(std::vector<ParamGroup> param_groups, AdamWOptions options)
    : Optimizer(std::move(param_groups)), options_(options) {
  for (size_t i = 0; i < options_.betas.size(); ++i) {
    const double beta = options_.betas[i];
    if (!(beta >= 0.0 && beta < 1.0)) {
      throw ConfigError(
          fmt::format("OPTIMIZER.betas[{}] = {} is invalid; each beta must be in [0, 1)", i, beta));
    }
  }
  if (!(options_.eps >= 0.0)) {
    throw ConfigError(fmt::format("OPTIMIZER.eps = {} is invalid; use a value >= 0", options_.eps));
  }
}

std::vector<std::pair<std::string, c10::IValue>> AdamW::hyperparameters() const {
  c10::List<double> betas({options_.betas[0], options_.betas[1]});
  return {{"betas", betas}, {"eps", options_.eps}, {"amsgrad", options_.amsgrad}};
}

void AdamW::step() {
  torch::NoGradGuard no_grad;
  const double beta1 = options_.betas[0];
  const double beta2 = options_.betas[1];
  for (ParamGroup& group : param_groups()) {
    const double lr = group.lr;
    for (size_t i = 0; i < group.params.size(); ++i) {
      at::Tensor& param = group.params[i];
      const at::Tensor& grad = param.grad();
      if (!grad.defined()) {
        continue;
      }
      if (grad.is_sparse()) {
        throw TrainingError(fmt::format(
            "AdamW does not support sparse gradients (parameter '{}')", group.names[i]));
      }
      ParamState& param_state = state(group.names[i]);
      if (param_state.empty()) {
        // float32 like PyTorch's, so state dicts move between the two; it stops counting at
        // 2^24 steps, where both bias corrections are already exactly 1.
        param_state["step"] = torch::zeros({}, torch::kFloat32);
        param_state["exp_avg"] = torch::zeros_like(param, at::MemoryFormat::Preserve);
        param_state["exp_avg_sq"] = torch::zeros_like(param, at::MemoryFormat::Preserve);
      }
      if (options_.amsgrad && param_state.count("max_exp_avg_sq") == 0) {
        param_state["max_exp_avg_sq"] = torch::zeros_like(param, at::MemoryFormat::Preserve);
      }
      at::Tensor& step_count = param_state.at("step");
      at::Tensor& exp_avg = param_state.at("exp_avg");
      at::Tensor& exp_avg_sq = param_state.at("exp_avg_sq");

      // Same operations in the same order as torch.optim.AdamW, so results match bit for bit.
      step_count.add_(1);
      if (group.weight_decay != 0.0) {
        param.mul_(1.0 - lr * group.weight_decay);
      }
      exp_avg.mul_(beta1).add_(grad, 1.0 - beta1);
      exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);

      const double step = static_cast<double>(step_count.item<float>());
      const double bias_correction1 = 1.0 - std::pow(beta1, step);
      const double bias_correction2 = 1.0 - std::pow(beta2, step);
      const double step_size = lr / bias_correction1;
      const double bias_correction2_sqrt = std::sqrt(bias_correction2);

      at::Tensor denom;
      if (options_.amsgrad) {
        at::Tensor& max_exp_avg_sq = param_state.at("max_exp_avg_sq");
        at::maximum_out(max_exp_avg_sq, max_exp_avg_sq, exp_avg_sq);
        denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options_.eps);
      } else {
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options_.eps);
      }
      param.addcdiv_(exp_avg, denom, -step_size);
    }
  }
}

} // namespace largo::optim
