#include <largo/optim/optimizer_factory.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::optim {
namespace {

ConfigError unknown_optimizer(const std::string& name) {
  return ConfigError(fmt::format(
      "OptimizerSpec::name = {} is not an optimizer Largo has; use one of: {}",
      name,
      fmt::join(optimizer_names(), ", ")));
}

} // namespace

const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names{"sgd", "adam", "adamw", "rmsprop", "lamb", "lars"};
  return names;
}

std::unique_ptr<Optimizer>
make_optimizer(std::vector<ParamGroup> param_groups, const OptimizerSpec& spec) {
  std::unique_ptr<Optimizer> optimizer;
  if (spec.name == "sgd") {
    optimizer = std::make_unique<SGD>(std::move(param_groups), spec.sgd);
  } else if (spec.name == "adam") {
    optimizer = std::make_unique<Adam>(std::move(param_groups), spec.adam);
  } else if (spec.name == "adamw") {
    optimizer = std::make_unique<AdamW>(std::move(param_groups), spec.adamw);
  } else if (spec.name == "rmsprop") {
    optimizer = std::make_unique<RMSprop>(std::move(param_groups), spec.rmsprop);
  } else if (spec.name == "lamb") {
    optimizer = std::make_unique<LAMB>(std::move(param_groups), spec.lamb);
  } else if (spec.name == "lars") {
    optimizer = std::make_unique<LARS>(std::move(param_groups), spec.lars);
  } else {
    throw unknown_optimizer(spec.name);
  }
  if (spec.use_larc) {
    optimizer = std::make_unique<LARC>(std::move(optimizer), spec.larc);
  }
  return optimizer;
}

namespace {

std::string describe_adam(const char* name, const AdamOptions& o) {
  return fmt::format(
      "{} (betas {}/{}, eps {}, amsgrad {})", name, o.betas[0], o.betas[1], o.eps, o.amsgrad);
}

std::string describe_base(const OptimizerSpec& spec) {
  if (spec.name == "sgd") {
    return fmt::format(
        "SGD (momentum {}, dampening {}, nesterov {})",
        spec.sgd.momentum,
        spec.sgd.dampening,
        spec.sgd.nesterov);
  }
  if (spec.name == "adam") {
    return describe_adam("Adam", spec.adam);
  }
  if (spec.name == "adamw") {
    return describe_adam("AdamW", spec.adamw);
  }
  if (spec.name == "rmsprop") {
    const RMSpropOptions& o = spec.rmsprop;
    return fmt::format(
        "RMSprop (alpha {}, eps {}, momentum {}, centered {})",
        o.alpha,
        o.eps,
        o.momentum,
        o.centered);
  }
  if (spec.name == "lamb") {
    const LAMBOptions& o = spec.lamb;
    return fmt::format("LAMB (betas {}/{}, eps {})", o.betas[0], o.betas[1], o.eps);
  }
  if (spec.name == "lars") {
    const LARSOptions& o = spec.lars;
    return fmt::format(
        "LARS (momentum {}, eta {}, {} parameters not adapted)",
        o.momentum,
        o.eta,
        o.excluded_from_adaptation.size());
  }
  return spec.name;
}

} // namespace

std::string describe(const OptimizerSpec& spec) {
  if (!spec.use_larc) {
    return describe_base(spec) + "; LARC off";
  }
  const LARCOptions& larc = spec.larc;
  return fmt::format(
      "{}; LARC on (trust_coefficient {}, clip {}, eps {}, {} parameters not adapted)",
      describe_base(spec),
      larc.trust_coefficient,
      larc.clip,
      larc.eps,
      larc.excluded_from_adaptation.size());
}

OptimizerStateLayout state_layout(const OptimizerSpec& spec) {
  if (spec.name == "sgd") {
    return {spec.sgd.momentum != 0.0 ? 1 : 0, false}; // momentum_buffer
  }
  if (spec.name == "adam" || spec.name == "adamw") { // exp_avg, exp_avg_sq (, max_exp_avg_sq)
    const bool amsgrad = spec.name == "adam" ? spec.adam.amsgrad : spec.adamw.amsgrad;
    return {amsgrad ? 3 : 2, true};
  }
  if (spec.name == "rmsprop") { // square_avg (, momentum_buffer) (, grad_avg)
    const RMSpropOptions& o = spec.rmsprop;
    return {1 + (o.momentum > 0.0 ? 1 : 0) + (o.centered ? 1 : 0), true};
  }
  if (spec.name == "lamb") {
    return {2, true}; // exp_avg, exp_avg_sq
  }
  if (spec.name == "lars") {
    return {1, false}; // mu, at any momentum (VISSL's LARS keeps it even at momentum 0)
  }
  throw unknown_optimizer(spec.name);
}

} // namespace largo::optim
