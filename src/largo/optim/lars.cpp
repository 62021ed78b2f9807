#include <largo/optim/lars.h>

#include "param_loop.h"

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

namespace largo::optim {
namespace {

// One parameter of a step.
struct LarsItem {
  at::Tensor param, grad, mu;
  at::Tensor update; // dp = g + weight_decay * p, then dp * q
  int64_t index = 0; // position among all the optimizer's parameters (the partials' layout)
  const ParamGroup* group = nullptr;
  bool adapted = true; // not excluded from the trust ratio
  double trust_ratio = 1.0;
};

// dp = g + weight_decay * p for every item, one _foreach call per group (the decay is the
// group's). VISSL's dp.add(p, alpha=weight_decay) makes a new tensor: the gradient is kept.
void decay_into_updates(std::vector<LarsItem>& items) {
  for (size_t first = 0; first < items.size();) {
    size_t last = first;
    std::vector<at::Tensor> grads, params;
    while (last < items.size() && items[last].group == items[first].group) {
      grads.push_back(items[last].grad);
      params.push_back(items[last].param);
      ++last;
    }
    std::vector<at::Tensor> updates =
        at::_foreach_add(grads, params, items[first].group->weight_decay);
    for (size_t k = first; k < last; ++k) {
      items[k].update = std::move(updates[k - first]);
    }
    first = last;
  }
}

// This rank's [2 * num_params] float64 partials: ||p||^2 and ||dp||^2 of the adapted items
// at their positions, zeros elsewhere; on the device of the items' tensors.
at::Tensor
local_partials(const std::vector<LarsItem>& items, int64_t num_params, at::Device device) {
  std::vector<at::Tensor> params, updates;
  std::vector<int64_t> positions;
  for (const LarsItem& item : items) {
    if (item.adapted) {
      params.push_back(item.param);
      updates.push_back(item.update);
      positions.push_back(item.index);
    }
  }
  at::Tensor partials = at::zeros({2 * num_params}, at::TensorOptions(at::kDouble).device(device));
  if (positions.empty()) {
    return partials;
  }
  std::vector<at::Tensor> all = params;
  all.insert(all.end(), updates.begin(), updates.end());
  const at::Tensor local = squared_norms(all); // [p..., dp...] of the adapted items
  at::Tensor index = at::tensor(positions, at::kLong);
  index = at::cat({index, index + num_params}).to(device);
  return partials.index_copy_(0, index, local);
}

// q = eta * ||p|| / ||dp|| where both norms are > 0, else 1 (VISSL's two torch.where).
void set_trust_ratios(std::vector<LarsItem>& items, const at::Tensor& reduced, double eta) {
  const at::Tensor squares_cpu = reduced.to(at::kCPU).contiguous(); // one copy for all ratios
  const double* squares = squares_cpu.data_ptr<double>();
  const int64_t num_params = squares_cpu.numel() / 2;
  for (LarsItem& item : items) {
    if (!item.adapted) {
      continue;
    }
    const double param_norm = std::sqrt(squares[item.index]);
    const double update_norm = std::sqrt(squares[num_params + item.index]);
    item.trust_ratio = param_norm > 0.0 && update_norm > 0.0 ? eta * param_norm / update_norm : 1.0;
  }
}

// dp *= q; mu = momentum * mu + dp; p -= lr * mu (VISSL's mu.mul_(momentum).add_(dp) and
// p.add_(mu, alpha=-lr), the last one per group for its lr).
void apply_updates(std::vector<LarsItem>& items, double momentum) {
  std::vector<at::Tensor> scaled, mus, updates;
  std::vector<at::Scalar> ratios;
  for (LarsItem& item : items) {
    if (item.trust_ratio != 1.0) { // dp * 1 is dp: skipped
      scaled.push_back(item.update);
      ratios.emplace_back(item.trust_ratio);
    }
    mus.push_back(item.mu);
    updates.push_back(item.update);
  }
  if (!scaled.empty()) {
    at::_foreach_mul_(scaled, ratios);
  }
  at::_foreach_mul_(mus, momentum);
  at::_foreach_add_(mus, updates);
  for (size_t first = 0; first < items.size();) {
    std::vector<at::Tensor> params, group_mus;
    size_t last = first;
    for (; last < items.size() && items[last].group == items[first].group; ++last) {
      params.push_back(items[last].param);
      group_mus.push_back(items[last].mu);
    }
    at::_foreach_add_(params, group_mus, -items[first].group->lr);
    first = last;
  }
}

} // namespace

LARS::LARS(std::vector<ParamGroup> param_groups, LARSOptions options)
    : Optimizer(std::move(param_groups)), options_(std::move(options)) {
  if (!(options_.momentum >= 0.0 && options_.momentum < 1.0)) {
    throw ConfigError(fmt::format(
        "LARSOptions::momentum = {} is invalid; use a value in [0, 1) (VISSL's rule)",
        options_.momentum));
  }
  if (!(options_.eta > 0.0 && std::isfinite(options_.eta))) {
    throw ConfigError(fmt::format(
        "LARSOptions::eta = {} is invalid; use a number > 0 (VISSL's default is 0.001)",
        options_.eta));
  }
}

std::vector<std::pair<std::string, c10::IValue>> LARS::hyperparameters() const {
  return {{"momentum", options_.momentum}, {"eta", options_.eta}};
}

void LARS::step() {
  torch::NoGradGuard no_grad;
  std::vector<LarsItem> items; // grouped by group, in order (the _foreach calls rely on it)
  at::Device device = at::kCPU;
  detail::for_each_dense_grad(param_groups(), "LARS", [&](const detail::GradParam<ParamGroup>& p) {
    LarsItem item;
    item.param = p.param;
    item.grad = p.grad;
    item.mu = detail::state_like(state(p.name()), "mu", p.param);
    item.index = p.position;
    item.group = &p.group;
    item.adapted = options_.excluded_from_adaptation.count(p.name()) == 0;
    device = p.param.device();
    items.push_back(std::move(item));
  });
  const int64_t num_params = detail::num_params(param_groups());
  decay_into_updates(items);
  // Every rank reaches the reducer, with zeros where it holds nothing: it is a collective.
  const at::Tensor reduced =
      reduce_partials(norm_reducer(), local_partials(items, num_params, device), NormReduceOp::sum);
  set_trust_ratios(items, reduced, options_.eta);
  if (!items.empty()) {
    apply_updates(items, options_.momentum);
  }
}

} // namespace largo::optim
