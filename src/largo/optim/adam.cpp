#include <largo/optim/adam.h>

#include "adam_update.h"

namespace largo::optim {

Adam::Adam(std::vector<ParamGroup> param_groups, AdamOptions options)
    : Optimizer(std::move(param_groups)), options_(options) {
  check_adam_moments(options_.betas, options_.eps, "AdamOptions");
}

std::vector<std::pair<std::string, c10::IValue>> Adam::hyperparameters() const {
  return detail::adam_hyperparameters(options_);
}

void Adam::step() {
  detail::adam_step(*this, options_, detail::AdamWeightDecay::kL2, "Adam");
}

} // namespace largo::optim
