#include <largo/optim/rmsprop.h>

#include "multi_tensor_cpu.h"
#include "param_loop.h"

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

namespace largo::optim {
namespace {

struct FusedRmspropItem {
  at::Tensor param, grad, square_avg, grad_avg, momentum_buffer; // the last two when used
  double lr = 0.0;
  double weight_decay = 0.0;
};

// The expressions of torch.optim.RMSprop's single-tensor step, in its order, over [begin, end)
// of one item. The switches are template parameters so that each variant is a straight loop.
template <typename scalar_t, bool kDecay, bool kCentered, bool kMomentum>
void rmsprop_loop(
    const FusedRmspropItem& item, const RMSpropOptions& options, int64_t begin, int64_t end) {
  // Scalars are cast to the tensor dtype as ATen does for a Scalar operand.
  const auto alpha = static_cast<scalar_t>(options.alpha);
  const auto one_minus_alpha = static_cast<scalar_t>(1.0 - options.alpha);
  const auto eps = static_cast<scalar_t>(options.eps);
  const auto momentum = static_cast<scalar_t>(options.momentum);
  const auto weight_decay = static_cast<scalar_t>(item.weight_decay);
  const auto neg_lr = static_cast<scalar_t>(-item.lr);
  scalar_t* __restrict__ p = item.param.data_ptr<scalar_t>();
  const scalar_t* __restrict__ g = item.grad.data_ptr<scalar_t>();
  scalar_t* __restrict__ s = item.square_avg.data_ptr<scalar_t>();
  scalar_t* __restrict__ a = kCentered ? item.grad_avg.data_ptr<scalar_t>() : nullptr;
  scalar_t* __restrict__ buf = kMomentum ? item.momentum_buffer.data_ptr<scalar_t>() : nullptr;
  for (int64_t i = begin; i < end; ++i) {
    scalar_t d = g[i];
    if constexpr (kDecay) {
      d = d + weight_decay * p[i];
    }
    const scalar_t s_new = s[i] * alpha + one_minus_alpha * d * d;
    s[i] = s_new;
    scalar_t avg;
    if constexpr (kCentered) {
      const scalar_t a_new = detail::aten_lerp(a[i], d, one_minus_alpha);
      a[i] = a_new;
      avg = std::sqrt(s_new + scalar_t(-1) * a_new * a_new) + eps;
    } else {
      avg = std::sqrt(s_new) + eps;
    }
    if constexpr (kMomentum) {
      const scalar_t b = buf[i] * momentum + d / avg;
      buf[i] = b;
      p[i] = p[i] + neg_lr * b;
    } else {
      p[i] = p[i] + neg_lr * (d / avg);
    }
  }
}

void fused_cpu_step(const std::vector<FusedRmspropItem>& fused, const RMSpropOptions& options) {
  using detail::with_flag;
  const std::vector<detail::Chunk> chunks = detail::chunks_of_items(fused);
  detail::for_each_chunk(chunks, [&](int64_t, const detail::Chunk& chunk) {
    const FusedRmspropItem& item = fused[static_cast<size_t>(chunk.tensor)];
    AT_DISPATCH_FLOATING_TYPES(item.param.scalar_type(), "rmsprop_step", [&] {
      with_flag(item.weight_decay != 0.0, [&](auto decay) {
        with_flag(options.centered, [&](auto centered) {
          with_flag(options.momentum > 0.0, [&](auto momentum) {
            rmsprop_loop<
                scalar_t,
                decltype(decay)::value,
                decltype(centered)::value,
                decltype(momentum)::value>(item, options, chunk.begin, chunk.end);
          });
        });
      });
    });
  });
}

// One group's parameters on the _foreach path.
struct ForeachLists {
  std::vector<at::Tensor> params, grads, square_avgs, grad_avgs, momentum_buffers;
};

// The ops of torch.optim.RMSprop(foreach=True) (PyTorch 2.11), in its order.
void foreach_step(ForeachLists& lists, const ParamGroup& group, const RMSpropOptions& options) {
  std::vector<at::Tensor> grads = lists.grads;
  if (group.weight_decay != 0.0) {
    grads = at::_foreach_add(grads, lists.params, group.weight_decay);
  }
  at::_foreach_mul_(lists.square_avgs, options.alpha);
  at::_foreach_addcmul_(lists.square_avgs, grads, grads, 1.0 - options.alpha);
  std::vector<at::Tensor> avgs;
  if (options.centered) {
    at::_foreach_lerp_(lists.grad_avgs, grads, 1.0 - options.alpha);
    avgs = at::_foreach_addcmul(lists.square_avgs, lists.grad_avgs, lists.grad_avgs, -1.0);
    at::_foreach_sqrt_(avgs);
  } else {
    avgs = at::_foreach_sqrt(lists.square_avgs);
  }
  at::_foreach_add_(avgs, options.eps);
  if (options.momentum > 0.0) {
    at::_foreach_mul_(lists.momentum_buffers, options.momentum);
    at::_foreach_addcdiv_(lists.momentum_buffers, grads, avgs, 1.0);
    at::_foreach_add_(lists.params, lists.momentum_buffers, -group.lr);
  } else {
    at::_foreach_addcdiv_(lists.params, grads, avgs, -group.lr);
  }
}

void check_unit_interval(double value, const char* key) {
  if (!(value >= 0.0 && value < 1.0)) {
    throw ConfigError(
        fmt::format("RMSpropOptions::{} = {} is invalid; use a value in [0, 1)", key, value));
  }
}

} // namespace

RMSprop::RMSprop(std::vector<ParamGroup> param_groups, RMSpropOptions options)
    : Optimizer(std::move(param_groups)), options_(options) {
  check_unit_interval(options_.alpha, "alpha");
  check_unit_interval(options_.momentum, "momentum");
  if (!(options_.eps > 0.0)) {
    throw ConfigError(fmt::format(
        "RMSpropOptions::eps = {} is invalid; use a value > 0 (it keeps the division by "
        "the root mean square finite)",
        options_.eps));
  }
}

std::vector<std::pair<std::string, c10::IValue>> RMSprop::hyperparameters() const {
  return {
      {"alpha", options_.alpha},
      {"eps", options_.eps},
      {"momentum", options_.momentum},
      {"centered", options_.centered}};
}

void RMSprop::step() {
  torch::NoGradGuard no_grad;
  std::vector<ParamGroup>& groups = param_groups();
  std::vector<FusedRmspropItem> fused;
  std::vector<ForeachLists> lists(groups.size()); // per group: lr and weight decay are
  const bool use_momentum = options_.momentum > 0.0;
  detail::for_each_dense_grad(groups, "RMSprop", [&](const detail::GradParam<ParamGroup>& item) {
    ParamState& param_state = state(item.name());
    detail::advance_step(param_state);
    const at::Tensor& param = item.param;
    const at::Tensor& square_avg = detail::state_like(param_state, "square_avg", param);
    const at::Tensor grad_avg =
        options_.centered ? detail::state_like(param_state, "grad_avg", param) : at::Tensor();
    const at::Tensor momentum_buffer =
        use_momentum ? detail::state_like(param_state, "momentum_buffer", param) : at::Tensor();
    const bool can_fuse = options_.fused && detail::can_use_cpu_kernels(
                                                {&param,
                                                 &item.grad,
                                                 &square_avg,
                                                 options_.centered ? &grad_avg : &param,
                                                 use_momentum ? &momentum_buffer : &param});
    if (can_fuse) {
      fused.push_back(
          {param,
           item.grad,
           square_avg,
           grad_avg,
           momentum_buffer,
           item.group.lr,
           item.group.weight_decay});
      return;
    }
    ForeachLists& list = lists[item.group_index];
    list.params.push_back(param);
    list.grads.push_back(item.grad);
    list.square_avgs.push_back(square_avg);
    list.grad_avgs.push_back(grad_avg);
    list.momentum_buffers.push_back(momentum_buffer);
  });
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!lists[g].params.empty()) {
      foreach_step(lists[g], groups[g], options_);
    }
  }
  fused_cpu_step(fused, options_);
}

} // namespace largo::optim
