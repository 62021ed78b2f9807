// What a ParallelModel whose module holds tensor-parallel shards (tensor_parallel.h) needs
// to show the unsharded model outside: full shapes, full values gathered over the
// tensor-parallel group on save and sliced on load, the optimizer state mapped the same way,
// and the gradient norm of the unsharded model. Shared by the modes that hold such a module
// (tensor parallelism over DDP replicas, and inside pipeline stages). Private to the parallel
// layer.
//
// Collectives (on the tensor-parallel group, every rank of it in the same order): unshard,
// the gathering map_optimizer_state, full_value, update_full_value, norm_reducer's reducer.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/optim/optimizer.h>
#include <largo/optim/tensor_norms.h>
#include <largo/parallel/mesh/placement.h>
#include <largo/parallel/tensor_parallel/tensor_parallel.h>

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace largo::parallel {

class TensorParallelState {
 public:
  using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

  // `module`'s shards (tensor_parallel_sharded_parameters), by name and by tensor; the
  // names are those `module` gives its parameters (a pipeline stage's: the whole model's).
  TensorParallelState(const torch::nn::Module& module, std::shared_ptr<comm::ProcessGroup> group);

  comm::ProcessGroup& group() const {
    return *group_;
  }
  size_t num_sharded() const {
    return specs_.size();
  }
  // "tensor parallel over 2 ranks (gloo), 12 sharded parameters" (and ", sequence parallel"
  // when its layers split the tokens): each mode's start-up text.
  std::string describe() const;
  // The spec of a shard of the module; null for a replicated parameter.
  const TensorParallelShardSpec* spec_of(const at::Tensor& parameter) const;
  // The shards' placements over "tp" (Shard of their split dimension), value and optimizer
  // state alike, among `placements`' parameters (a frozen shard has none).
  void place(StatePlacements& placements) const;
  // Whether the module's parameter `name` is a shard.
  bool is_shard(const std::string& name) const {
    return specs_.count(name) > 0;
  }
  // `parameter`'s shape in the unsharded model.
  std::vector<int64_t> full_shape(const at::Tensor& parameter) const;
  // Trained parameter name -> full shape, over the optimizer's groups.
  std::map<std::string, std::vector<int64_t>>
  full_shapes(const std::vector<optim::ParamGroup>& groups) const;
  // The same from this rank's shapes by name (FSDP's, whose optimizer holds pieces).
  std::map<std::string, std::vector<int64_t>>
  full_shapes(std::map<std::string, std::vector<int64_t>> local) const;

  // The shards among `state` (by name) replaced by their full values; the others as they
  // are. Collective: one all-gather per shard, in `state`'s order.
  NamedTensors unshard(NamedTensors state) const;
  // The full values among `state` replaced by this rank's slices. No collective.
  std::unordered_map<std::string, at::Tensor>
  shard(std::unordered_map<std::string, at::Tensor> state) const;

  // The full value of `module`'s parameter `name` passed to `update`, and this rank's slice
  // of the result written back (SwAV's prototypes normalised between steps). Returns false,
  // doing nothing, when `name` is not a shard. Collective when it is.
  bool update_full_value(
      torch::nn::Module& module,
      const std::string& name,
      const std::function<void(at::Tensor&)>& update) const;
  // The same for this rank's slice of the shard `name` given as `slice` (FSDP's gathered
  // value of it), which is overwritten. Collective.
  void update_full_slice(
      const std::string& name,
      at::Tensor& slice,
      const std::function<void(at::Tensor&)>& update) const;

  // The optimizer state (optim/optimizer.h's format) of the optimizer over `groups` with each
  // shard's per-element entries (shaped like the parameter: momentum, exp_avg, exp_avg_sq;
  // not AdamW's step) gathered to the full shape (gather: a collective, in the groups'
  // parameter order) or sliced from it (not gather: no collective).
  c10::IValue map_optimizer_state(
      const c10::IValue& state_dict,
      const std::vector<optim::ParamGroup>& groups,
      bool gather) const;

  // The reducer that completes the partial norm of `parameters`' gradients as the unsharded
  // model has it: the shards' partials summed (maximised for the inf norm) over the group,
  // plus the replicated ones' counted once; then `outer` (the pipeline's, over its stages)
  // when given. It recomputes the partials from `parameters` (the argument it is called with
  // is their undivided partial).
  optim::PartialNormReducer norm_reducer(
      std::vector<at::Tensor> parameters,
      double norm_type,
      optim::PartialNormReducer outer = {}) const;
  // The same for ZeRO's gradient pieces (sharded_optimizer.h), each named like the
  // parameter it is a 1-D piece of: the pieces of all of `replicas` tile this rank's
  // parameters, so both partials (the shards' and the replicated parameters') are first
  // summed over `replicas`; then the total through `outer` when given (a pipeline's).
  optim::PartialNormReducer piece_norm_reducer(
      const NamedTensors& pieces,
      double norm_type,
      std::shared_ptr<comm::ProcessGroup> replicas,
      optim::PartialNormReducer outer = {}) const;

  // The reducer of the per-parameter norms of an optimizer over `groups` (optimizer.h's
  // [2 * P] partials for its P parameters in the groups' order: LARC's trust ratios, LAMB's):
  // a shard's entries summed over the group, as its slice holds part of its parameter's
  // squared norm; a replicated parameter's kept, as every rank holds all of it. The groups
  // are told apart by their names: ZeRO's base optimizer steps pieces named like their
  // parameters. Collective when called.
  optim::PartialNormReducer
  parameter_norm_reducer(const std::vector<optim::ParamGroup>& groups) const;

 private:
  // The gradient norm of `shards` and `replicated` completed as norm_reducer() says, with
  // both partials first through `inner` (ZeRO's replicas) and the total through `outer`.
  optim::PartialNormReducer split_norm_reducer(
      std::vector<at::Tensor> shards,
      std::vector<at::Tensor> replicated,
      double norm_type,
      std::shared_ptr<comm::ProcessGroup> inner,
      optim::PartialNormReducer outer) const;

  std::shared_ptr<comm::ProcessGroup> group_;
  std::map<std::string, TensorParallelShardSpec> specs_; // by module parameter name
  std::unordered_map<const c10::TensorImpl*, TensorParallelShardSpec> spec_by_tensor_;
  bool splits_sequence_ = false; // some layer holds only its rank's tokens
};

} // namespace largo::parallel
