// Where a module lives: the device of its first parameter. No collectives.
#pragma once

#include <torch/nn/module.h>

namespace largo::models {

// The device of `module`'s first parameter; the CPU for a module without parameters.
inline torch::Device module_device(const torch::nn::Module& module) {
  const auto parameters = module.parameters();
  return parameters.empty() ? torch::Device(torch::kCPU) : parameters.front().device();
}

} // namespace largo::models
