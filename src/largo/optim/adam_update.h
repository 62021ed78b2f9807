// The update Adam and AdamW share (private to the optim layer): they differ only in where
// the weight decay enters (adam.h, adamw.h), so one implementation of the moments, the bias
// corrections and the two update paths serves both.
#pragma once

#include <largo/optim/adam.h>

#include <string>
#include <utility>
#include <vector>

namespace largo::optim::detail {

enum class AdamWeightDecay {
  kL2,        // g += weight_decay * p before the moments (torch.optim.Adam)
  kDecoupled, // p *= 1 - lr * weight_decay before the update (torch.optim.AdamW)
};

// One step of every parameter of `optimizer` that has a gradient. `name` ("Adam", "AdamW")
// is the optimizer named in errors.
void adam_step(
    Optimizer& optimizer, const AdamOptions& options, AdamWeightDecay decay, const char* name);

// betas, eps and amsgrad, under torch.optim.Adam's names.
std::vector<std::pair<std::string, c10::IValue>> adam_hyperparameters(const AdamOptions& options);

} // namespace largo::optim::detail
