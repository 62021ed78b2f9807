#include <largo/optim/lamb.h>

#include "multi_tensor_cpu.h"
#include "param_loop.h"

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace largo::optim {
namespace {

// One parameter of a step.
struct LambItem {
  at::Tensor param, grad, exp_avg, exp_avg_sq;
  size_t index = 0; // position among all the optimizer's parameters (the partials' layout)
  double lr = 0.0;
  double weight_decay = 0.0;
  double bias_correction1 = 1.0; // 1 - beta1^t
  double bias_correction2 = 1.0; // 1 - beta2^t
  double trust_ratio = 1.0;
};

// The per-element scalars of a parameter, cast to its dtype as ATen casts Scalar operands.
template <typename scalar_t>
struct LambScalars {
  scalar_t beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
  scalar_t bias_correction1, bias_correction2;
  LambScalars(const LambItem& item, const LAMBOptions& options)
      : beta1(static_cast<scalar_t>(options.betas[0])),
        beta2(static_cast<scalar_t>(options.betas[1])),
        one_minus_beta1(static_cast<scalar_t>(1.0 - options.betas[0])),
        one_minus_beta2(static_cast<scalar_t>(1.0 - options.betas[1])),
        eps(static_cast<scalar_t>(options.eps)),
        weight_decay(static_cast<scalar_t>(item.weight_decay)),
        bias_correction1(static_cast<scalar_t>(item.bias_correction1)),
        bias_correction2(static_cast<scalar_t>(item.bias_correction2)) {}

  // u from the updated moments; both passes call this, so they agree bit for bit.
  template <bool kDecay>
  scalar_t update(scalar_t m, scalar_t v, scalar_t p) const {
    const scalar_t u = (m / bias_correction1) / (std::sqrt(v / bias_correction2) + eps);
    if constexpr (kDecay) {
      return u + weight_decay * p;
    }
    return u;
  }
};

// Pass 1 over [0, n) of a chunk: the moments, and the chunk's sums of p^2 and u^2 in
// float64. Written as two simple loops per block of 256 elements (the update into a small
// buffer, then sums of squares) because each of them vectorizes and one fused loop does not.
template <typename scalar_t, bool kDecay>
std::pair<double, double> lamb_moments_loop(
    const scalar_t* __restrict__ p,
    const scalar_t* __restrict__ g,
    scalar_t* __restrict__ m,
    scalar_t* __restrict__ v,
    int64_t n,
    const LambScalars<scalar_t>& s) {
  constexpr int64_t kBlock = 256;
  scalar_t u[kBlock];
  double p_squares = 0.0, u_squares = 0.0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t count = std::min(kBlock, n - begin);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t e = begin + i;
      const scalar_t m_new = m[e] * s.beta1 + s.one_minus_beta1 * g[e];
      const scalar_t v_new = v[e] * s.beta2 + s.one_minus_beta2 * g[e] * g[e];
      m[e] = m_new;
      v[e] = v_new;
      u[i] = s.template update<kDecay>(m_new, v_new, p[e]);
    }
    p_squares += detail::sum_of_squares(p + begin, 0, count);
    u_squares += detail::sum_of_squares(u, 0, count);
  }
  return {p_squares, u_squares};
}

template <typename scalar_t>
std::pair<double, double>
lamb_moments_kernel(const LambItem& item, const LAMBOptions& options, int64_t begin, int64_t end) {
  const LambScalars<scalar_t> s(item, options);
  std::pair<double, double> sums;
  detail::with_flag(item.weight_decay != 0.0, [&](auto decay) {
    sums = lamb_moments_loop<scalar_t, decltype(decay)::value>(
        item.param.data_ptr<scalar_t>() + begin, item.grad.data_ptr<scalar_t>() + begin,
        item.exp_avg.data_ptr<scalar_t>() + begin, item.exp_avg_sq.data_ptr<scalar_t>() + begin,
        end - begin, s);
  });
  return sums;
}

// Pass 2 over [0, n) of a chunk: p -= lr * r * u.
template <typename scalar_t, bool kDecay>
void lamb_apply_loop(
    scalar_t* __restrict__ p,
    const scalar_t* __restrict__ m,
    const scalar_t* __restrict__ v,
    int64_t n,
    scalar_t neg_step,
    const LambScalars<scalar_t>& s) {
  for (int64_t i = 0; i < n; ++i) {
    p[i] = p[i] + neg_step * s.template update<kDecay>(m[i], v[i], p[i]);
  }
}

template <typename scalar_t>
void lamb_apply_kernel(const LambItem& item, const LAMBOptions& options, int64_t begin, int64_t end) {
  const LambScalars<scalar_t> s(item, options);
  detail::with_flag(item.weight_decay != 0.0, [&](auto decay) {
    lamb_apply_loop<scalar_t, decltype(decay)::value>(
        item.param.data_ptr<scalar_t>() + begin, item.exp_avg.data_ptr<scalar_t>() + begin,
        item.exp_avg_sq.data_ptr<scalar_t>() + begin, end - begin,
        static_cast<scalar_t>(-item.lr * item.trust_ratio), s);
  });
}

} // namespace

LAMB::LAMB(std::vector<ParamGroup> param_groups, LAMBOptions options)
    : Optimizer(std::move(param_groups)), options_(options) {
  check_adam_moments(options_.betas, options_.eps, "LAMBOptions");
}

std::vector<std::pair<std::string, c10::IValue>> LAMB::hyperparameters() const {
  c10::List<double> betas({options_.betas[0], options_.betas[1]});
  return {{"betas", betas}, {"eps", options_.eps}};
}

void LAMB::step() {
  torch::NoGradGuard no_grad;
  const double beta1 = options_.betas[0];
  const double beta2 = options_.betas[1];

  std::vector<LambItem> fused, others;
  at::Device device = at::kCPU;
  detail::for_each_dense_grad(param_groups(), "LAMB", [&](const detail::GradParam<ParamGroup>& p) {
    ParamState& param_state = state(p.name());
    const double step = detail::advance_step(param_state);
    LambItem item{
        p.param,
        p.grad,
        detail::state_like(param_state, "exp_avg", p.param),
        detail::state_like(param_state, "exp_avg_sq", p.param),
        static_cast<size_t>(p.position),
        p.group.lr,
        p.group.weight_decay,
        1.0 - std::pow(beta1, step),
        1.0 - std::pow(beta2, step)};
    device = p.param.device();
    const bool can_fuse =
        options_.fused &&
        detail::can_use_cpu_kernels({&p.param, &p.grad, &item.exp_avg, &item.exp_avg_sq});
    (can_fuse ? fused : others).push_back(std::move(item));
  });
  const int64_t num = detail::num_params(param_groups());
  if (fused.empty() && others.empty()) {
    // Nothing to update here, but a sharded run's reducer is a collective every rank joins.
    reduce_partials(norm_reducer(), at::zeros({2 * num}, at::kDouble), NormReduceOp::sum);
    return;
  }

  // Pass 1, fused: moments and per-chunk partial norms.
  const std::vector<detail::Chunk> chunks = detail::chunks_of_items(fused);
  std::vector<double> p_partials(chunks.size()), u_partials(chunks.size());
  detail::for_each_chunk(chunks, [&](int64_t c, const detail::Chunk& chunk) {
    const LambItem& item = fused[static_cast<size_t>(chunk.tensor)];
    AT_DISPATCH_FLOATING_TYPES(item.param.scalar_type(), "lamb_moments", [&] {
      std::tie(p_partials[static_cast<size_t>(c)], u_partials[static_cast<size_t>(c)]) =
          lamb_moments_kernel<scalar_t>(item, options_, chunk.begin, chunk.end);
    });
  });
  at::Tensor partials = at::zeros({2 * num}, at::kDouble); // [||p||^2..., ||u||^2...]
  {
    auto* out = partials.data_ptr<double>();
    const auto p_sums = detail::sum_per_tensor(chunks, p_partials, fused.size());
    const auto u_sums = detail::sum_per_tensor(chunks, u_partials, fused.size());
    for (size_t k = 0; k < fused.size(); ++k) {
      out[fused[k].index] = p_sums[k];
      out[num + static_cast<int64_t>(fused[k].index)] = u_sums[k];
    }
  }

  // Pass 1, _foreach: moments, then u materialized (the ops of the Python reference).
  std::vector<at::Tensor> params, updates;
  if (!others.empty()) {
    std::vector<at::Tensor> grads, exp_avgs, exp_avg_sqs;
    std::vector<at::Scalar> bias_corrections1, bias_corrections2, weight_decays;
    for (const LambItem& item : others) {
      params.push_back(item.param);
      grads.push_back(item.grad);
      exp_avgs.push_back(item.exp_avg);
      exp_avg_sqs.push_back(item.exp_avg_sq);
      bias_corrections1.emplace_back(item.bias_correction1);
      bias_corrections2.emplace_back(item.bias_correction2);
      weight_decays.emplace_back(item.weight_decay);
    }
    at::_foreach_mul_(exp_avgs, beta1);
    at::_foreach_add_(exp_avgs, grads, 1.0 - beta1);
    at::_foreach_mul_(exp_avg_sqs, beta2);
    at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - beta2);
    std::vector<at::Tensor> denoms = at::_foreach_div(exp_avg_sqs, bias_corrections2);
    at::_foreach_sqrt_(denoms);
    at::_foreach_add_(denoms, options_.eps);
    updates = at::_foreach_div(exp_avgs, bias_corrections1);
    at::_foreach_div_(updates, denoms);
    at::_foreach_add_(updates, at::_foreach_mul(params, weight_decays));
    const at::Tensor p_squares = squared_norms(params).to(at::kCPU);
    const at::Tensor u_squares = squared_norms(updates).to(at::kCPU);
    auto* out = partials.data_ptr<double>();
    for (size_t k = 0; k < others.size(); ++k) {
      out[others[k].index] = p_squares[static_cast<int64_t>(k)].item<double>();
      out[num + static_cast<int64_t>(others[k].index)] = u_squares[static_cast<int64_t>(k)].item<double>();
    }
  }

  // Complete the norms across ranks, then the trust ratios.
  const at::Tensor reduced =
      reduce_partials(norm_reducer(), partials.to(device), NormReduceOp::sum).to(at::kCPU);
  const double* squares = reduced.data_ptr<double>();
  for (std::vector<LambItem>* items : {&fused, &others}) {
    for (LambItem& item : *items) {
      const double param_norm = std::sqrt(squares[item.index]);
      const double update_norm = std::sqrt(squares[num + static_cast<int64_t>(item.index)]);
      item.trust_ratio = param_norm > 0.0 && update_norm > 0.0 ? param_norm / update_norm : 1.0;
    }
  }

  // Pass 2.
  detail::for_each_chunk(chunks, [&](int64_t, const detail::Chunk& chunk) {
    const LambItem& item = fused[static_cast<size_t>(chunk.tensor)];
    AT_DISPATCH_FLOATING_TYPES(item.param.scalar_type(), "lamb_apply", [&] {
      lamb_apply_kernel<scalar_t>(item, options_, chunk.begin, chunk.end);
    });
  });
  if (!others.empty()) {
    std::vector<at::Scalar> steps;
    for (const LambItem& item : others) {
      steps.emplace_back(-item.lr * item.trust_ratio);
    }
    at::_foreach_mul_(updates, steps);
    at::_foreach_add_(params, updates);
  }
}

} // namespace largo::optim
