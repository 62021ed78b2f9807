// A module's parameters and buffers as a name → tensor dict (PyTorch's state_dict()
// naming: "trunk.0.conv.weight", "trunk.0.bn.running_mean"), and loading it back.
#pragma once

#include <largo/checkpoint/checkpoint_file.h>

#include <torch/torch.h>

namespace largo::checkpoint {

// Every parameter and buffer, detached; the tensors share storage with the module.
StateDict model_state_dict(const torch::nn::Module& module);

// Throws CheckpointError listing the names `state` lacks or has in excess of the module's
// parameters and buffers, and any shape or dtype mismatch. Reads only the tensors' metadata
// (so it also checks a module whose parameters are sharded,
// parallel/data_parallel/fully_sharded_data_parallel.h). exact_floating_dtypes false: a floating-point entry may
// have another floating-point dtype than the module's tensor (FSDP's compute copies: the module's
// parameters are bfloat16 views, the checkpoint holds the float32 masters, cast when they are
// loaded). `source` (the checkpoint's path) starts the message when given. `whole_shapes`: the
// whole model's shape of the tensors of which the module holds a part (tensor parallelism's
// shards); the others are checked against the module's own shape.
void check_model_state_dict(
    const torch::nn::Module& module,
    const StateDict& state,
    bool exact_floating_dtypes = true,
    const std::string& source = "",
    const std::map<std::string, std::vector<int64_t>>& whole_shapes = {});

// Copies each entry into the module's tensor of the same name, after check_model_state_dict
// (so nothing is modified when it throws).
void load_model_state_dict(torch::nn::Module& module, const StateDict& state,
                           const std::string& source = "");

} // namespace largo::checkpoint
