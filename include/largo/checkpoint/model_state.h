// A module's parameters and buffers as a name → tensor dict (PyTorch's state_dict()
// naming: "trunk.0.conv.weight", "trunk.0.bn.running_mean"), and loading it back.
#pragma once

#include <largo/checkpoint/checkpoint_file.h>

#include <torch/torch.h>

namespace largo::checkpoint {

// Every parameter and buffer, detached; the tensors share storage with the module.
StateDict model_state_dict(const torch::nn::Module& module);

// Copies each entry into the module's tensor of the same name. Throws CheckpointError
// listing the missing and unexpected names and any shape or dtype mismatch, before
// anything is modified.
void load_model_state_dict(torch::nn::Module& module, const StateDict& state);

} // namespace largo::checkpoint
