// Which submodules of a model FSDP shards as units of their own and activation checkpointing
// recomputes (torchtitan's per-block wrapping, FSDP's auto_wrap_policy, FairScale's
// size-based policy), over any module tree.
//
// libtorch has no forward hooks, so a submodule's forward can only be intercepted where a
// container calls it: Largo wraps elements of `torch::nn::Sequential` containers, anywhere in
// the tree (a model whose blocks sit in a Sequential, as Largo's zoo and most libtorch models
// do). Only the Sequential's forward path changes (sequential_interception.h); the modules
// stay registered where they were, so parameter names and state dicts are unchanged.
//
//   WrapPolicy::elements_of("trunk")                 every element of the Sequential "trunk"
//   WrapPolicy::of_type<BlockImpl>()                  every Sequential element of that type
//   WrapPolicy::min_trainable_parameters(1 << 20)     elements with >= 2^20 trainable elements
//   WrapPolicy::elements_of("trunk") && WrapPolicy::min_trainable_parameters(n)
//
// A matched element is not searched further (units do not nest). No collectives.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace largo::parallel {

// One element of a Sequential that a policy selected.
struct WrapTarget {
  std::string name;                       // its name in the model, e.g. "trunk.3"
  std::shared_ptr<torch::nn::Module> module;
  torch::nn::Sequential container;        // the Sequential it is an element of
  size_t index = 0;                       // its position there
  int64_t trainable_numel = 0;            // trainable parameter elements inside it
};

class WrapPolicy {
 public:
  // name: the element's name in the model ("trunk.3"); module: the element.
  using Predicate =
      std::function<bool(const std::string& name, const torch::nn::Module& module,
                         int64_t trainable_numel)>;

  // Matches nothing: no units besides the root, nothing checkpointed.
  WrapPolicy() = default;
  explicit WrapPolicy(Predicate predicate, std::string description);

  // Every element of the Sequential registered under `container_name` ("trunk", "0.layers").
  static WrapPolicy elements_of(const std::string& container_name);
  // Every Sequential element with at least `min_numel` trainable parameter elements (>= 1:
  // elements without trainable parameters are never units). FairScale's size-based policy,
  // VISSL's AUTO_WRAP_THRESHOLD.
  static WrapPolicy min_trainable_parameters(int64_t min_numel);
  // Every Sequential element whose module is a `ModuleImpl` (e.g. a residual block type).
  template <typename ModuleImpl>
  static WrapPolicy of_type(std::string type_name = "the given type") {
    return WrapPolicy(
        [](const std::string&, const torch::nn::Module& module, int64_t) {
          return dynamic_cast<const ModuleImpl*>(&module) != nullptr;
        },
        "modules of " + std::move(type_name));
  }

  // Both policies must match.
  friend WrapPolicy operator&&(const WrapPolicy& a, const WrapPolicy& b);

  bool matches(const std::string& name, const torch::nn::Module& module,
               int64_t trainable_numel) const;
  bool empty() const {
    return !predicate_;
  }
  // "elements of trunk with >= 0 trainable parameters", for logs.
  const std::string& describe() const {
    return description_;
  }

 private:
  Predicate predicate_;
  std::string description_ = "nothing";
};

// The Sequential elements of `root` that `policy` matches, in pre-order (for Sequential-built
// models: the order their forwards run in). Elements inside a matched one are not searched.
std::vector<WrapTarget> find_wrap_targets(const std::shared_ptr<torch::nn::Module>& root,
                                          const WrapPolicy& policy);

// Trainable (requires_grad) parameter elements of `module` and its submodules.
int64_t trainable_numel(const torch::nn::Module& module);

} // namespace largo::parallel
