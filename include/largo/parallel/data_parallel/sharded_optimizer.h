// ZeRO stage 1 (and the optimizer half of stage 2): every rank keeps optimizer state only for
// its shard of the parameters, steps only that shard, and the updated shards are all-gathered
// so that every rank holds the whole model again (FairScale's OSS, PyTorch's
// ZeroRedundancyOptimizer, configured by OPTIMIZER.name: zero + OPTIMIZER.base_optimizer).
//
// Sharding: flat even slices. The trained parameters become views into one flat buffer per
// dtype (flat_layout.h); rank r owns elements [r * S, (r + 1) * S). A parameter may straddle
// two ranks, so each rank's base optimizer works on 1-D *pieces* of parameters, named like
// the parameters. Per-parameter norms (LARC, LAMB) are completed across ranks by a norm
// reducer installed on the base optimizer; global-norm clipping likewise
// (clip_grad_norm). Why flat slices rather than FairScale's whole-parameter partition:
// optimizer state is split exactly evenly (the memory formula holds to the padding), the
// update is one all-gather of one buffer per dtype, and stage 2 (reduce to the owner) and
// stage 3 share the layout; docs/zero.md gives the measurements.
//
// Gradients: stage 1 reads this rank's part of each full gradient (.grad, e.g. after DDP's
// all-reduce); stage 2 (sharded_data_parallel.h) writes only this rank's part, into the
// gradient shards this class owns (use_gradient_shards()).
//
// Collectives: step() (the norm reducer when the base optimizer uses one, then one
// all-gather per flat buffer) and clip_grad_norm() (one all-reduce); the constructor issues
// none. Every rank must call them in the same order.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/optim/optimizer.h>
#include <largo/optim/tensor_norms.h>
#include <largo/parallel/data_parallel/flat_layout.h>
#include <largo/parallel/data_parallel/piece_optimizer_state.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace largo::parallel {

struct ShardedOptimizerOptions {
  // Builds the optimizer that updates this rank's shard (OPTIMIZER.base_optimizer). It gets
  // the ShardedOptimizer's groups in the same order, each parameter replaced by this rank's
  // 1-D piece of it (same name); a group may be empty on some ranks.
  std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>
      make_base_optimizer;
  // Completes the per-parameter norms further (tensor parallelism's); empty: nothing further.
  ParameterNormCompletion complete_parameter_norms;
};

class ShardedOptimizer : public optim::Optimizer {
 public:
  // One dtype/device's parameters in one flat buffer.
  struct FlatBuffer {
    FlatLayout layout{{}, 1};
    at::Tensor params;              // [layout.padded_numel()]: the parameters are views into it
    std::vector<std::string> names; // parameter names, in buffer order
    std::vector<at::Tensor> tensors; // the parameters, in buffer order
    std::vector<ShardPiece> pieces;  // this rank's pieces
    std::vector<at::Tensor> piece_params; // views of `params` for `pieces`
    at::Tensor grad_shard; // [layout.shard_numel()] when gradient shards are used (stage 2)
  };

  // Moves the parameters of `param_groups` into flat buffers (their values kept; each
  // parameter's data becomes a view into its buffer) and builds the base optimizer over this
  // rank's pieces. Every rank must pass the same groups (same names, shapes and order).
  // Throws ConfigError without a base-optimizer factory.
  ShardedOptimizer(std::vector<optim::ParamGroup> param_groups,
                   std::shared_ptr<comm::ProcessGroup> group, ShardedOptimizerOptions options);

  // Steps this rank's pieces with the base optimizer (taking the groups' current lr and
  // weight decay), then all-gathers the updated shards. Collective.
  void step() override;
  std::string type() const override {
    return "zero";
  }

  // Frees (or zeroes) the full gradients and zeroes the gradient shards.
  void zero_grad(bool set_to_none = true) override;

  // This step's gradients of the parameters named `names` are dropped
  // (ParallelModel::drop_gradients): their pieces have none until zero_grad(), so the base
  // optimizer leaves them and clipping does not count them.
  void drop_gradients(const std::set<std::string>& names);

  // Stage 2: gradients come from grad_shard of each buffer instead of .grad.
  void use_gradient_shards();
  bool uses_gradient_shards() const {
    return gradient_shards_;
  }

  // The gradients this rank's step reads (its pieces' gradients): what the loss scaler
  // unscales and checks and what clipping measures. Valid after backward.
  std::vector<at::Tensor> shard_gradients();
  // The same as the 1-D pieces they belong to (each piece's .grad is its gradient): for
  // calls that take parameters, such as the loss scaler's unscale_.
  std::vector<at::Tensor> shard_parameters();

  // Global-norm clipping over the shards: local partial + one all-reduce (collective).
  // Returns the total norm before clipping.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  // This rank's shard of the optimizer state (piece_optimizer_state.h's format, type "zero").
  c10::IValue state_dict() const override;
  // Restores state_dict() output written by the same rank of the same world size; other
  // layouts go through load_resharded_state().
  void load_state_dict(const c10::IValue& state_dict) override;

  // Builds this rank's shard state from the shards of a run with any world size: `shards`
  // yields the state_dict() of every old rank in turn (so at most one is held at a time);
  // each old piece that overlaps one of this rank's pieces is copied in. Throws
  // CheckpointError when a parameter's state is missing or the names do not match.
  void load_resharded_state(int old_world_size,
                            const std::function<c10::IValue(int old_rank)>& shards);
  // The same from the state of an unsharded optimizer over this optimizer's parameters
  // (optim/optimizer.h's format): this rank's pieces of it.
  void load_whole_state_dict(const c10::IValue& whole);

  int64_t state_bytes() const override;
  // Bytes of the flat parameter buffers, and of the gradients this rank keeps (the shards in
  // stage 2; the full .grad tensors otherwise).
  int64_t parameter_bytes() const;
  int64_t gradient_shard_bytes() const;

  // This rank's pieces (shard_parameters()' tensors, in that order), each named like the
  // parameter it is part of.
  std::vector<std::pair<std::string, at::Tensor>> named_shard_parameters() const;

  // This rank's pieces: parameter name -> (offset in the flattened parameter, numel).
  std::map<std::string, std::pair<int64_t, int64_t>> piece_ranges() const;
  // The same, with the rank, the world size and the groups' names.
  PieceOwnership piece_ownership() const;

  optim::Optimizer& base() {
    return *base_;
  }
  const optim::Optimizer& base() const {
    return *base_;
  }
  std::vector<FlatBuffer>& flat_buffers() {
    return buffers_;
  }
  comm::ProcessGroup& process_group() const {
    return *group_;
  }

 private:
  void attach_piece_gradients();

  std::shared_ptr<comm::ProcessGroup> group_;
  std::vector<FlatBuffer> buffers_;
  std::unique_ptr<optim::Optimizer> base_;
  bool gradient_shards_ = false;
  std::set<std::string> dropped_; // until zero_grad()
};

// The norm reducer of an optimizer over 1-D pieces of parameters (ZeRO 1-3): the base
// optimizer's [2 * P] partials for its P pieces (optimizer.h) are scattered into a [2, N]
// tensor over all N parameters (piece p belongs to parameter piece_to_param[p], an index
// every rank numbers alike), one all-reduce completes it and every piece reads its
// parameter's total back. Collective when called; ranks holding no piece take part too.
optim::PartialNormReducer make_piece_norm_reducer(std::shared_ptr<comm::ProcessGroup> group,
                                                  std::vector<int64_t> piece_to_param,
                                                  int64_t num_params);
// The same followed by `completion`'s reducer over `piece_groups`, when given.
optim::PartialNormReducer complete_norms(
    optim::PartialNormReducer over_ranks,
    const ParameterNormCompletion& completion,
    const std::vector<optim::ParamGroup>& piece_groups);

// Global-norm clipping (optim/grad_clipping.h's semantics) of gradients held as 1-D pieces
// that tile the parameters across the ranks (ZeRO 1-3): this rank's partial sum (or maximum)
// over its `pieces`, one all-reduce to the total, then every piece scaled. Returns the total
// norm before clipping. Collective.
double clip_grad_norm_of_pieces(const std::vector<at::Tensor>& pieces,
                                comm::ProcessGroup& group, double max_norm, double norm_type);

} // namespace largo::parallel
