// Checkpoints of a pipelined model: each rank holds its stages' parameters and their
// optimizer state under the full model's names, so
//   - each rank can save its part as it is (PipelineParallel::state_dict(), the optimizer's
//     state_dict());
//   - the parts' union is the full model's state: full_state_dict() and
//     full_optimizer_state_dict() gather it on pipeline rank 0, a checkpoint torch.load
//     reads as a plain dict, the same as a non-pipelined run writes;
//   - a run with another pipeline size, or none, loads a full (or merged) state: the model
//     through PipelineParallel::load_state_dict, which takes its own entries, the optimizer
//     through select_optimizer_state.
// Optimizer states use optim/optimizer.h's format ({"state": {name: ...}, "param_groups":
// [{"name", "lr", ..., "params": [names]}], "type"}); a ZeRO-1 ShardedOptimizer's pieces are
// not merged here (each stage's replicas save their shards as ZeRO does).
//
// Collectives: gather_to_root and full_optimizer_state_dict (point to point to the root, in
// rank order; every rank of the group must call them).
#pragma once

#include <largo/comm/process_group.h>
#include <largo/optim/optimizer.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace largo::parallel {

// Every rank's `value` on `root`, in rank order (pickled, sent as bytes; the root's own a
// copy too, so the result is a snapshot that training does not change); an empty list on
// the other ranks. Collective.
std::vector<c10::IValue>
gather_to_root(comm::ProcessGroup& group, const c10::IValue& value, int root = 0);

// One optimizer state from the states of optimizers over disjoint parameter sets (the
// stages): the per-parameter states united, the groups matched by name (in the order they
// first appear, or `group_order` when given) with their parameters sorted by
// `parameter_order` (the full model's parameter names), the other group entries and the
// top-level ones taken from the first part that has them. Throws CheckpointError when the
// parts disagree about the optimizer type or name a parameter twice.
c10::IValue merge_optimizer_state_dicts(
    const std::vector<c10::IValue>& parts,
    const std::vector<std::string>& parameter_order,
    const std::vector<std::string>& group_order = {});

// The part of a (full) optimizer state that concerns `parameter_names`: their states, and
// the groups restricted to them (groups left empty are dropped, as build_param_groups drops
// them). Throws CheckpointError when a name is in none of the groups.
c10::IValue
select_optimizer_state(const c10::IValue& full, const std::vector<std::string>& parameter_names);

// The full optimizer state of a pipeline on pipeline rank 0 (None on the others): every
// rank's optimizer.state_dict() gathered and merged in the full model's parameter order (a
// snapshot). Collective (pipeline).
c10::IValue
full_optimizer_state_dict(const PipelineParallel& pipeline, const optim::Optimizer& optimizer);

} // namespace largo::parallel
