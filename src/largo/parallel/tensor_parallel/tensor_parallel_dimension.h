// The mesh's "tp" dimension as one strategy that every data-parallel strategy and the
// pipeline compose with, instead of a model class per combination. A ParallelModel holds one
// always: over a "tp" of size 1 (no tensor parallelism) each operation is the identity and
// makes no collective, so a strategy calls it at its point in the order without asking
// whether tensor parallelism is on.
//
// Its placement is Shard(dim) over "tp" (the module holds this rank's slices of the split
// layers), so the whole-state operation (../mesh/state_dimension.h) calls it after the
// data-parallel strategy has undone its flat pieces (FSDP's shards gathered give the slices;
// ZeRO's pieces consolidated over "dp" give the slices' optimizer state) and before the
// pipeline's stages are merged over "pp". Loading runs the same way back.
//
// Collectives (over the "tp" group, every rank of it in the same order, only with tensor
// parallelism): whole_values(), update_of() calls, whole_optimizer_state(), the reducers.
// Private to the parallel layer.
#pragma once

#include "../mesh/state_dimension.h"
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

class TensorParallelDimension : public StateDimension {
 public:
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

  // ---- whole values <-> this rank's slices (state_dimension.h) ----
  // Every slice of `part` gathered whole, on every rank of the "tp" group (`root` and
  // `elsewhere` do not apply): on the module's device for the collective, and back on the
  // device each came from.
  NamedTensors whole_values(NamedTensors part, int root, Elsewhere elsewhere) const override;
  // Whole values replaced by this rank's slices (loading).
  Values part_of_values(Values whole) const override;
  // Passes the whole value to `update` (SwAV's prototypes normalised between steps):
  // `update` itself for a parameter that is not split.
  Update update_of(const std::string& name, Update update) const override;
  // Each slice's per-element state (momentum, exp_avg, exp_avg_sq) gathered whole, or cut
  // from the whole.
  c10::IValue whole_optimizer_state(
      const c10::IValue& part, const std::vector<optim::ParamGroup>& groups) const override;
  c10::IValue part_of_optimizer_state(
      const c10::IValue& whole, const std::vector<optim::ParamGroup>& groups) const override;
  // Trained parameter name -> shape, this rank's -> the whole model's.
  std::map<std::string, std::vector<int64_t>>
  whole_shapes(std::map<std::string, std::vector<int64_t>> local) const;

  // ---- norms of the whole model ----
  // The completion of an optimizer's per-parameter norms (LARC's, LAMB's) over the split
  // layers' slices; empty when not enabled.
  ParameterNormCompletion parameter_norms() const;

 private:
  std::shared_ptr<const TensorParallelState> state_; // null over one "tp" rank
  at::Device device_;                                // the module's: where gathers run
};

} // namespace largo::parallel
