// The mesh's "tp" dimension as one strategy that every data-parallel strategy and the
// pipeline compose with, instead of a model class per combination. A ParallelModel holds one
// always: over a "tp" of size 1 (no tensor parallelism) each operation is the identity and
// makes no collective, so a strategy calls it at its point in the order without asking
// whether tensor parallelism is on.
//
// The order it sits in (parallelize.h): the module holds this rank's slices of the split
// layers, so the "tp" operations come after the data-parallel strategy's own (FSDP's flat
// shards gathered first give the slices; ZeRO's pieces consolidated over "dp" give the
// slices' optimizer state) and before the pipeline's (each stage is made whole over its
// shards before the stages are merged over "pp"). Loading runs the same way back.
//
// Collectives (over the "tp" group, every rank of it in the same order, only with tensor
// parallelism): whole(), update_of() calls, optimizer_state(gather = true), the reducers.
// Private to the parallel layer.
#pragma once

#include "tensor_parallel_state.h"

#include <largo/parallel/data_parallel/piece_optimizer_state.h>
#include <largo/parallel/mesh/device_mesh.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace largo::parallel {

class TensorParallelDimension {
 public:
  using NamedTensors = TensorParallelState::NamedTensors;
  using Update = std::function<void(at::Tensor&)>;

  // Over `mesh`'s "tp" group, of `module`'s split layers (its parameters are this rank's
  // slices now: call it before a strategy flattens or moves them).
  TensorParallelDimension(const torch::nn::Module& module, const DeviceMesh& mesh);

  // Whether the "tp" dimension has more than one rank.
  bool enabled() const {
    return state_ != nullptr;
  }
  // The state of the split layers; only when enabled().
  const TensorParallelState& state() const {
    return *state_;
  }

  // "tensor parallel over 2 ranks (gloo), 12 sharded parameters"; empty when not enabled.
  std::string describe() const;
  // The split parameters' placements over "tp".
  void place(StatePlacements& placements) const;

  // ---- whole values <-> this rank's slices ----
  // `state` (this rank's values by name; empty on a rank that gets none, as every rank of
  // its "tp" group then does) with each slice gathered whole, on `device` for the
  // collective and back on the device it came from.
  NamedTensors whole(NamedTensors state, const at::Device& device) const;
  // Whole values replaced by this rank's slices (loading). No collective.
  std::unordered_map<std::string, at::Tensor>
  slices(std::unordered_map<std::string, at::Tensor> state) const;
  // The update of this rank's slice of parameter `name` that passes the whole value to
  // `update` (SwAV's prototypes normalised between steps): `update` itself for a parameter
  // that is not split. Collective when called, for a split one.
  Update update_of(const std::string& name, Update update) const;
  // Trained parameter name -> shape, this rank's -> the whole model's.
  std::map<std::string, std::vector<int64_t>>
  whole_shapes(std::map<std::string, std::vector<int64_t>> local) const;
  // An optimizer state over `groups` (this rank's slices, by name) with each slice's
  // per-element state gathered whole (gather; None stays None) or sliced from the whole.
  c10::IValue optimizer_state(
      const c10::IValue& state, const std::vector<optim::ParamGroup>& groups, bool gather) const;

  // ---- norms of the whole model ----
  // The completion of an optimizer's per-parameter norms (LARC's, LAMB's) over the split
  // layers' slices; empty when not enabled.
  ParameterNormCompletion parameter_norms() const;

 private:
  std::shared_ptr<const TensorParallelState> state_; // null over one "tp" rank
};

} // namespace largo::parallel
