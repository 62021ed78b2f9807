#include <largo/optim/larc.h>

#include "multi_tensor_cpu.h"
#include "param_loop.h"

#include <largo/core/error.h>

#include <ATen/core/Dict.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace largo::optim {
namespace {

// What LARC does to one gradient: g = (g + weight_decay * p) * scale.
struct Adaptation {
  at::Tensor param, grad;
  double weight_decay = 0.0;
  double scale = 1.0;
};

// Apex's two statements, each rounded: g += wd * p; g *= adaptive_lr.
template <typename scalar_t>
void adapt_loop(
    const scalar_t* __restrict__ p,
    scalar_t* __restrict__ g,
    int64_t n,
    scalar_t weight_decay,
    scalar_t scale) {
  for (int64_t i = 0; i < n; ++i) {
    const scalar_t decayed = g[i] + weight_decay * p[i];
    g[i] = decayed * scale;
  }
}

template <typename scalar_t>
void adapt_kernel(const Adaptation& a, int64_t begin, int64_t end) {
  adapt_loop<scalar_t>(
      a.param.data_ptr<scalar_t>() + begin, a.grad.data_ptr<scalar_t>() + begin, end - begin,
      static_cast<scalar_t>(a.weight_decay), static_cast<scalar_t>(a.scale));
}

// Restores the groups' weight decay when the inner step returns or throws.
class WeightDecayRestorer {
 public:
  explicit WeightDecayRestorer(std::vector<ParamGroup>& groups) : groups_(groups) {
    for (ParamGroup& group : groups_) {
      saved_.push_back(group.weight_decay);
      group.weight_decay = 0.0;
    }
  }
  ~WeightDecayRestorer() {
    for (size_t g = 0; g < groups_.size(); ++g) {
      groups_[g].weight_decay = saved_[g];
    }
  }
  WeightDecayRestorer(const WeightDecayRestorer&) = delete;
  WeightDecayRestorer& operator=(const WeightDecayRestorer&) = delete;

 private:
  std::vector<ParamGroup>& groups_;
  std::vector<double> saved_;
};

} // namespace

LARC::LARC(std::unique_ptr<Optimizer> inner, LARCOptions options)
    : Optimizer({}), inner_(std::move(inner)), options_(std::move(options)) {
  if (!inner_) {
    throw Error("LARC needs an optimizer to wrap, got a null pointer");
  }
  if (!(options_.trust_coefficient > 0.0)) {
    throw ConfigError(fmt::format(
        "LARCOptions::trust_coefficient = {} is invalid; use a value > 0 (VISSL's "
        "default is 0.001)",
        options_.trust_coefficient));
  }
  if (!(options_.eps >= 0.0)) {
    throw ConfigError(
        fmt::format("LARCOptions::eps = {} is invalid; use a value >= 0", options_.eps));
  }
}

void LARC::set_norm_reducer(PartialNormReducer reducer) {
  inner_->set_norm_reducer(reducer);
  Optimizer::set_norm_reducer(std::move(reducer));
}

void LARC::step() {
  torch::NoGradGuard no_grad;
  std::vector<ParamGroup>& groups = param_groups();

  // Partial squared norms of every parameter and gradient, as one [2 * P] tensor.
  std::vector<at::Tensor> params, grads;
  std::vector<int64_t> positions; // of each parameter with a gradient among all P
  std::vector<const ParamGroup*> group_of;
  std::vector<const std::string*> name_of;
  detail::for_each_dense_grad(groups, "LARC", [&](const detail::GradParam<ParamGroup>& p) {
    params.push_back(p.param);
    grads.push_back(p.grad);
    positions.push_back(p.position);
    group_of.push_back(&p.group);
    name_of.push_back(&p.name());
  });
  const int64_t num_params = detail::num_params(groups);
  if (params.empty()) {
    // Nothing to adapt here, but a sharded run's reducer is a collective every rank joins.
    reduce_partials(norm_reducer(), at::zeros({2 * num_params}, at::kDouble), NormReduceOp::sum);
  } else {
    std::vector<at::Tensor> all = params;
    all.insert(all.end(), grads.begin(), grads.end());
    const at::Tensor local = squared_norms(all); // [p..., g...] of the parameters with grads
    const auto n = static_cast<int64_t>(params.size());
    at::Tensor index = at::tensor(positions, at::kLong);
    index = at::cat({index, index + num_params}).to(local.device());
    const at::Tensor partials =
        at::zeros({2 * num_params}, local.options()).index_copy_(0, index, local);
    // One device-to-host copy per step for all decisions.
    const at::Tensor reduced =
        reduce_partials(norm_reducer(), partials, NormReduceOp::sum).to(at::kCPU).contiguous();
    const double* squares = reduced.data_ptr<double>();

    std::vector<Adaptation> fused, others;
    for (int64_t k = 0; k < n; ++k) {
      const ParamGroup& group = *group_of[static_cast<size_t>(k)];
      const double weight_decay = group.weight_decay;
      Adaptation a{params[static_cast<size_t>(k)], grads[static_cast<size_t>(k)], 0.0, 1.0};
      if (options_.excluded_from_adaptation.count(*name_of[static_cast<size_t>(k)]) != 0) {
        a.weight_decay = weight_decay;
      } else {
        const double param_norm = std::sqrt(squares[positions[static_cast<size_t>(k)]]);
        const double grad_norm = std::sqrt(squares[num_params + positions[static_cast<size_t>(k)]]);
        if (param_norm != 0.0 && grad_norm != 0.0) {
          double adaptive_lr = options_.trust_coefficient * param_norm /
              (grad_norm + param_norm * weight_decay + options_.eps);
          if (options_.clip) {
            // lr * adaptive_lr = min(adaptive lr, lr); lr = 0 gives inf, hence 1.
            adaptive_lr = std::min(adaptive_lr / group.lr, 1.0);
          }
          a.weight_decay = weight_decay;
          a.scale = adaptive_lr;
        }
      }
      if (a.weight_decay == 0.0 && a.scale == 1.0) {
        continue; // nothing to do
      }
      const bool can_fuse = options_.fused && detail::can_use_cpu_kernels({&a.param, &a.grad});
      (can_fuse ? fused : others).push_back(std::move(a));
    }

    std::vector<int64_t> numels;
    for (const Adaptation& a : fused) {
      numels.push_back(a.param.numel());
    }
    detail::for_each_chunk(detail::make_chunks(numels), [&](int64_t, const detail::Chunk& chunk) {
      const Adaptation& a = fused[static_cast<size_t>(chunk.tensor)];
      AT_DISPATCH_FLOATING_TYPES(a.grad.scalar_type(), "larc_adapt", [&] {
        adapt_kernel<scalar_t>(a, chunk.begin, chunk.end);
      });
    });
    if (!others.empty()) {
      std::vector<at::Tensor> decayed_params, decayed_grads, scaled_grads;
      std::vector<at::Scalar> weight_decays, scales;
      for (const Adaptation& a : others) {
        if (a.weight_decay != 0.0) {
          decayed_params.push_back(a.param);
          decayed_grads.push_back(a.grad);
          weight_decays.emplace_back(a.weight_decay);
        }
        if (a.scale != 1.0) {
          scaled_grads.push_back(a.grad);
          scales.emplace_back(a.scale);
        }
      }
      if (!decayed_grads.empty()) {
        at::_foreach_add_(decayed_grads, at::_foreach_mul(decayed_params, weight_decays));
      }
      if (!scaled_grads.empty()) {
        at::_foreach_mul_(scaled_grads, scales);
      }
    }
  }

  WeightDecayRestorer restorer(groups);
  inner_->step();
}

c10::IValue LARC::state_dict() const {
  c10::IValue root = inner_->state_dict();
  c10::impl::GenericDict larc(c10::StringType::get(), c10::AnyType::get());
  larc.insert("trust_coefficient", options_.trust_coefficient);
  larc.insert("clip", options_.clip);
  larc.insert("eps", options_.eps);
  root.toGenericDict().insert("larc", larc);
  return root;
}

void LARC::load_state_dict(const c10::IValue& state_dict) {
  inner_->load_state_dict(state_dict);
  const auto root = state_dict.toGenericDict(); // the inner load checked it is a dict
  auto it = root.find(c10::IValue("larc"));
  if (it == root.end() || !it->value().isGenericDict()) {
    spdlog::info("optimizer checkpoint has no LARC settings (written without LARC); LARC starts "
                 "now with trust_coefficient {}, clip {}, eps {}",
                 options_.trust_coefficient, options_.clip, options_.eps);
    return;
  }
  const auto saved = it->value().toGenericDict();
  auto describe = [](const c10::IValue& value) -> std::string {
    if (value.isBool()) {
      return value.toBool() ? "true" : "false";
    }
    return value.isDouble() ? fmt::format("{}", value.toDouble()) : value.tagKind();
  };
  auto warn_if_different = [&](const char* key, const c10::IValue& current) {
    auto entry = saved.find(c10::IValue(key));
    if (entry == saved.end() || describe(entry->value()) == describe(current)) {
      return;
    }
    spdlog::warn(
        "optimizer checkpoint was written with LARC {} = {} but this run uses {}; keeping {}",
        key, describe(entry->value()), describe(current), describe(current));
  };
  warn_if_different("trust_coefficient", options_.trust_coefficient);
  warn_if_different("clip", options_.clip);
  warn_if_different("eps", options_.eps);
}

} // namespace largo::optim
