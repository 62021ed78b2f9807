#include <largo/optim/optimizer_factory.h>

#include <largo/core/error.h>

#include <fmt/format.h>

namespace largo::optim {

std::unique_ptr<Optimizer>
make_optimizer(std::vector<ParamGroup> param_groups, const OptimizerSpec& spec) {
  std::unique_ptr<Optimizer> optimizer;
  if (spec.name == "sgd") {
    optimizer = std::make_unique<SGD>(std::move(param_groups), spec.sgd);
  } else if (spec.name == "adamw") {
    optimizer = std::make_unique<AdamW>(std::move(param_groups), spec.adamw);
  } else if (spec.name == "lamb") {
    optimizer = std::make_unique<LAMB>(std::move(param_groups), spec.lamb);
  } else if (spec.name == "lars") {
    optimizer = std::make_unique<LARS>(std::move(param_groups), spec.lars);
  } else {
    throw ConfigError(fmt::format(
        "OptimizerSpec::name = {} is not an optimizer Largo has; use sgd, adamw, lamb or lars",
        spec.name));
  }
  if (spec.use_larc) {
    optimizer = std::make_unique<LARC>(std::move(optimizer), spec.larc);
  }
  return optimizer;
}

namespace {

std::string describe_base(const OptimizerSpec& spec) {
  if (spec.name == "sgd") {
    return fmt::format(
        "SGD (momentum {}, dampening {}, nesterov {})",
        spec.sgd.momentum,
        spec.sgd.dampening,
        spec.sgd.nesterov);
  }
  if (spec.name == "adamw") {
    const AdamWOptions& o = spec.adamw;
    return fmt::format(
        "AdamW (betas {}/{}, eps {}, amsgrad {})", o.betas[0], o.betas[1], o.eps, o.amsgrad);
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

} // namespace largo::optim
