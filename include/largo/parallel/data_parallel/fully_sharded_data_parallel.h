// ZeRO stage 3 (FairScale's FullyShardedDataParallel, VISSL's MODEL.FSDP_CONFIG): the
// parameters are sharded too, not only the optimizer state and the gradients, so every rank
// holds 1/N of the model between uses and the whole of at most one or two units at a time.
//
// Units: any module with a tensor -> tensor forward (held as a torch::nn::AnyModule) is cut
// into units by a wrap policy (wrap_policy.h): each Sequential element the policy selects is
// a unit of its own (for Largo's trunk-of-blocks models, VISSL's AUTO_WRAP_THRESHOLD: every
// trunk block with enough trainable parameters); the remaining trainable parameters (small
// blocks, the head) form the root unit. With compute copies (below), the parameters of the
// modules kept in float32 (BatchNorm) form one more unit, "float32". A unit's forward is
// intercepted in its Sequential (sequential_interception.h): its parameters are gathered
// before it runs; names and state dicts do not change.
//
// Storage: a unit's trainable parameters are laid out in one flat buffer of their dtype
// (flat_layout.h, padded to a multiple of the world size); rank r keeps only its even slice
// of it, the *shard*, plus a gradient shard of the same size. The module's parameters stay
// the same tensors (same names, shapes, autograd identity) but their data are views of the
// unit's *full* flat buffer, whose storage is resized to 0 bytes while the unit is not
// needed and re-allocated and all-gathered when it is. Freeing the storage in place, rather
// than re-pointing the parameters, is what frees the memory: autograd keeps views of parameters
// (a linear layer saves weight.t()), and those views share the storage and see the
// re-gathered values in the backward (PyTorch's FSDP frees its flat parameter the same way).
//
// One training step:
//   forward():  buffers broadcast from rank 0 (BatchNorm statistics, as DDP's
//               broadcast_buffers); the root (and float32) unit gathered and kept until
//               the end of the backward; then the module's own forward, in which each
//               wrapped unit is gathered when it runs and freed again after it when
//               reshard_after_forward (and its output hooked, see below).
//   backward(): when the gradient of a unit's output arrives (a hook on that tensor, i.e.
//               before the unit's own backward runs), the unit is gathered again; once every
//               parameter of a unit has its gradient (post-hooks on the gradient
//               accumulators), the full gradients are flattened, reduce-scattered, divided by
//               the world size and *added* to the unit's gradient shard, and the full
//               gradients and the full parameters are freed. At the end of the backward, any
//               unit whose parameters got no gradient is reduced with zeros (so every rank
//               issues the same collectives) and the root unit is freed.
//   step():     any optim::Optimizer over this rank's pieces (make_optimizer()): every
//               parameter is replaced by its 1-D piece in this rank's shard (a view; its
//               .grad a view of the gradient shard), named like the parameter, so SGD,
//               AdamW, LARC... step the shards in place and key their state by parameter
//               name. Per-parameter norms (LARC, LAMB) are completed across ranks by a norm
//               reducer (sharded_optimizer.h's make_piece_norm_reducer).
// Gradient accumulation needs no no_sync(): each micro-step's backward reduce-scatters and
// adds to the gradient shard. The shards count as zeroed when the optimizer freed the pieces'
// gradients (zero_grad(set_to_none)) or zeroed them, or after zero_grad() here.
//
// Prefetch (on by default): the next unit's all-gather is started asynchronously before the
// current unit runs (forward: the next unit in wrap order, which for Sequential-built models
// is the order they run in; backward: the previous one).
//
// Activation checkpointing: applied to the same Sequential elements after FSDP wraps them
// (activation_checkpoint_wrapper.h), so a checkpointed segment's recompute runs the units'
// interceptors again, which gather each unit again; prefetches stay inside the segment being
// recomputed.
//
// Mixed precision with compute copies (compute_dtype; FairScale's mixed_precision, VISSL's
// FSDP AMP_TYPE O2): the shards stay float32 and are the master weights the optimizer
// updates; a unit is gathered as a compute_dtype copy (the shard is cast, then all-gathered:
// half the traffic and half the gathered memory), forward and backward run in that dtype
// (forward() casts floating-point inputs to it), and the low-precision gradients are
// reduce-scattered in compute_dtype, or in float32 with fp32_reduce_scatter, and added to
// the float32 gradient shard. The modules keeps_fp32 selects (BatchNorm: its kernels take
// low-precision inputs with float32 weights and statistics, as Apex's keep_batchnorm_fp32)
// compute in float32 from the "float32" unit, gathered for the whole step like the root.
// Without compute copies, autocast over the float32 units gives mixed precision too.
//
// Frozen parameters (requires_grad false) are not sharded: every rank keeps them whole (with
// compute copies only in modules keeps_fp32 selects: a frozen float32 weight elsewhere would
// meet low-precision inputs).
// Between steps the module's trainable parameters have no memory behind them: do not read
// them (full_parameters() gathers a copy).
//
// Collectives: the constructor (broadcast of rank 0's parameters and buffers), forward()
// (buffer broadcast, one all-gather per unit), every backward (one all-gather per resharded
// unit, one reduce-scatter per unit), full_parameters() (one all-gather per unit),
// clip_grad_norm() (one all-reduce), and the norm reducer in the optimizer's step. Every
// rank must make the same calls in the same order.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/optim/optimizer.h>
#include <largo/parallel/data_parallel/flat_layout.h>
#include <largo/parallel/data_parallel/piece_optimizer_state.h>
#include <largo/parallel/wrap_policy.h>

#include <torch/nn/modules/container/any.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace largo::parallel {

struct FullyShardedDataParallelOptions {
  // Which Sequential elements are units of their own (the rest is the root unit). The
  // trainer's: WrapPolicy::elements_of("trunk") && min_trainable_parameters(
  // MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD).
  WrapPolicy wrap_policy = WrapPolicy::min_trainable_parameters(0);
  // MODEL.FSDP_CONFIG.reshard_after_forward: free a unit's full parameters after its forward
  // (gathered again for its backward); false keeps them until its gradients are reduced.
  bool reshard_after_forward = true;
  // Start the all-gather of the next unit (in the forward: the next one's; in the backward:
  // the previous one's) before running this one, so that communication overlaps compute.
  // Costs one more unit gathered at a time.
  bool prefetch = true;
  bool broadcast_buffers = true; // DISTRIBUTED.BROADCAST_BUFFERS: rank 0's buffers each forward
  // MODEL.FSDP_CONFIG.compute_dtype with mixed_precision: gather and compute in this dtype
  // (kHalf, kBFloat16) from the float32 shards (see "compute copies" above); nullopt: in the
  // parameters' own dtype.
  std::optional<at::ScalarType> compute_dtype;
  // MODEL.FSDP_CONFIG.fp32_reduce_scatter: with compute copies, reduce-scatter the gradients
  // in the shards' dtype (float32) rather than in compute_dtype.
  bool fp32_reduce_scatter = false;
  // With compute copies: the modules whose parameters compute in float32 (Apex's
  // keep_batchnorm_fp32; precision::is_batchnorm). Unset: none.
  std::function<bool(const torch::nn::Module&)> keeps_fp32;
};

// How FullyShardedDataParallel cuts a model into units (see above), without sharding anything
// or communicating: for the trainer's log and `largo estimate`.
struct FsdpUnitPlan {
  std::string name;      // the wrapped module's name ("trunk.3"), "root" or "float32"
  int64_t position = -1; // its place among the wrapped units; -1 for the root and float32
  std::vector<std::string> param_names;
  std::vector<at::Tensor> params;
  int64_t numel = 0; // trainable parameter elements
  // The dtype it is gathered and computed in: compute_dtype for a unit of compute copies,
  // else (and for the float32 unit) the parameters' own.
  at::ScalarType gathered_dtype = at::kFloat;
};
// Uses wrap_policy, compute_dtype and keeps_fp32 of `options`.
std::vector<FsdpUnitPlan> plan_fsdp_units(const std::shared_ptr<torch::nn::Module>& model,
                                           const FullyShardedDataParallelOptions& options);

class FullyShardedDataParallel {
 public:
  // One unit: its parameters, their place in the flat buffer and this rank's shard.
  struct Unit {
    std::string name;      // the wrapped module's name ("trunk.3"), "root" or "float32"
    int64_t position = -1; // its place among the wrapped units; -1: gathered for the whole step
    // A wrapped unit: the Sequential element it intercepts and that element's own forward
    // (put back when this object is destroyed).
    torch::nn::Sequential container{nullptr};
    size_t index_in_container = 0;
    torch::nn::AnyModule module_forward;
    std::vector<std::string> param_names;
    std::vector<at::Tensor> params; // the module's parameters (views of `full`)
    FlatLayout layout{{}, 1};
    // [layout.padded_numel()], in the compute dtype; storage of 0 bytes while freed.
    at::Tensor full;
    at::Tensor shard;      // [layout.shard_numel()]: this rank's slice, what the optimizer steps
    at::Tensor gather_source; // the shard cast to full's dtype while its all-gather runs
    at::Tensor grad_shard; // [layout.shard_numel()]: reduced, averaged, accumulated gradients
    std::vector<ShardPiece> pieces;       // this rank's pieces of the parameters
    std::vector<at::Tensor> piece_params; // views of `shard` for `pieces` (.grad: of grad_shard)
    bool gathered = false;  // `full` holds memory (its all-gather may still be in flight)
    comm::Work pending;     // the in-flight all-gather of a prefetch
    bool in_flight = false; // `pending` not waited for yet
    // Per backward: how many parameters have their gradient, and whether it was reduced.
    size_t num_ready = 0;
    bool reduced = false;
    bool used_in_backward = false;
    // Where the unit last ran: -1 under no-grad, 0 in a forward with grad, or the id of the
    // activation-checkpoint recompute it ran in (activation_checkpoint.h); the backward
    // prefetches the previous unit only when it ran in the same place.
    int64_t ran_in = -1;
  };

  // Broadcasts rank 0's parameters and buffers (a collective), cuts `model` into units,
  // intercepts the wrapped units' forwards and keeps this rank's shard of each (the full
  // buffers start freed). Throws largo::Error for trainable
  // parameters that are not floating point or not all on one device and dtype within a
  // unit, and for frozen parameters outside keeps_fp32 modules with compute copies.
  FullyShardedDataParallel(
      torch::nn::AnyModule model,
      std::shared_ptr<comm::ProcessGroup> group,
      FullyShardedDataParallelOptions options = {});
  // For a module holder (`Net` for `struct NetImpl`, models::TrunkHeadModel).
  template <typename ModuleImpl>
  FullyShardedDataParallel(
      torch::nn::ModuleHolder<ModuleImpl> model,
      std::shared_ptr<comm::ProcessGroup> group,
      FullyShardedDataParallelOptions options = {})
      : FullyShardedDataParallel(torch::nn::AnyModule(model), std::move(group), std::move(options)) {}
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // The model's forward (input -> output), gathering unit by unit as described above; with
  // compute copies, a floating-point input is cast to compute_dtype and the output is in it.
  // Collective. Under torch::NoGradGuard every unit is freed before it returns.
  at::Tensor forward(const at::Tensor& input);

  // Builds `make_base` over this rank's pieces of `groups` (groups of the model's
  // parameters, e.g. optim::build_param_groups(*model, ...), matched by name; a group may
  // end up empty on some ranks) and installs the cross-rank norm reducer, then
  // `complete_parameter_norms`'s when given (tensor parallelism's). Throws largo::Error for a
  // name that is not a sharded parameter.
  std::unique_ptr<optim::Optimizer> make_optimizer(
      const std::vector<optim::ParamGroup>& groups,
      const std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>&
          make_base,
      const ParameterNormCompletion& complete_parameter_norms = {});

  // The pieces the optimizer of make_optimizer() steps on this rank, for its checkpoint
  // (piece_optimizer_state.h: the same format as ZeRO stages 1-2, so the shards of either
  // reshard into the other or consolidate into an unsharded optimizer's state).
  PieceOwnership piece_ownership() const;

  // Zeroes every gradient shard (and re-attaches the pieces' gradients).
  void zero_grad();

  // This rank's 1-D pieces of every parameter (their .grad: views of the gradient shards),
  // in unit order: what the loss scaler unscales and checks and what clipping measures.
  std::vector<at::Tensor> shard_parameters() const;

  // Global-norm clipping (MODEL.GRAD_CLIP) over the gradient shards: this rank's partial
  // norm, one all-reduce, then every shard scaled (optim/grad_clipping.h's semantics).
  // Returns the total norm before clipping. Collective. Call after backward, before step.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  // Every trainable parameter's full value, by name in the model's order (a copy of the
  // shards' dtype: the float32 masters with compute copies), gathered one unit at a time.
  // Collective. For tests and small models: it holds the whole model.
  std::vector<std::pair<std::string, at::Tensor>> full_parameters();

  // The whole model state for a checkpoint: every parameter (sharded ones gathered one unit
  // at a time) and buffer by name, in the model's order (PyTorch's state_dict naming), as CPU
  // copies on rank `root` (on the other ranks: empty). Collective. Only one unit is gathered
  // on the device at a time.
  std::vector<std::pair<std::string, at::Tensor>> full_state_on_rank(int root);

  // Changes one parameter's whole value on every rank alike, between steps (SwAV's prototypes
  // normalised after the optimizer step): its unit's shards all-gathered (the float32 masters
  // with compute copies) into a temporary, `update` applied to the parameter's part of it,
  // and this rank's piece of the result written back into its shard. A frozen parameter
  // (kept whole) is changed in place. `update` must compute the same on every rank.
  // Collective (one all-gather) for a sharded parameter. Throws largo::Error for a name the
  // model does not have.
  void
  update_full_parameter(const std::string& name, const std::function<void(at::Tensor&)>& update);
  // The inverse, on every rank: each rank copies its shard of every sharded parameter out of
  // the whole values, and the frozen parameters and the buffers whole. Every name of the
  // model must be in `state` with its shape (checkpoint::check_model_state_dict checks a
  // checkpoint first); throws largo::Error naming a missing one. No collective.
  void load_full_state(const std::unordered_map<std::string, at::Tensor>& state);

  // Bytes of full flat buffers gathered right now, and the most gathered at once since
  // construction or the last reset_peak_gathered_bytes(): the full-parameter memory FSDP
  // adds on top of the shards.
  int64_t gathered_bytes() const {
    return gathered_bytes_;
  }
  int64_t peak_gathered_bytes() const {
    return peak_gathered_bytes_;
  }
  void reset_peak_gathered_bytes() {
    peak_gathered_bytes_ = gathered_bytes_;
  }
  // Bytes of this rank's parameter shards (gradient shards are the same size).
  int64_t shard_bytes() const;

  const std::vector<Unit>& units() const {
    return units_;
  }
  // The wrapped module (its wrapped units' forwards intercepted).
  const std::shared_ptr<torch::nn::Module>& module() const {
    return module_;
  }
  comm::ProcessGroup& process_group() const {
    return *group_;
  }
  const FullyShardedDataParallelOptions& options() const {
    return options_;
  }

 private:
  // Starts the unit's all-gather (asynchronous); gather() also waits for it.
  void start_gather(Unit& unit);
  void gather(Unit& unit);
  void free(Unit& unit);
  void reduce_gradients(Unit& unit);
  void attach_piece_gradients(Unit& unit);
  void on_gradient_ready(size_t param_index);
  void on_backward_end();
  // A wrapped unit's interceptor: gather, prefetch, run, hook the output, free.
  at::Tensor run_unit(size_t u, const at::Tensor& x);
  void build_unit(size_t u, FsdpUnitPlan plan, std::vector<at::Tensor>& hooked);
  // Gathers the units' shards one at a time into a scratch buffer of the shards' dtype (so
  // the float32 masters, not the compute copies; collective) and, when `keep`, returns `copy`
  // of each of their parameters by name.
  std::unordered_map<std::string, at::Tensor> copy_units(
      bool keep, const std::function<at::Tensor(const at::Tensor&)>& copy);

  torch::nn::AnyModule model_;
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<comm::ProcessGroup> group_;
  FullyShardedDataParallelOptions options_;
  // The wrapped units in wrap order (positions 0, 1, ...), then the root and float32 units.
  std::vector<Unit> units_;
  size_t num_wrapped_ = 0;
  // Hook index -> (unit, parameter within the unit).
  std::vector<std::pair<size_t, size_t>> hooked_params_;
  std::vector<at::Tensor> buffers_;
  std::vector<std::vector<std::string>> optimizer_group_names_; // make_optimizer()'s groups
  struct Hooks;
  std::unique_ptr<Hooks> hooks_;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_bytes_ = 0;
};

} // namespace largo::parallel
