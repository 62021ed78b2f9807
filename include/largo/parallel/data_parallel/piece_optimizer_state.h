// The checkpoint format of an optimizer that steps 1-D *pieces* of parameters, as every
// ZeRO stage does (stages 1-2: parallel/data_parallel/sharded_optimizer.h; stage 3:
// parallel/data_parallel/fully_sharded_data_parallel.h). One rank's state:
//   {"type", "rank", "world_size", "base": <the base optimizer's state_dict() over the pieces>,
//    "pieces": {param_name: [offset in the flattened parameter, numel]},
//    "groups": [[every parameter name of the group, on all ranks], ...]}
// Because a piece says where it lies in its parameter, the shards of any world size (and of
// any stage) can be resharded into another world size or consolidated into the state_dict
// of an unsharded optimizer, reading one old shard at a time.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/optim/optimizer.h>
#include <largo/optim/tensor_norms.h>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace largo::parallel {

// Given the groups of an optimizer over pieces, the reducer that completes its per-parameter
// norms further once its pieces' partials are summed over the ranks (the same [2 * P] over
// its P pieces, optimizer.h): tensor parallelism's, over the shards of a layer.
using ParameterNormCompletion =
    std::function<optim::PartialNormReducer(const std::vector<optim::ParamGroup>& piece_groups)>;

// What one rank's optimizer steps.
struct PieceOwnership {
  int rank = 0;
  int world_size = 1;
  // Parameter name -> (offset of this rank's piece in the flattened parameter, numel).
  std::map<std::string, std::pair<int64_t, int64_t>> ranges;
  // Every parameter group's whole list of names (the same on every rank), in group order.
  std::vector<std::vector<std::string>> group_names;
};

// This rank's shard of the optimizer state, in the format above.
c10::IValue piece_state_dict(const optim::Optimizer& base, const PieceOwnership& ownership,
                             const std::string& type);

// Whether `shard` (piece_state_dict() output) was written by this rank of this world size for
// exactly these pieces, i.e. load_piece_state_dict() takes it as it is.
bool has_same_pieces(const c10::IValue& shard, const PieceOwnership& ownership);

// Restores piece_state_dict() output written by the same rank of the same world size, with
// the same pieces; throws CheckpointError otherwise (use load_resharded_piece_state).
void load_piece_state_dict(optim::Optimizer& base, const PieceOwnership& ownership,
                           const c10::IValue& state_dict);

// Builds this rank's state from the shards of a run with any world size: `shards` yields
// old rank r's piece_state_dict() in turn (at most one is held at a time); each old piece
// that overlaps one of this rank's pieces is copied in, and the groups' lr and weight decay
// come from the old shards. Throws CheckpointError when a parameter's state is incomplete or
// the groups do not match.
void load_resharded_piece_state(optim::Optimizer& base, const PieceOwnership& ownership,
                                int old_world_size,
                                const std::function<c10::IValue(int old_rank)>& shards);

// A whole (unsharded) optimizer state as the shard of a world of one rank, each parameter of
// `param_shapes` (name -> shape) one piece: what load_resharded_piece_state() takes to load a
// whole state into an optimizer over pieces.
c10::IValue whole_state_as_single_shard(
    const c10::IValue& whole, const std::map<std::string, std::vector<int64_t>>& param_shapes);

// Merges the shards of every rank (yielded in rank order) into the state_dict of an
// unsharded base optimizer over the whole parameters, with the shapes given by
// `param_shapes` (name -> shape): what an unsharded run, or torch.load, reads.
c10::IValue consolidate_sharded_optimizer_state(
    int world_size, const std::function<c10::IValue(int rank)>& shards,
    const std::map<std::string, std::vector<int64_t>>& param_shapes);

// The same in memory, over the ranks of `group` that step the pieces (this rank's: `base`
// over `ownership`): every rank's piece_state_dict() gathered on the group's rank 0 and
// merged there into the unsharded optimizer's state; None on the other ranks. Collective.
c10::IValue consolidate_on_first_rank(
    const optim::Optimizer& base,
    const PieceOwnership& ownership,
    const std::string& type,
    comm::ProcessGroup& group,
    const std::map<std::string, std::vector<int64_t>>& param_shapes);

} // namespace largo::parallel
