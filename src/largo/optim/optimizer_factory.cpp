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
  } else {
    throw ConfigError(fmt::format(
        "OPTIMIZER.name = {} is not an optimizer Largo has; use sgd, adamw or lamb", spec.name));
  }
  if (spec.use_larc) {
    optimizer = std::make_unique<LARC>(std::move(optimizer), spec.larc);
  }
  return optimizer;
}

} // namespace largo::optim
