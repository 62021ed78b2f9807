#include "adam_update.h"

#include "multi_tensor_cpu.h"
#include "param_loop.h"

#include <torch/torch.h>

#include <cmath>

namespace largo::optim::detail {
namespace {

struct FusedAdamItem {
  at::Tensor param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq; // the last with amsgrad only
  double weight_decay = 0.0;
  double lr = 0.0;
  double step_size = 0.0;             // lr / (1 - beta1^t)
  double bias_correction2_sqrt = 1.0; // sqrt(1 - beta2^t)
};

// The expressions of torch.optim.Adam / AdamW's single-tensor step, in its order, over
// [begin, end) of one item.
template <typename scalar_t, bool kDecoupled, bool kAmsgrad>
void adam_loop(const FusedAdamItem& item, const AdamOptions& options, int64_t begin, int64_t end) {
  // Scalars are cast to the tensor dtype as ATen does for a Scalar operand.
  const auto one_minus_beta1 = static_cast<scalar_t>(1.0 - options.betas[0]);
  const auto beta2 = static_cast<scalar_t>(options.betas[1]);
  const auto one_minus_beta2 = static_cast<scalar_t>(1.0 - options.betas[1]);
  const auto eps = static_cast<scalar_t>(options.eps);
  const auto weight_decay = static_cast<scalar_t>(item.weight_decay);
  const auto decay_factor = static_cast<scalar_t>(1.0 - item.lr * item.weight_decay);
  const auto neg_step_size = static_cast<scalar_t>(-item.step_size);
  const auto bias_correction2_sqrt = static_cast<scalar_t>(item.bias_correction2_sqrt);
  const bool decay = item.weight_decay != 0.0;
  scalar_t* __restrict__ p = item.param.data_ptr<scalar_t>();
  const scalar_t* __restrict__ g = item.grad.data_ptr<scalar_t>();
  scalar_t* __restrict__ m = item.exp_avg.data_ptr<scalar_t>();
  scalar_t* __restrict__ v = item.exp_avg_sq.data_ptr<scalar_t>();
  scalar_t* __restrict__ v_max = kAmsgrad ? item.max_exp_avg_sq.data_ptr<scalar_t>() : nullptr;
  for (int64_t i = begin; i < end; ++i) {
    scalar_t d = g[i];
    scalar_t p_i = p[i];
    if (decay) {
      if constexpr (kDecoupled) {
        p_i = p_i * decay_factor;
      } else {
        d = d + weight_decay * p_i;
      }
    }
    const scalar_t m_new = aten_lerp(m[i], d, one_minus_beta1);
    const scalar_t v_new = v[i] * beta2 + one_minus_beta2 * d * d;
    m[i] = m_new;
    v[i] = v_new;
    scalar_t second = v_new;
    if constexpr (kAmsgrad) {
      second = std::max(v_max[i], v_new);
      v_max[i] = second;
    }
    const scalar_t denom = std::sqrt(second) / bias_correction2_sqrt + eps;
    p[i] = p_i + neg_step_size * (m_new / denom);
  }
}

void fused_cpu_step(
    const std::vector<FusedAdamItem>& fused, const AdamOptions& options, AdamWeightDecay decay) {
  const std::vector<Chunk> chunks = chunks_of_items(fused);
  for_each_chunk(chunks, [&](int64_t, const Chunk& chunk) {
    const FusedAdamItem& item = fused[static_cast<size_t>(chunk.tensor)];
    AT_DISPATCH_FLOATING_TYPES(item.param.scalar_type(), "adam_step", [&] {
      with_flag(decay == AdamWeightDecay::kDecoupled, [&](auto decoupled) {
        with_flag(options.amsgrad, [&](auto amsgrad) {
          adam_loop<scalar_t, decltype(decoupled)::value, decltype(amsgrad)::value>(
              item, options, chunk.begin, chunk.end);
        });
      });
    });
  });
}

// One group's parameters on the _foreach path.
struct ForeachLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<at::Scalar> neg_step_sizes, bias_corrections2_sqrt;
};

// The ops of torch.optim.Adam(foreach=True) (PyTorch 2.11), in its order.
void foreach_step(
    ForeachLists& lists,
    const ParamGroup& group,
    const AdamOptions& options,
    AdamWeightDecay decay) {
  std::vector<at::Tensor> grads = lists.grads;
  if (group.weight_decay != 0.0) {
    if (decay == AdamWeightDecay::kDecoupled) {
      at::_foreach_mul_(lists.params, 1.0 - group.lr * group.weight_decay);
    } else {
      grads = at::_foreach_add(grads, lists.params, group.weight_decay);
    }
  }
  at::_foreach_lerp_(lists.exp_avgs, grads, 1.0 - options.betas[0]);
  at::_foreach_mul_(lists.exp_avg_sqs, options.betas[1]);
  at::_foreach_addcmul_(lists.exp_avg_sqs, grads, grads, 1.0 - options.betas[1]);
  std::vector<at::Tensor> denoms;
  if (options.amsgrad) {
    at::_foreach_maximum_(lists.max_exp_avg_sqs, lists.exp_avg_sqs);
    denoms = at::_foreach_sqrt(lists.max_exp_avg_sqs);
  } else {
    denoms = at::_foreach_sqrt(lists.exp_avg_sqs);
  }
  at::_foreach_div_(denoms, lists.bias_corrections2_sqrt);
  at::_foreach_add_(denoms, options.eps);
  at::_foreach_addcdiv_(lists.params, lists.exp_avgs, denoms, lists.neg_step_sizes);
}

} // namespace

void adam_step(
    Optimizer& optimizer, const AdamOptions& options, AdamWeightDecay decay, const char* name) {
  torch::NoGradGuard no_grad;
  std::vector<ParamGroup>& groups = optimizer.param_groups();
  std::vector<FusedAdamItem> fused;
  std::vector<ForeachLists> lists(groups.size()); // per group: lr and weight decay are
  for_each_dense_grad(groups, name, [&](const GradParam<ParamGroup>& item) {
    ParamState& state = optimizer.state(item.name());
    const double step = advance_step(state);
    const at::Tensor& exp_avg = state_like(state, "exp_avg", item.param);
    const at::Tensor& exp_avg_sq = state_like(state, "exp_avg_sq", item.param);
    const at::Tensor max_exp_avg_sq =
        options.amsgrad ? state_like(state, "max_exp_avg_sq", item.param) : at::Tensor();
    const double lr = item.group.lr;
    // As torch.optim: bias corrections in double from the float32 step count.
    const double step_size = lr / (1.0 - std::pow(options.betas[0], step));
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(options.betas[1], step));
    const at::Tensor& param = item.param;
    const at::Tensor* v_max = options.amsgrad ? &max_exp_avg_sq : &param; // else unused
    const bool can_fuse =
        options.fused && can_use_cpu_kernels({&param, &item.grad, &exp_avg, &exp_avg_sq, v_max});
    if (can_fuse) {
      fused.push_back(
          {param,
           item.grad,
           exp_avg,
           exp_avg_sq,
           max_exp_avg_sq,
           item.group.weight_decay,
           lr,
           step_size,
           bias_correction2_sqrt});
      return;
    }
    ForeachLists& list = lists[item.group_index];
    list.params.push_back(param);
    list.grads.push_back(item.grad);
    list.exp_avgs.push_back(exp_avg);
    list.exp_avg_sqs.push_back(exp_avg_sq);
    list.max_exp_avg_sqs.push_back(max_exp_avg_sq);
    list.neg_step_sizes.emplace_back(-step_size);
    list.bias_corrections2_sqrt.emplace_back(bias_correction2_sqrt);
  });
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!lists[g].params.empty()) {
      foreach_step(lists[g], groups[g], options, decay);
    }
  }
  fused_cpu_step(fused, options, decay);
}

std::vector<std::pair<std::string, c10::IValue>> adam_hyperparameters(const AdamOptions& options) {
  c10::List<double> betas({options.betas[0], options.betas[1]});
  return {{"betas", betas}, {"eps", options.eps}, {"amsgrad", options.amsgrad}};
}

} // namespace largo::optim::detail
