// Where a trained parameter lives on the device mesh: for each mesh dimension ("pp", "dp",
// "tp"), how the ranks along it hold the parameter's value (what the module holds between
// steps) and its optimizer state. PyTorch's DTensor describes a tensor the same way (one
// placement per mesh dimension: Replicate, Shard(dim)); Largo adds the flat shard of ZeRO and
// FSDP and a pipeline stage's ownership.
//
//   Replicate     every rank along the dimension holds the whole (a dimension a parameter
//                 does not list is replicated)
//   FlatShard     ZeRO and FSDP: the parameters are flattened into one buffer, cut into
//                 even slices over the dimension ("dp"); a rank holds 1-D pieces
//   Shard(dim)    tensor parallelism: split along `dim` over the dimension ("tp"), in
//                 `blocks` equal blocks each cut alike (the fused qkv projection: 3)
//   OwnedBy(r)    a pipeline: only rank r along the dimension ("pp") holds it
//
// Each data-parallel strategy states its dimension's placements (ParallelModel::placements()),
// and what lies outside the parallel layer (checkpoints, the model EMA, the start-up log)
// reads them rather than asking which mode is on. No collectives.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace largo::parallel {

struct Placement {
  enum class Kind { kReplicate, kFlatShard, kShard, kOwnedBy };
  Kind kind = Kind::kReplicate;
  int64_t dim = 0;    // kShard: the split dimension
  int64_t blocks = 1; // kShard: equal blocks, each split alike
  int owner = 0;      // kOwnedBy: the rank along the dimension that holds it

  static Placement replicate() {
    return {};
  }
  static Placement flat_shard() {
    return {Kind::kFlatShard};
  }
  static Placement shard(int64_t dim, int64_t blocks = 1) {
    return {Kind::kShard, dim, blocks};
  }
  static Placement owned_by(int owner) {
    return {Kind::kOwnedBy, 0, 1, owner};
  }
  // "Replicate", "FlatShard", "Shard(0)", "Shard(0, 3 blocks)", "OwnedBy(1)".
  std::string describe() const;
  bool operator==(const Placement& other) const;
  bool operator!=(const Placement& other) const {
    return !(*this == other);
  }
};

// Mesh dimension name -> placement; a dimension not listed is Replicate.
using Placements = std::map<std::string, Placement>;

// One trained parameter of this rank's module.
struct ParameterPlacement {
  std::string name;
  std::vector<int64_t> whole_shape; // in the whole (unsharded) model
  Placements value;                 // what the module holds between steps
  Placements optimizer_state;       // its optimizer state (and, with O2, master weight)
};

// The placements of every trained parameter this rank's module holds, by name.
class StatePlacements {
 public:
  explicit StatePlacements(std::vector<ParameterPlacement> parameters);

  const std::vector<ParameterPlacement>& parameters() const {
    return parameters_;
  }
  // Sets `dimension`'s placement of the value and the optimizer state of `name`; throws
  // largo::Error for a name that is not a trained parameter here.
  void place(
      const std::string& name,
      const std::string& dimension,
      Placement value,
      Placement optimizer_state);
  // The same for every parameter: the strategy's placement along `dimension`, which holds
  // for this rank even when it has no trained parameter (a pipeline stage of frozen or
  // parameterless blocks still owns its part of the model).
  void place_all(const std::string& dimension, Placement value, Placement optimizer_state);

  // Whether the module holds the whole model, every value whole (no FlatShard, Shard or
  // OwnedBy of a value): its local state is then the model's own, and a saved whole value
  // loads into it as it is. Every rank of a run answers alike (a pipeline's ranks all own
  // their stages), so a collective may hang on it.
  bool module_holds_whole_model() const;
  // Whether some value is flat-sharded: the module then holds compute copies gathered from
  // the shards (FSDP; possibly in a lower dtype), so a saved state's floating dtypes need not
  // be the module's.
  bool module_holds_gathered_copies() const;
  // Whether this rank's parameters are the whole model's (none owned by one pipeline rank).
  bool cover_whole_model() const;
  // Whether this rank's optimizer state is 1-D pieces of the whole model's (FlatShard along a
  // dimension, and split no other way: no Shard, no OwnedBy). A checkpoint then stores each
  // rank's pieces as they are, and a run of any size re-cuts them; the state of slices or of
  // a pipeline's stages is consolidated instead, so that the file is the whole model's.
  bool optimizer_state_in_flat_pieces() const;
  // The mesh dimensions along which some value (or, with `optimizer_state`, some optimizer
  // state) is split (Shard) or held by one rank (OwnedBy), in the order a whole state is made
  // from this rank's: every Shard dimension before every OwnedBy one (a pipeline stage's
  // parameters are what tensor parallelism splits, never the reverse). FlatShard dimensions
  // are not listed: flat pieces are undone first, by the strategy that holds them. What
  // ParallelModel's whole-state calls walk, so every rank of a dimension's group must list
  // it alike: a dimension placed with place_all() is listed even without a parameter.
  std::vector<std::string> dimensions_to_gather(bool optimizer_state) const;
  // One line per distinct placement, with its parameter count: "value {dp: FlatShard},
  // optimizer state {dp: FlatShard}: 14 parameters; ...".
  std::string describe() const;

 private:
  bool any_value(Placement::Kind kind) const;
  bool any_optimizer_state(Placement::Kind kind) const;

  std::vector<ParameterPlacement> parameters_;
  // place_all()'s placements by dimension: {value, optimizer state}.
  std::map<std::string, std::pair<Placement, Placement>> placed_for_all_;
};

// "{dp: FlatShard, tp: Shard(0)}", "{}" when replicated everywhere.
std::string describe(const Placements& placements);

} // namespace largo::parallel
