#include <largo/optim/adamw.h>

#include "adam_update.h"

namespace largo::optim {

AdamW::AdamW(std::vector<ParamGroup> param_groups, AdamWOptions options)
    : Optimizer(std::move(param_groups)), options_(options) {
  check_adam_moments(options_.betas, options_.eps, "AdamWOptions");
}

std::vector<std::pair<std::string, c10::IValue>> AdamW::hyperparameters() const {
  return detail::adam_hyperparameters(options_);
}

void AdamW::step() {
  detail::adam_step(*this, options_, detail::AdamWeightDecay::kDecoupled, "AdamW");
}

} // namespace largo::optim
