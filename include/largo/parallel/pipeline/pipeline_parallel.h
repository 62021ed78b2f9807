// Pipeline (model) parallelism: a sequential model cut into stages, one run of consecutive
// blocks per pipeline rank (V runs per rank for the interleaved schedule), each micro-batch's
// activations sent forward and their gradients backward between ranks, in the order a
// schedule (pipeline_schedule.h: gpipe, 1f1b, interleaved_1f1b, zb_h1) gives; optionally
// composed with data parallelism over each stage's replicas (the "pp" and "dp" groups of
// device_mesh.h).
//
// A step does not split into "forward" and "backward" calls: the schedule interleaves the two
// across micro-batches. So the entry point is forward_backward(inputs, targets, loss): it
// splits the batch into M micro-batches along dimension 0 (sizes differ by at most one),
// runs this rank's list of the schedule and returns the batch's mean loss. Every rank
// passes the same batch (or undefined tensors where unused: inputs are read by the first
// stage only, targets by the last). The loss of micro-batch i, loss(output_i, target_i), is
// weighted by its share of the batch (size_i / batch) before the backward, so the
// gradients are those of the whole batch's mean loss, as one process computes them; the
// caller's `scale_loss` (a GradScaler's scale, a division for gradient accumulation) is
// applied to each weighted loss before its backward.
//
// Shapes: activations are batch-first. The first time a step sends across a stage
// boundary it sends a small header (batch size, dtype, shape) before the activation, so the
// receiver can allocate; every other message of the step is raw data. Gradients have their
// activation's shape.
//
// Composition (what to call, in order, per optimizer step):
//   zero_grad (the optimizer's) -> forward_backward (x accumulation steps; grads add up) ->
//   reduce_gradients (data-parallel average, once) -> GradScaler unscale_ with
//   found_inf_reducer() -> clip_grad_norm -> optimizer step (LARC needs nothing more: each
//   parameter lives whole on one stage) -> GradScaler update.
// Autocast: wrap forward_backward in the precision policy's AutocastGuard like a forward;
// backward passes inside it run with autocast switched off, as PyTorch recommends.
// Activation checkpointing: checkpoint_stages recomputes each stage's forward in its
// backward, so only the stage inputs of the micro-batches in flight stay alive (not with
// zb_h1, whose weight pass would recompute a second time).
// BatchNorm normalises each micro-batch with its own statistics and updates the running
// statistics once per micro-batch: the same as one process running the micro-batches as
// gradient-accumulation steps, not as one process on the whole batch.
// Data parallelism: DistributedDataParallel in manual-reduction mode over the stage's
// replicas (it broadcasts replica 0's parameters at construction); ZeRO-1 composes by
// building a ShardedOptimizer over data_parallel_group() from this rank's parameters. ZeRO-2
// and FSDP do not compose (they reduce inside every backward).
//
// Collectives and their order: the constructor (DDP's broadcast over the replicas; with
// balance = time, two broadcasts of the measured block times); forward_backward and
// forward (point to point over the pipeline, then a broadcast of the loss / outputs over it);
// reduce_gradients (over the replicas); clip_grad_norm, norm_reducer(), found_inf_reducer()
// (over the pipeline, and the replicas where stated); full_state_dict (over the pipeline).
// Every rank of a group must make the same calls in the same order. A stage that dies makes
// its neighbours' waits fail with CommError naming it (after the process group's timeout at
// the latest; the launcher stops the job on the dead process itself).
//
// Backends: tested on Gloo, where messages pair by tag. The CUDA/NCCL path compiles (tensors
// move on the stages' device) but has not run: NCCL pairs messages by issue order, and the
// executor posts a step's first activation receive per boundary only once its header has
// arrived, and a gradient receive only once the forward it belongs to has run, which can
// reorder receives from one peer relative to the schedule's list (interleaved_1f1b on 2
// ranks, where both directions of traffic share a peer).
#pragma once

#include <largo/comm/process_group.h>
#include <largo/optim/tensor_norms.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/pipeline/pipeline_schedule.h>
#include <largo/parallel/pipeline/pipeline_stages.h>
#include <largo/precision/grad_scaler.h>

#include <ATen/core/Dict.h>
#include <torch/arg.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace largo::parallel {

struct PipelineParallelOptions {
  TORCH_ARG(PipelineScheduleKind, schedule) = PipelineScheduleKind::kOneFOneB; // SCHEDULE
  TORCH_ARG(int, num_microbatches) = 4;                                        // NUM_MICROBATCHES
  TORCH_ARG(int, virtual_stages) = 1; // VIRTUAL_STAGES: stages per rank (interleaved_1f1b)
  // BOUNDARIES: pipeline size * virtual_stages + 1 block indices, stage i = blocks
  // [b_i, b_{i+1}); empty: cut by `balance`.
  TORCH_ARG(std::vector<int64_t>, boundaries) = {};
  TORCH_ARG(StageBalance, balance) = StageBalance::kParameters; // BALANCE
  // balance = time: a micro-batch of model inputs to time the blocks on (on pipeline rank 0;
  // the times are broadcast so every rank cuts alike).
  TORCH_ARG(at::Tensor, balance_sample) = {};
  TORCH_ARG(bool, checkpoint_stages) = false; // CHECKPOINT_STAGES: recompute in backward
  // Options of the DistributedDataParallel over the replicas (manual_reduction is forced).
  TORCH_ARG(DistributedDataParallelOptions, data_parallel) = {};
};

// The rules of PipelineParallelOptions that hold whatever the model and the groups, for a
// caller that validates a configuration before building anything (check_parallel_options):
// throws OptionError naming PipelineParallelOptions::checkpoint_stages with the zb_h1
// schedule (a checkpointed stage is one autograd node, so zb_h1's weight pass would
// recompute it a second time). PipelineParallel's constructor applies them too.
void check_pipeline_parallel_options(const PipelineParallelOptions& options);

class PipelineParallel {
 public:
  // output [micro-batch, ...], target [micro-batch, ...] -> a 0-d loss (mean over the
  // micro-batch).
  using LossFunction =
      std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
  // A weighted micro-batch loss -> what backward starts from (e.g. scaler.scale(loss)).
  using LossScaling = std::function<at::Tensor(const at::Tensor& loss)>;

  // `blocks`: the whole model's blocks (pipeline_blocks()); every rank must pass the same
  // model (built with the same seed). This rank keeps its stages' blocks; drop the rest of
  // the model to free its memory. `pipeline_group`: rank r is stage r (and r + S, ... with
  // virtual stages); `data_parallel_group`: this stage's replicas (null or of size 1: none).
  // Throws ConfigError for a shape the schedule does not take, bad boundaries, fewer blocks
  // than stages, balance = time without a sample, and OptionError for what
  // check_pipeline_parallel_options refuses (checkpoint_stages with zb_h1).
  PipelineParallel(
      std::vector<PipelineBlock> blocks,
      std::shared_ptr<comm::ProcessGroup> pipeline_group,
      std::shared_ptr<comm::ProcessGroup> data_parallel_group = nullptr,
      PipelineParallelOptions options = {});
  ~PipelineParallel();
  PipelineParallel(const PipelineParallel&) = delete;
  PipelineParallel& operator=(const PipelineParallel&) = delete;

  // One step's forward and backward through the pipeline (see the top of this file).
  // Returns the batch's mean loss (unscaled), the same on every pipeline rank. Gradients add
  // into .grad. Throws ConfigError for a batch smaller than the number of micro-batches or
  // inputs/targets missing where needed.
  double forward_backward(
      const at::Tensor& inputs,
      const at::Tensor& targets,
      const LossFunction& loss,
      const LossScaling& scale_loss = {});

  // Forward only, without gradients (evaluation): the model's outputs for the whole batch
  // on the last stage's rank. Other ranks get an undefined tensor, or with
  // broadcast_outputs the same outputs (one broadcast over the pipeline).
  at::Tensor forward(const at::Tensor& inputs, bool broadcast_outputs = false);

  // Averages this stage's gradients over its replicas (no-op without them). Once per
  // optimizer step, after the last forward_backward of the step. Collective (replicas).
  void reduce_gradients();

  // Global-norm clipping (optim/grad_clipping.h) of this rank's gradients, the partial
  // norms summed (or maximised) over the pipeline. Returns the total norm. Collective.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);
  // Completes partial norms over the pipeline, and over the replicas too when their
  // gradients are shards (ZeRO-1's pieces). For clip_grad_norm_of_pieces and the like.
  optim::PartialNormReducer norm_reducer(bool over_replicas = false) const;
  // found_inf agreed by every rank of the pipeline and of the replicas (the whole mesh).
  precision::FoundInfReducer found_inf_reducer() const;

  // This rank's part of the model: its stages' blocks, named as in the full model.
  const std::shared_ptr<torch::nn::Module>& module() const;
  std::vector<at::Tensor> parameters() const;
  int64_t parameter_bytes() const;

  // This rank's parameters and buffers by their full-model names (shared storage).
  c10::impl::GenericDict state_dict() const;
  // Copies this rank's entries from `state` — this rank's part, another layout's part that
  // covers them, or the full model's — and ignores the others. Throws CheckpointError
  // naming the entries it lacks or whose shape differs, before changing anything.
  void load_state_dict(const c10::impl::GenericDict& state);
  // The full model's parameters and buffers, gathered on pipeline rank 0 (an empty dict on
  // the others), in the full model's order: copies, which training does not change.
  // Collective (pipeline).
  c10::impl::GenericDict full_state_dict() const;
  // The same from the part each rank gives instead of its state_dict() (e.g. its tensor-
  // parallel shards gathered whole first): every parameter, which some stage must give
  // (throws largo::Error naming one none gives), and the buffers the parts give (none when
  // the parts are parameters only). Collective (pipeline).
  c10::impl::GenericDict full_state_dict(const c10::impl::GenericDict& own_part) const;
  // Every parameter and buffer name of the full model, in its order.
  const std::vector<std::string>& full_model_names() const;
  // The full model's parameter names in order (to merge optimizer states, pipeline_checkpoint.h).
  const std::vector<std::string>& full_parameter_names() const;

  int pipeline_rank() const;
  int pipeline_size() const;
  // This rank's stages (global indices), and every stage's first block: stage i is blocks
  // [boundaries()[i], boundaries()[i + 1]).
  std::vector<int> stages() const;
  const std::vector<int64_t>& boundaries() const;
  const PipelineShape& shape() const;
  const PipelineParallelOptions& options() const;
  comm::ProcessGroup& pipeline_group() const;
  // Null without replicas.
  const std::shared_ptr<comm::ProcessGroup>& data_parallel_group() const;

  // Wall time of the last forward_backward's schedule (without the loss broadcast) and the
  // part of it this rank spent computing: 1 - busy / step is its measured bubble.
  struct StepTimes {
    double step_seconds = 0.0;
    double busy_seconds = 0.0;
  };
  StepTimes last_step_times() const;

  // One line: schedule, micro-batches, stages and their blocks, this rank's place.
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace largo::parallel
