// The optimizer base class: parameter groups, per-parameter state keyed by parameter
// name, zero_grad, and a state_dict that PyTorch's torch.load can read.
//
// Concrete optimizers (SGD, AdamW, LAMB, LARS) implement step() and describe their
// hyperparameters; the base owns the groups, the state and its (de)serialization, so every
// optimizer saves and resumes the same way. A wrapper (LARC; later a sharded optimizer)
// constructs the base with no groups and overrides the virtual accessors below to forward
// them to the optimizer it wraps, so callers see one optimizer either way.
//
// state_dict() layout (a plain dict, written with torch::pickle_save):
//   {"state":        {param_name: {"momentum_buffer": Tensor, ...}, ...},
//    "param_groups": [{"name": str, "lr": float, "weight_decay": float,
//                      <optimizer hyperparameters>..., "params": [param_name, ...]}, ...],
//    "type":         "sgd" | "adamw" | ...}
// Parameters are named (e.g. "trunk.0.conv.weight") rather than numbered as in PyTorch,
// so a checkpoint says which parameter each state belongs to and a mismatch can be named.
#pragma once

#include <largo/optim/tensor_norms.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace largo::optim {

// Parameters that share a learning rate and weight decay ("trunk", "trunk_no_wd", "head").
struct ParamGroup {
  std::vector<at::Tensor> params;
  // One name per parameter, unique across all groups of an optimizer: the key of the
  // parameter's state in state_dict(). Left empty, names "<group>.<index>" are made up.
  std::vector<std::string> names;
  double lr = 0.1;
  double weight_decay = 0.0;
  std::string name;
  // When defined: `lr` as a 0-d float32 tensor on the parameters' CUDA device, which SGD's
  // fused CUDA kernel reads instead of `lr`, so that a CUDA graph's replays step with the
  // value the host put there (train/cuda_graph_step.h keeps it equal to `lr`). SGD throws
  // TrainingError for a parameter of such a group that its fused CUDA kernel cannot take; the
  // other optimizers do not read it (CudaGraphStep refuses them).
  at::Tensor lr_on_device;
};

// The state of one parameter, e.g. {"momentum_buffer": Tensor} or
// {"step": Tensor, "exp_avg": Tensor, "exp_avg_sq": Tensor}.
using ParamState = std::map<std::string, at::Tensor>;

class Optimizer {
 public:
  // Throws ConfigError for a negative lr or weight_decay, a group whose names do not match
  // its params, duplicate parameter names or undefined tensors.
  explicit Optimizer(std::vector<ParamGroup> param_groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient; parameters without one are skipped
  // (their state is untouched), as in PyTorch.
  virtual void step() = 0;

  // The name stored under "type" in state_dict(), e.g. "sgd".
  virtual std::string type() const = 0;

  // set_to_none frees the gradients (PyTorch's default since 2.0); otherwise zeroes them.
  virtual void zero_grad(bool set_to_none = true);

  virtual std::vector<ParamGroup>& param_groups() {
    return param_groups_;
  }
  virtual const std::vector<ParamGroup>& param_groups() const {
    return param_groups_;
  }

  // Sets the learning rate of every group (the schedule calls this each update).
  void set_lr(double lr);

  // The state of a parameter by name; empty until its first step.
  virtual const ParamState* find_state(const std::string& param_name) const;
  virtual ParamState& state(const std::string& param_name) {
    return state_[param_name];
  }

  // Bytes held by the optimizer state (for memory accounting and the estimator).
  virtual int64_t state_bytes() const;

  // Installs the hook that completes per-parameter partial norms across ranks (see
  // tensor_norms.h); a sharded wrapper calls it on the optimizer it builds over its shard.
  // Optimizers with per-parameter norms (LAMB, LARC, LARS) pass one tensor through it per
  // step: [2 * P] float64 for the P parameters of all groups in order, the first P entries
  // the squared norms of the parameters, the last P those of the gradients (LARC) or of the
  // updates (LAMB, LARS); a parameter without a gradient contributes zeros. Others ignore it.
  virtual void set_norm_reducer(PartialNormReducer reducer) {
    norm_reducer_ = std::move(reducer);
  }

  virtual c10::IValue state_dict() const;

  // Restores state_dict() output bit-exactly (tensors are copied, step counters kept) and
  // the groups' lr and weight_decay. Throws CheckpointError, before changing anything, when
  // the type, the groups, the parameter names or a state tensor's shape do not match.
  virtual void load_state_dict(const c10::IValue& state_dict);

 protected:
  // Optimizer-wide hyperparameters, written into every group of state_dict() as PyTorch
  // does (e.g. {"momentum", 0.9}); on load, a different saved value is reported as a warning
  // and the configured value is kept (the config is the source of truth on resume).
  virtual std::vector<std::pair<std::string, c10::IValue>> hyperparameters() const {
    return {};
  }

  // True for state entries that are scalars (e.g. AdamW's "step") rather than tensors
  // shaped like their parameter; load_state_dict checks the shape of the others.
  virtual bool is_scalar_state(const std::string& key) const {
    return key == "step";
  }

  const PartialNormReducer& norm_reducer() const {
    return norm_reducer_;
  }

 private:
  std::vector<ParamGroup> param_groups_;
  std::unordered_map<std::string, ParamState> state_;
  PartialNormReducer norm_reducer_;
};

// The Adam family's moment settings (AdamW, LAMB): throws ConfigError naming
// `options_name`::betas or ::eps ("AdamWOptions::eps") for a beta outside [0, 1) or eps < 0
// (NaN included).
void check_adam_moments(
    const std::array<double, 2>& betas, double eps, const std::string& options_name);

} // namespace largo::optim
