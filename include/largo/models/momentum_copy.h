// What MoCo's momentum encoder and DINO's teacher share: a second model of the trained one's
// architecture that is no child module (the optimizer, data parallelism and the model's state
// dict never see it), kept in the loss's checkpoint state instead. The copy is always whole:
// where data parallelism shards the trained model's own tensors (FSDP), the copy is built and
// updated from the whole values the caller gathers (ParallelModel::full_parameters()).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace largo::models {

// A whole model's parameter values by name (ParallelModel::full_parameters()).
using WholeParameters = std::vector<std::pair<std::string, at::Tensor>>;

// The values `copy`'s parameters are built or updated from, in the copy's parameter order:
// `whole`'s by name when given, else `model`'s own parameters (the tensors themselves, no
// copy). Throws largo::Error naming `what` for a name `whole` lacks, or, without `whole`, for a
// parameter of `model` with no memory behind it (FSDP's between its unit's uses: pass the
// gathered whole values instead).
std::vector<at::Tensor> momentum_copy_sources(
    const torch::nn::Module& model,
    const torch::nn::Module& copy,
    const WholeParameters* whole,
    const std::string& what);

// Throws ConfigError(`mismatch`) unless `copy` has `model`'s parameter names and shapes; then
// turns the copy's gradients off (it is updated from the model, never trained).
void freeze_as_copy_of(
    const torch::nn::Module& model, torch::nn::Module& copy, const std::string& mismatch);

// "<prefix><name>" for each of the copy's parameters and buffers, copied to the CPU.
std::map<std::string, at::Tensor>
momentum_copy_state_dict(const torch::nn::Module& copy, const std::string& prefix);

// Loads what momentum_copy_state_dict saved into the copy's tensors. Throws CheckpointError
// naming `what` and the entry for a missing entry or one of another shape.
void load_momentum_copy_state_dict(
    torch::nn::Module& copy,
    const std::map<std::string, at::Tensor>& state,
    const std::string& prefix,
    const std::string& what);

// The one-element int64 counter `name` of `state` (the copy's "built" flag, its forwards), with
// the same errors.
int64_t load_momentum_copy_counter(
    const std::map<std::string, at::Tensor>& state,
    const std::string& name,
    const std::string& what);

} // namespace largo::models
