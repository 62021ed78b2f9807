#include <largo/optim/adamw.h>

#include "multi_tensor_cpu.h"

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

namespace largo::optim {
namespace {

struct FusedAdamWItem {
  at::Tensor param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq; // the last with amsgrad only
  double decay_factor = 1.0;           // 1 - lr * weight_decay
  double step_size = 0.0;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1.0;  // sqrt(1 - beta2^t)
};

template <typename scalar_t>
void adamw_kernel(
    const FusedAdamWItem& item, const AdamWOptions& options, int64_t begin, int64_t end) {
  const auto beta1 = static_cast<scalar_t>(options.betas[0]);
  const auto beta2 = static_cast<scalar_t>(options.betas[1]);
  const auto one_minus_beta1 = static_cast<scalar_t>(1.0 - options.betas[0]);
  const auto one_minus_beta2 = static_cast<scalar_t>(1.0 - options.betas[1]);
  const auto eps = static_cast<scalar_t>(options.eps);
  const auto decay_factor = static_cast<scalar_t>(item.decay_factor);
  const auto neg_step_size = static_cast<scalar_t>(-item.step_size);
  const auto bias_correction2_sqrt = static_cast<scalar_t>(item.bias_correction2_sqrt);
  const bool decay = item.decay_factor != 1.0;
  scalar_t* __restrict__ p = item.param.data_ptr<scalar_t>();
  const scalar_t* __restrict__ g = item.grad.data_ptr<scalar_t>();
  scalar_t* __restrict__ m = item.exp_avg.data_ptr<scalar_t>();
  scalar_t* __restrict__ v = item.exp_avg_sq.data_ptr<scalar_t>();
  scalar_t* __restrict__ v_max = options.amsgrad ? item.max_exp_avg_sq.data_ptr<scalar_t>() : nullptr;
  for (int64_t i = begin; i < end; ++i) {
    // The expressions of torch.optim.AdamW, in its order.
    const scalar_t p_decayed = decay ? p[i] * decay_factor : p[i];
    const scalar_t m_new = m[i] * beta1 + one_minus_beta1 * g[i];
    const scalar_t v_new = v[i] * beta2 + one_minus_beta2 * g[i] * g[i];
    m[i] = m_new;
    v[i] = v_new;
    scalar_t second = v_new;
    if (options.amsgrad) {
      second = std::max(v_max[i], v_new);
      v_max[i] = second;
    }
    const scalar_t denom = std::sqrt(second) / bias_correction2_sqrt + eps;
    p[i] = p_decayed + neg_step_size * m_new / denom;
  }
}

} // namespace

AdamW::AdamW(std::vector<ParamGroup> param_groups, AdamWOptions options)
    : Optimizer(std::move(param_groups)), options_(options) {
  check_adam_moments(options_.betas, options_.eps, "AdamWOptions");
}

std::vector<std::pair<std::string, c10::IValue>> AdamW::hyperparameters() const {
  c10::List<double> betas({options_.betas[0], options_.betas[1]});
  return {{"betas", betas}, {"eps", options_.eps}, {"amsgrad", options_.amsgrad}};
}

void AdamW::step() {
  torch::NoGradGuard no_grad;
  const double beta1 = options_.betas[0];
  const double beta2 = options_.betas[1];
  std::vector<FusedAdamWItem> fused;
  for (ParamGroup& group : param_groups()) {
    const double lr = group.lr;
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
    std::vector<at::Scalar> neg_step_sizes, bias_corrections2_sqrt;
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
      step_count.add_(1);
      const double step = static_cast<double>(step_count.item<float>());
      const double step_size = lr / (1.0 - std::pow(beta1, step));
      const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(beta2, step));
      const at::Tensor& exp_avg = param_state.at("exp_avg");
      const at::Tensor& exp_avg_sq = param_state.at("exp_avg_sq");
      const at::Tensor max_exp_avg_sq =
          options_.amsgrad ? param_state.at("max_exp_avg_sq") : at::Tensor();
      const bool can_fuse = options_.fused &&
          detail::can_use_cpu_kernels(
              {&param, &grad, &exp_avg, &exp_avg_sq, options_.amsgrad ? &max_exp_avg_sq : &param});
      if (can_fuse) {
        fused.push_back(
            {param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, 1.0 - lr * group.weight_decay,
             step_size, bias_correction2_sqrt});
      } else {
        params.push_back(param);
        grads.push_back(grad);
        exp_avgs.push_back(exp_avg);
        exp_avg_sqs.push_back(exp_avg_sq);
        max_exp_avg_sqs.push_back(max_exp_avg_sq);
        neg_step_sizes.emplace_back(-step_size);
        bias_corrections2_sqrt.emplace_back(bias_correction2_sqrt);
      }
    }
    if (params.empty()) {
      continue;
    }
    // The ops of torch.optim.AdamW(foreach=True) (PyTorch 1.13), in its order.
    if (group.weight_decay != 0.0) {
      at::_foreach_mul_(params, 1.0 - lr * group.weight_decay);
    }
    at::_foreach_mul_(exp_avgs, beta1);
    at::_foreach_add_(exp_avgs, grads, 1.0 - beta1);
    at::_foreach_mul_(exp_avg_sqs, beta2);
    at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - beta2);
    std::vector<at::Tensor> denoms;
    if (options_.amsgrad) {
      at::_foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs);
      denoms = at::_foreach_sqrt(max_exp_avg_sqs);
    } else {
      denoms = at::_foreach_sqrt(exp_avg_sqs);
    }
    at::_foreach_div_(denoms, bias_corrections2_sqrt);
    at::_foreach_add_(denoms, options_.eps);
    at::_foreach_addcdiv_(params, exp_avgs, denoms, neg_step_sizes);
  }

  const std::vector<detail::Chunk> chunks = detail::chunks_of_items(fused);
  detail::for_each_chunk(chunks, [&](int64_t, const detail::Chunk& chunk) {
    const FusedAdamWItem& item = fused[static_cast<size_t>(chunk.tensor)];
    AT_DISPATCH_FLOATING_TYPES(item.param.scalar_type(), "adamw_step", [&] {
      adamw_kernel<scalar_t>(item, options_, chunk.begin, chunk.end);
    });
  });
}

} // namespace largo::optim
