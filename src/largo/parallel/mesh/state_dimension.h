// One mesh dimension's strategy as the whole-state operation sees it (ParallelModel's
// model_state_dict, full_parameters, optimizer_state_dict, their loads and
// update_full_parameter): how it makes this rank's state whole along its dimension, and cuts a
// whole state back to this rank's part.
//
// The operation itself is written once (parallel_model.cpp) and reads the placements
// (placement.h) to know which dimensions to undo, and in which order: a flat piece (FlatShard)
// is a piece of a slice (Shard), and a slice is of a parameter one pipeline stage holds
// (OwnedBy), so a whole is made in that order and cut in the reverse. Flat pieces are undone
// by the data-parallel strategy that holds them, whose layout is its own (ParallelModel's
// held_* calls); the dimensions that state Shard ("tp") or OwnedBy ("pp") implement this.
// A dimension along which every parameter is replicated is never asked.
// Private to the parallel layer.
#pragma once

#include <largo/optim/optimizer.h>

#include <ATen/core/ivalue.h>

#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace largo::parallel {

class StateDimension {
 public:
  using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
  using Values = std::unordered_map<std::string, at::Tensor>;
  using Update = std::function<void(at::Tensor&)>;
  // What a rank gets when the whole is made on one rank of the dimension only.
  enum class Elsewhere {
    kNothing, // an empty list (a checkpoint's state, written by that rank)
    kOwnPart, // its own part as it came in (the parameters a caller reads on every rank)
  };

  virtual ~StateDimension() = default;

  // `part` (this rank's values by name, in the module's order) whole along the dimension: on
  // every rank, or on its rank `root` only (which a dimension may insist on). Collective over
  // the dimension's group.
  virtual NamedTensors whole_values(NamedTensors part, int root, Elsewhere elsewhere) const = 0;
  // This rank's part of whole values (by name). No collective.
  virtual Values part_of_values(Values whole) const = 0;
  // The update of this rank's part of parameter `name` that applies `update` to its whole
  // value. Collective when called, where the dimension splits the parameter.
  virtual Update update_of(const std::string& name, Update update) const = 0;
  // An optimizer state (optim/optimizer.h's format) over `groups`, this rank's parameters by
  // name, made whole along the dimension (None on a rank that gets none; None stays None).
  // Collective over the dimension's group.
  virtual c10::IValue whole_optimizer_state(
      const c10::IValue& part, const std::vector<optim::ParamGroup>& groups) const = 0;
  // This rank's part of a whole optimizer state, for `groups`. No collective.
  virtual c10::IValue part_of_optimizer_state(
      const c10::IValue& whole, const std::vector<optim::ParamGroup>& groups) const = 0;
};

} // namespace largo::parallel
