// One call that makes any module train in parallel, and one interface for every mode
// (torchtitan's parallelize functions; FairScale and PyTorch compose the same parts by
// wrapping). A libtorch user's own module and loop:
//
//   auto model = largo::parallel::parallelize(torch::nn::AnyModule(net), groups, make_sgd,
//                                             world, options);   // or a DeviceMesh
//   for each step:
//     model->zero_grad();
//     for each micro-batch k of K:
//       auto scope = model->micro_step(/*synchronize=*/k + 1 == K);   // DDP's no_sync
//       model->backward(cross_entropy(model->forward(x_k), y_k) / K);   // loss scaled
//     if (model->finish_backward()) {        // unscaled; every rank agrees on inf/NaN
//       model->clip_grad_norm(1.0);          // global norm, across shards
//     }
//     model->step();                         // skipped on inf/NaN with loss scaling
//
// Modes (ParallelOptions::data_parallelism), one implementation each, behind ParallelModel:
//   local (one process), DDP, ZeRO-1 (sharded optimizer state), ZeRO-2 (+ gradients),
//   FSDP / ZeRO-3 (+ parameters). Precision (Apex O0-O3 or autocast, float16/bfloat16, a
//   GradScaler) and activation checkpointing compose with each of them.
// Pipeline parallelism (ParallelOptions::pipeline, pipeline_parallel.h) cuts a model that is
// a chain of blocks into stages over the pipeline ranks of a DeviceMesh (device_mesh.h), DDP
// or ZeRO-1 over each stage's replicas. Its step is one forward_backward() per micro-step (the
// schedule interleaves forwards and backwards), which every mode offers, so a loop written with
// forward_backward runs unchanged on all of them:
//     auto scope = model->micro_step(k + 1 == K);
//     model->forward_backward(x_k, y_k, cross_entropy, /*loss_divisor=*/K);
//
// Every run is laid out on a DeviceMesh (device_mesh.h): pp x dp x tp, its sizes from the
// options (mesh_dimensions), built once by make_device_mesh(world, options); given the world,
// parallelize() builds it itself. Each mode runs over its dimension's group: data parallelism
// over "dp", tensor parallelism over "tp", pipeline stages over "pp".
//
// Tensor parallelism (tensor_parallel_plan.h) composes with DDP, ZeRO-1, ZeRO-2 and FSDP
// over the replicas as torchtitan's 2-D parallelism, and with DDP or ZeRO-1 in a pipeline
// (3-D: pp x dp x tp): step 0 is the caller's, before the param groups are built, because it
// replaces the planned layers' parameters by this rank's shards:
//   auto mesh = make_device_mesh(world, options);       // options.tensor_parallel_size = 2
//   0. apply_tensor_parallel_plan(*net, *mesh, options); // the same seed on every rank first
//      auto groups = optim::build_param_groups(...);     // over the sharded parameters
//      auto model = parallelize(AnyModule(net), groups, make_optimizer, mesh, options);
// (a user's own layers: ColumnParallelLinear / RowParallelLinear over mesh->group("tp")).
// parallelize() checks that the module's shards are for the mesh's "tp" size (and refuses an
// unsharded module there, or the reverse). The returned model's clip_grad_norm() is the
// unsharded model's norm, and its state (model_state_dict(), full_parameters(),
// optimizer_state_dict()) is the unsharded model's, gathered over the tensor-parallel group,
// so that a run with and one without tensor parallelism read each other's checkpoints
// (with ZeRO and FSDP, optimizer_state_dict() gives it on the first replica only: the
// replicas' pieces are consolidated there; FSDP's model_state_dict() too). In a pipeline each
// stage's rank exchanges activations with the other stages' ranks of the same shards.
// Tensor parallelism is no mode of its own: every mode's ParallelModel holds the mesh's "tp"
// dimension and completes its gathers, norms and placements over it (docs/parallelism.md).
//
// The order that makes them compose is fixed here, in parallelize():
//   1. activation checkpointing is planned: its probe steps run forward and backward on the
//      bare module, before any gradient hook exists;
//   2. the precision policy casts the module (O2/O3), before DDP sizes its buckets by dtype
//      and FSDP lays out its units; O2's float32 masters replace the parameters in the
//      optimizer's groups;
//   3. the optimizer is built: ZeRO's ShardedOptimizer moves the parameters into flat
//      buffers, which ZeRO-2's reducer then reduces into; FSDP builds it over its shards;
//   4. the data-parallel wrapper broadcasts rank 0's weights (DDP, ZeRO-2, FSDP), and then
//      O2's masters are copied from the broadcast weights;
//   5. checkpointed segments are installed in the module last, so that under FSDP their
//      recompute runs (and gathers) the units again.
//
// The module must be on its device; its parameters and the groups' tensors must be the
// same tensors (build the groups from the module, e.g. optim::build_param_groups). FSDP
// units and checkpointed modules are elements of torch::nn::Sequential containers chosen by
// a WrapPolicy (wrap_policy.h); everything else works on any module.
//
// Collectives: make_device_mesh() (its new_group calls), parallelize() (given the world, the
// mesh's first; rank 0's checkpointing cut; the initial broadcast), and on the returned object
// forward() (buffer broadcasts, FSDP's gathers), backward() (gradient reductions),
// finish_backward() (manual reduction; the inf/NaN agreement), clip_grad_norm(), step()
// (ZeRO's all-gathers, norm reductions), model_state_dict() under FSDP. With tensor
// parallelism also forward() and backward() (the layers' all-reduces over the
// tensor-parallel group), clip_grad_norm() and finish_backward() over it, and
// model_state_dict(), full_parameters(), optimizer_state_dict() and update_full_parameter()
// (its all-gathers). Every rank must make the same calls in the same order.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/optim/optimizer.h>
#include <largo/optim/optimizer_factory.h>
#include <largo/parallel/activation_checkpointing/checkpointed_segments.h>
#include <largo/parallel/activation_checkpointing/sequential_checkpoint_plan.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/data_parallel/fully_sharded_data_parallel.h>
#include <largo/parallel/data_parallel/piece_optimizer_state.h>
#include <largo/parallel/data_parallel/sharded_data_parallel.h>
#include <largo/parallel/estimate/memory_estimate.h>
#include <largo/parallel/mesh/device_mesh.h>
#include <largo/parallel/mesh/placement.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>
#include <largo/parallel/wrap_policy.h>
#include <largo/precision/grad_scaler.h>
#include <largo/precision/mixed_precision.h>
#include <largo/precision/precision_policy.h>

#include <torch/nn/modules/container/any.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace largo::parallel {

class StateDimension;          // mesh/state_dimension.h (private)
class TensorParallelDimension; // tensor_parallel/tensor_parallel_dimension.h (private)

enum class DataParallelism {
  kDdp,   // every rank holds everything; gradients all-reduced (one process: plain local)
  kZero1, // optimizer state sharded
  kZero2, // + gradients sharded (reduced to their owner)
  kFsdp,  // + parameters sharded (ZeRO-3)
};

// "DDP", "ZeRO-1", ...
std::string to_string(DataParallelism mode);
// The ZeRO stage: 0 for DDP.
int zero_stage(DataParallelism mode);
// How `mode` places every trained parameter along the mesh's "dp" dimension (name and shape
// left empty): the optimizer state flat-sharded from stage 1, the value too at stage 3
// (FSDP), replicated otherwise. The strategies place their parameters so
// (ParallelModel::placements()); this says it before any model is built, for the checks of a
// run's plan that depend on where the state lives.
ParameterPlacement data_parallel_placement(DataParallelism mode);

struct ActivationCheckpointingOptions {
  // Every Sequential element this policy selects runs as a checkpointed segment of its own
  // (e.g. WrapPolicy::of_type<BlockImpl>()).
  WrapPolicy modules;
  // Or: the Sequential registered as `sequential` (e.g. "trunk") is cut into `num_splits`
  // segments, every one but the last checkpointed (VISSL's
  // NUM_ACTIVATION_CHECKPOINTING_SPLITS). 0: off.
  std::string sequential;
  int64_t num_splits = 0;
  // Or where to cut it, given: {0, b_1, ..., the Sequential's size}, num_splits + 1 entries
  // (e.g. VISSL's RegNet stage_checkpoints groups); no probe then chooses the cut.
  std::vector<int64_t> boundaries;
  // Where to cut: balanced by the activation bytes each element holds, measured on a probe
  // batch of zeros of `probe_input_shape` (the module's input, without the batch dimension;
  // falls back to equal element counts where memory cannot be measured), or equal counts.
  // Every rank installs rank 0's cut (each measures its own bytes; the ranks must recompute
  // alike).
  SegmentCost cost = SegmentCost::kActivationBytes;
  std::vector<int64_t> probe_input_shape;
  int64_t probe_batch_size = 2;
  bool preserve_rng_state = true;
  // With a cut: also measure the peak activation memory of a training step at this batch
  // size with and without it (sequential_checkpoint_plan.h), on probe steps of the bare
  // module. 0: not measured.
  int64_t report_batch_size = 0;

  bool enabled() const {
    return !modules.empty() || num_splits > 0;
  }
};

// Pipeline parallelism: the world is `size` pipeline ranks x data-parallel replicas (the
// "pp" and "dp" dimensions of device_mesh.h's layout); `stages` says how the blocks are cut
// and scheduled.
struct PipelineOptions {
  int size = 1; // DISTRIBUTED.PIPELINE_SIZE; 1: no pipeline
  PipelineParallelOptions stages;

  bool enabled() const {
    return size > 1;
  }
};

struct ParallelOptions {
  DataParallelism data_parallelism = DataParallelism::kDdp;
  // With a size > 1 the model must be a chain of blocks (ModelToParallelize); DDP (kDdp) or
  // ZeRO-1 (kZero1) over each stage's replicas.
  PipelineOptions pipeline;
  DistributedDataParallelOptions ddp;   // kDdp
  ShardedDataParallelOptions zero;      // kZero2's gradient reduction
  FullyShardedDataParallelOptions fsdp; // kFsdp (its compute_dtype: FSDP's own mixed precision)
  ActivationCheckpointingOptions activation_checkpointing;
  precision::PrecisionPolicy precision;
  precision::GradScalerOptions grad_scaler;
  // Check gradients for inf/NaN in runs without loss scaling too (finish_backward()).
  bool check_finite = true;
  // Keep the sharded optimizer's state and its copy of this rank's pieces in host memory and
  // step them there (host_offload_optimizer.h; DeepSpeed's offload_optimizer): ZeRO-1,
  // ZeRO-2 and FSDP, without a pipeline and without tensor parallelism. The device keeps the
  // parameters and gradients, and no optimizer state.
  bool offload_optimizer = false;
  // The mesh's "tp" dimension (mesh_dimensions(); DISTRIBUTED.TENSOR_PARALLEL_SIZE): the
  // number of tensor-parallel shards per data-parallel replica. Composes with every
  // data_parallelism (FSDP without its compute_dtype), without a cast of the module (O2, O3)
  // and without activation checkpointing; with a pipeline only with stages cut by parameters
  // or boundaries (not timed) and not recomputed. The module's layers must be split over the
  // mesh's "tp" group before the param groups are built (apply_tensor_parallel_plan(), or
  // apply_tensor_parallel() for a user's own layers).
  int tensor_parallel_size = 1;
  // Sequence parallelism in the tensor-parallel ViT layers (TensorParallelPlanOptions;
  // DISTRIBUTED.SEQUENCE_PARALLEL): what apply_tensor_parallel_plan() splits them with. Needs
  // tensor_parallel_size > 1.
  bool sequence_parallel = false;
};

using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

// This rank's model state: what the library holds (measured) and what the ZeRO accounting
// predicts for the same layout (memory_estimate.h).
struct ModelStateReport {
  int zero_stage = 0;
  ModelStateBytes measured;
  std::optional<ModelStateBytes> estimated; // when an optimizer spec was given
  int64_t peak_gathered_bytes = 0;          // FSDP: the most full units held at once
  // On a GPU: the bytes the CUDA caching allocator has given to tensors on the model's
  // device right now (torch.cuda.memory_allocated()): the model state as the allocator sees
  // it, with whatever else is live (communication buckets, the batch in hand); its peak
  // since the process began also holds a step's activations. nullopt on the CPU.
  std::optional<int64_t> allocator_bytes;
  std::optional<int64_t> allocator_peak_bytes;
  std::string describe(int rank) const;
};

// The optimizer state of a sharded mode (ZeRO 1-3): the optimizer that steps this rank's
// pieces and which pieces they are (piece_optimizer_state.h's checkpoint format).
struct OptimizerShard {
  optim::Optimizer* optimizer = nullptr;
  PieceOwnership ownership;
  std::string type; // "zero" (stages 1-2) or "fsdp"
};

// What parallelize() is given: a module, or a model's chain of blocks (pipeline_blocks(),
// pipeline_stages.h). A pipeline (ParallelOptions::pipeline.size > 1) cuts blocks into
// stages: blocks given as such, or a module that is a chain of them (a models::TrunkHeadModel:
// its trunk's blocks, then its head's). Converts implicitly from each, so
// parallelize(net, ...) and parallelize(blocks, ...) both read.
struct ModelToParallelize {
  ModelToParallelize(torch::nn::AnyModule module) : model(std::move(module)) {}
  // A module holder (`Net` for `struct NetImpl`, models::TrunkHeadModel).
  template <typename ModuleImpl>
  ModelToParallelize(torch::nn::ModuleHolder<ModuleImpl> module)
      : model(torch::nn::AnyModule(std::move(module))) {}
  ModelToParallelize(std::vector<PipelineBlock> blocks) : model(std::move(blocks)) {}

  std::variant<torch::nn::AnyModule, std::vector<PipelineBlock>> model;
};

class ParallelModel {
 public:
  virtual ~ParallelModel();
  ParallelModel(const ParallelModel&) = delete;
  ParallelModel& operator=(const ParallelModel&) = delete;

  // ---- one optimizer step ----
  // The module's forward under the precision policy (autocast, or the input cast to the
  // module's dtype); floating-point outputs come back float32. Collective in training (DDP's
  // buffer broadcast, FSDP's gathers); under torch::NoGradGuard only where
  // forward_communicates_without_grad() (FSDP), so evaluation may run different numbers of
  // batches on different ranks otherwise.
  at::Tensor forward(const at::Tensor& input);
  virtual bool forward_communicates_without_grad() const {
    return false;
  }
  // After this rank's last evaluation forward (under torch::NoGradGuard), having run
  // `forwards_run` of them: where forwards communicate, every rank must run as many as the
  // rank with the most, so this one runs forwards of one zero sample of `sample_shape` on
  // `device` until it has. Collective there (an all-reduce over process_group() first);
  // nothing otherwise.
  void match_evaluation_forwards(
      int64_t forwards_run, const std::vector<int64_t>& sample_shape, torch::Device device);

  // The scope of one micro-step of gradient accumulation: with synchronize false, the
  // backward inside it accumulates gradients locally (DDP's no_sync; ZeRO-2 and FSDP reduce
  // every backward into their shards, so nothing changes for them).
  class MicroStep {
   public:
    MicroStep(MicroStep&&) = default;
    ~MicroStep();

   private:
    friend class ParallelModel;
    explicit MicroStep(std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync);
    std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync_;
  };
  [[nodiscard]] MicroStep micro_step(bool synchronize);

  // loss.backward(), on the loss scaled by the loss scaler when there is one.
  void backward(const at::Tensor& loss);

  // output [batch, ...], target [batch, ...] -> the batch's 0-d mean loss.
  using LossFunction =
      std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
  // One micro-step: loss(forward(inputs), targets) / loss_divisor (gradient accumulation's
  // micro-step count), backward. Returns the loss before the division (the same on every
  // rank of a pipeline). A pipeline runs its whole schedule here, splitting the batch into
  // its micro-batches. Collective as forward() and backward() are. Reads the loss to the host
  // (a device sync): forward_backward_on_device's value.
  double forward_backward(
      const at::Tensor& inputs,
      const at::Tensor& targets,
      const LossFunction& loss,
      int64_t loss_divisor = 1);
  // The same micro-step, the loss left on the device: a detached 0-d tensor, for loops that
  // read it later (train/train_step.h without a sync every step). A pipeline's is its host
  // value put back on the device: its schedule reads the loss anyway.
  virtual at::Tensor forward_backward_on_device(
      const at::Tensor& inputs,
      const at::Tensor& targets,
      const LossFunction& loss,
      int64_t loss_divisor = 1);

  // After the last micro-step: manual gradient reduction (DDP's manual_reduction), then the
  // gradients unscaled (O2: copied to the float32 masters first) and checked for inf/NaN, with
  // every rank agreeing. loss_is_finite = false (this rank's loss was inf/NaN) counts as an
  // inf gradient. Returns whether every gradient was finite on every rank. Collective.
  bool finish_backward(bool loss_is_finite = true);
  // finish_backward without reading the decision to the host (no loss scaling:
  // precision::MixedPrecision::unscale_on_device): the agreed inf/NaN flag, [1] float32 on the
  // device (undefined when the options check nothing), with `loss_non_finite` ([1] float32, 1
  // when this rank's loss was inf/NaN) counted in. The step() after it runs the optimizer
  // whatever the flag says: the caller reads it before it trusts the weights. Collective.
  at::Tensor finish_backward_on_device(const at::Tensor& loss_non_finite = {});

  // Global-norm gradient clipping over every rank's gradients (after finish_backward).
  // Returns the total norm before clipping. Collective in the sharded modes.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);

  // The optimizer step, skipped when finish_backward() found inf/NaN and the loss is scaled;
  // updates the loss scale; O2: copies the masters into the module. Returns whether it
  // stepped. Throws TrainingError when the loss scale cannot back off any further.
  bool step();

  // Frees (or zeroes) every gradient before the next step's first micro-step.
  void zero_grad();

  // Drops this step's gradients of the trained parameters named `names`, on every piece of
  // them, as PyTorch's `param.grad = None` does (VISSL's TEMP_FROZEN_PARAMS_ITER_MAP): step()
  // leaves those parameters and their optimizer state unchanged, and clip_grad_norm() does
  // not count them. Call it between finish_backward() and clip_grad_norm() / step() with the
  // same names on every rank; the next step's gradients are whole again. A pipeline rank
  // drops the ones its stages hold. Throws largo::Error naming a name that is not a
  // parameter of the model. No collective.
  void drop_gradients(const std::vector<std::string>& names);

  // ---- what it holds ----
  // The optimizer whose param_groups() carry each group's lr and weight decay (set them
  // before step(); ZeRO passes them on to the shard's optimizer).
  optim::Optimizer& optimizer() {
    return *optimizer_;
  }
  precision::MixedPrecision& precision() {
    return *precision_;
  }
  const std::shared_ptr<torch::nn::Module>& module() const {
    return module_;
  }
  // Every rank of the run: the mesh's world.
  comm::ProcessGroup& process_group() const {
    return *group_;
  }
  // The run's layout (pp x dp x tp), which parallelize() was given or built.
  const DeviceMesh& mesh() const {
    return *mesh_;
  }
  // The ranks that read different data, over which per-rank sums (images, losses, meters)
  // add up to the global batch's: the mesh's "dp" group (every rank, unless pipeline stages
  // or tensor-parallel shards share their replica's batch).
  comm::ProcessGroup& data_parallel_group() const {
    return *replicas_;
  }
  // The pipeline of the pipeline mode; null in the others.
  virtual const PipelineParallel* pipeline() const {
    return nullptr;
  }
  // The mesh's "tp" group; null without tensor parallelism.
  comm::ProcessGroup* tensor_parallel_group() const {
    return mesh_->size("tp") > 1 ? mesh_->group("tp").get() : nullptr;
  }
  DataParallelism data_parallelism() const {
    return options_.data_parallelism;
  }
  // Where each trained parameter of module() and its optimizer state live on the mesh
  // (mesh/placement.h): whether the module holds whole values (or FSDP's gathered copies of
  // flat shards, tensor parallelism's splits) and whether this rank's parameters are the
  // whole model's (or a pipeline rank's). What checkpoints read instead of the mode.
  StatePlacements placements() const;
  // "ZeRO stage 2: optimizer state and gradients sharded over 4 rank(s) (gloo), 3 gradient
  // buckets; precision ...; activation checkpointing: ..." for the start-up log.
  std::string describe() const;
  // Measured model-state bytes of this rank, with the estimate for `spec` when given.
  // Measure after a step (before zero_grad frees the gradients).
  ModelStateReport memory_report(const optim::OptimizerSpec* spec = nullptr) const;
  // Where ActivationCheckpointingOptions::sequential was cut, and what that saves
  // (report_batch_size); nullopt without a cut / without a report.
  const std::optional<SequentialCheckpointPlan>& checkpoint_plan() const {
    return checkpoint_plan_;
  }
  const std::optional<ActivationMemoryReport>& activation_memory_report() const {
    return activation_memory_report_;
  }

  // ---- state ----
  // Every parameter and buffer by name, in the module's order (a checkpoint's "model"),
  // as CPU copies on `root`; other ranks may get an empty list. Collective under FSDP and
  // with a pipeline (root 0 only: its rank 0 gathers the stages). With tensor parallelism:
  // the full values on every rank, gathered over the tensor-parallel group (a collective
  // there; load_model_state_dict() then takes this rank's slice of each shard).
  std::vector<std::pair<std::string, at::Tensor>> model_state_dict(int root = 0);
  // Loads whole values by name (every parameter and buffer of the module, each with its
  // shape; FSDP keeps this rank's shard). O2: the masters are set from them. Throws
  // largo::Error naming a missing entry. No collective.
  void load_model_state_dict(const std::unordered_map<std::string, at::Tensor>& state);
  // Every parameter and buffer name of the whole model, in order (model_state_dict()'s), of
  // which module() holds this rank's part: the module's own names, except in a pipeline,
  // whose module is this rank's stages. No collective.
  virtual std::vector<std::string> whole_model_names() const;
  // Every parameter's whole value by name (copies; FSDP gathers them unit by unit on every
  // rank: a collective, for tests and small models; a pipeline gathers them on its rank 0,
  // and its other ranks get their stages').
  std::vector<std::pair<std::string, at::Tensor>> full_parameters();
  // This rank's pieces of the optimizer state when placements() puts it in flat pieces
  // (StatePlacements::optimizer_state_in_flat_pieces(): ZeRO 1-3 without tensor or pipeline
  // parallelism); nullopt otherwise, when optimizer_state_dict() gives the whole state.
  std::optional<OptimizerShard> optimizer_shard();
  // Without a shard: the whole model's optimizer state (optim/optimizer.h's format) on rank
  // 0: optimizer().state_dict(); a pipeline gathers every stage's on pipeline rank 0 (None
  // elsewhere; collective over the pipeline). With tensor parallelism the unsharded model's,
  // on every rank: each shard's per-element state (momentum, exp_avg, exp_avg_sq) gathered
  // over the tensor-parallel group (collective there); with ZeRO over the replicas, first
  // consolidated over them, on the first replica (None on the others); loading takes this
  // rank's slice (and with ZeRO its pieces).
  c10::IValue optimizer_state_dict();
  // Without a shard: loads a whole model's optimizer state (a pipeline stage takes its
  // parameters' part, tensor parallelism its slices). No collective.
  void load_optimizer_state_dict(const c10::IValue& state);
  // This rank's own state of the model by name, the tensors themselves (writing into them
  // changes the model): every parameter and buffer of the module; under FSDP, whose module
  // parameters have no memory between steps, this rank's 1-D piece of each trained parameter
  // (a parameter outside its shard is absent), the frozen parameters and the buffers. What a
  // per-rank average of the weights is kept over (HOOKS.EMA_MODEL). No collective.
  virtual torch::OrderedDict<std::string, at::Tensor> local_state() const;
  // Changes one parameter's whole value by name on every rank alike, between steps (SwAV's
  // prototypes normalised after the step): in place in the module, or under FSDP through
  // its shards (FullyShardedDataParallel::update_full_parameter: collective there). Under
  // Apex O2/O3 it changes the module's low-precision copy, not the float32 master (which
  // the next step copies back). Throws largo::Error for a name the module does not have.
  void
  update_full_parameter(const std::string& name, const std::function<void(at::Tensor&)>& update);
  // Trained parameter name -> its full shape (to consolidate sharded optimizer state).
  std::map<std::string, std::vector<int64_t>> trained_parameter_shapes() const;

 protected:
  ParallelModel(torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
                ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision);
  // A module whose forward the mode runs itself (run_forward; the pipeline's stages).
  ParallelModel(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<DeviceMesh> mesh,
                ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision);

  // The optimizer the mode built, and the tensors of its groups (what it steps).
  void set_optimizer(std::unique_ptr<optim::Optimizer> optimizer);

  // What differs between the modes.
  virtual void before_forward() {}
  virtual at::Tensor run_forward(const at::Tensor& input);
  virtual std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync() {
    return nullptr;
  }
  virtual void reduce_gradients() {}
  // What drop_gradients() does beyond the optimizer's groups: the strategy's own pieces.
  virtual void drop_piece_gradients(const std::set<std::string>& /*names*/) {}
  // The tensors whose .grad the scaler unscales and clipping measures.
  virtual std::vector<at::Tensor> gradient_holders() const;
  virtual double clip_gradients(double max_norm, double norm_type);
  virtual std::string describe_mode() const = 0;
  // Each strategy states its dimensions' placements over the default (every parameter
  // replicated on every dimension); the "tp" dimension's are added after.
  virtual void place(StatePlacements& /*placements*/) const {}
  // The sharded strategies' pieces of the optimizer state (what optimizer_shard() gives when
  // the placements put the state in flat pieces).
  virtual std::optional<OptimizerShard> optimizer_pieces() {
    return std::nullopt;
  }

  // ---- the whole-state operation (mesh/state_dimension.h) ----
  // The state calls above are written once: this rank's state as its strategy holds it
  // (the held_ calls below, which undo flat pieces where a strategy holds them), then each
  // dimension that placements() splits (Shard) or owns (OwnedBy) made whole in turn
  // (StatePlacements::dimensions_to_gather), and the same backwards when loading.
  using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
  using Values = std::unordered_map<std::string, at::Tensor>;
  // The strategy of a mesh dimension that states Shard or OwnedBy placements: the "tp"
  // dimension, which every model holds, or what a strategy adds ("pp").
  virtual const StateDimension* state_dimension(const std::string& dimension) const;
  // Every parameter and buffer, whole along the dimensions the strategy flat-shards, as CPU
  // copies in the standard layout on `root` (others may get none): the module's. Collective
  // where the strategy gathers.
  virtual NamedTensors held_values(int root);
  // Every parameter's value, the same way on every rank: copies of the module's.
  virtual NamedTensors held_parameters();
  // Stores values (this rank's part along every other dimension) by name: into the module's
  // tensors (and O2's masters). Throws largo::Error naming a missing or misshapen entry.
  virtual void store_values(const Values& values);
  // Applies `update` to parameter `name` as the strategy holds it whole: in the module's.
  virtual void update_held(const std::string& name, const std::function<void(at::Tensor&)>& update);
  // The optimizer state of this rank's parameters, whole along the flat-sharded dimensions:
  // optimizer().state_dict(), or the strategy's pieces consolidated over "dp" on its first
  // rank (None on the others) unless a checkpoint writes them as they are (optimizer_shard()).
  // Collective when consolidating.
  virtual c10::IValue held_optimizer_state();
  // Loads such a state (each piece taken from it when the strategy steps pieces).
  virtual void load_held_optimizer_state(const c10::IValue& state);
  // The groups, by name and this rank's shape, that the held optimizer state is over.
  virtual std::vector<optim::ParamGroup> held_parameter_groups() const;
  // Trained parameter name -> the shape this rank's module holds it in (tensor
  // parallelism's slices): the optimizer's groups' shapes unless the optimizer steps pieces.
  virtual std::map<std::string, std::vector<int64_t>> local_parameter_shapes() const;
  // The module's device (where tensor parallelism's collectives run).
  at::Device module_device() const;
  virtual void measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const;

  torch::nn::AnyModule model_;
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<DeviceMesh> mesh_;
  std::shared_ptr<comm::ProcessGroup> group_;    // the mesh's world
  std::shared_ptr<comm::ProcessGroup> replicas_; // the mesh's "dp" group
  ParallelOptions options_;
  std::unique_ptr<precision::MixedPrecision> precision_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<at::Tensor> trained_parameters_; // the optimizer's groups' tensors
  std::optional<SequentialCheckpointPlan> checkpoint_plan_;
  std::optional<ActivationMemoryReport> activation_memory_report_;
  std::unique_ptr<CheckpointedSegments> checkpointing_; // installed last, removed first
  // The mesh's "tp" dimension, which every strategy composes with (the identity over one
  // "tp" rank): built from the module before a strategy flattens its parameters.
  std::unique_ptr<TensorParallelDimension> tensor_parallel_;

 private:
  // The strategies of placements().dimensions_to_gather(optimizer_state), in its order.
  std::vector<const StateDimension*> dimensions_to_gather(bool optimizer_state) const;

  friend std::unique_ptr<ParallelModel> parallelize(
      ModelToParallelize,
      std::vector<optim::ParamGroup>,
      const OptimizerFactory&,
      std::shared_ptr<DeviceMesh>,
      ParallelOptions);
};

// The checks parallelize() makes first, for a world of `world_size` ranks, so that a
// configuration can be validated before anything is built: throws OptionError for
// combinations that do not compose (ZeRO with O2's master weights, FSDP with a cast of the
// module, compute copies outside FSDP, a pipeline's checkpointed stages with zb_h1, ...).
void check_parallel_options(const ParallelOptions& options, int world_size);

// The mesh a run of `options` lays the world's `world_size` ranks on: pipeline ranks
// (pipeline.size) x data-parallel replicas x tensor-parallel shards (tensor_parallel_size).
// Throws OptionError (naming ParallelOptions::pipeline.size or tensor_parallel_size) unless
// their product divides the world.
// With data_shard(rank, mesh_dimensions(...)) it says which data a rank reads before any
// group exists.
std::vector<MeshDimension> mesh_dimensions(const ParallelOptions& options, int world_size);

// The run's mesh: `world` laid out as mesh_dimensions(options, world->world_size()) (which
// refuses sizes that do not divide the world, before any group is made; what composes with
// what is parallelize()'s check). Collective: the mesh's new_group calls (none without a
// pipeline or tensor parallelism).
std::shared_ptr<DeviceMesh>
make_device_mesh(std::shared_ptr<comm::ProcessGroup> world, const ParallelOptions& options);

// Step 0 of a run on `mesh` (make_device_mesh(world, options)): with
// options.tensor_parallel_size > 1, splits `module`'s planned layers (tensor_parallel_plan.h:
// the zoo's ViT and MLP trunks) over the mesh's "tp" group, with options.sequence_parallel;
// nothing otherwise. Call it before building the param groups. No collective.
void apply_tensor_parallel_plan(
    torch::nn::Module& module, const DeviceMesh& mesh, const ParallelOptions& options);

// Applies `options` to `model` on `mesh` (make_device_mesh(world, options), or a DeviceMesh
// of the same sizes) in the order described at the top, with `make_optimizer` building the
// optimizer over `param_groups` (or over this rank's pieces of them). Data parallelism runs
// over the mesh's "dp" group, tensor parallelism over its "tp" group (the module split there
// already, step 0), the pipeline over its "pp" group.
//
// With a pipeline (ParallelOptions::pipeline): the blocks (the same model on every rank)
// are cut into stages over the "pp" groups, DDP (or ZeRO-1) over the "dp" groups;
// `param_groups` (over the whole model) keep this rank's parameters, and the optimizer steps
// those. The other stages' blocks are emptied (their parameters and buffers become empty
// tensors, in the caller's model too), so a rank holds only its part. The returned model's
// forward_backward runs the schedule; forward() gives every rank the outputs;
// model_state_dict() and optimizer_state_dict() are the whole model's, gathered on rank 0.
//
// Throws OptionError for what cannot be honoured: combinations that do not compose (ZeRO
// with O2's master weights, FSDP with a cast of the module, a pipeline with ZeRO-2, FSDP,
// ActivationCheckpointingOptions or a cast...), a mesh of other sizes than the options', a
// module not split for the mesh's "tp" size, a pipeline over a module that is not a chain of
// blocks, blocks without a pipeline. Collective.
std::unique_ptr<ParallelModel> parallelize(
    ModelToParallelize model,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer,
    std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options);

// The same over the mesh make_device_mesh(world, options) builds: for runs whose module needs
// no step 0 (data parallelism, a pipeline). With tensor_parallel_size > 1 it throws
// OptionError: the module must be split over the mesh's "tp" group first, so build the mesh,
// apply_tensor_parallel_plan(), then parallelize over the mesh. Collective.
std::unique_ptr<ParallelModel> parallelize(
    ModelToParallelize model,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer,
    std::shared_ptr<comm::ProcessGroup> world,
    ParallelOptions options);

} // namespace largo::parallel
