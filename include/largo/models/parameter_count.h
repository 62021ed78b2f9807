// Counting a model's parameters (for logs, the memory estimator and tests).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>

namespace largo::models {

// Number of scalar values in all parameters of `module` and its submodules, each
// parameter counted once even when modules share it. Buffers (BN running stats) are not
// parameters and are not counted.
int64_t count_parameters(const torch::nn::Module& module);

} // namespace largo::models
