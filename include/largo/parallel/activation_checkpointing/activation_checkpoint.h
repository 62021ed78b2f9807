// Activation checkpointing: run a segment of a model without keeping its activations, and
// recompute them in the backward pass. libtorch has no checkpoint() in C++; this is Largo's.
//
// checkpoint(function, inputs, options) runs `function` under no-grad and keeps only its
// inputs. When the backward pass reaches it, it recomputes `function` with grad enabled —
// with the CPU (and CUDA) RNG state of the forward, so dropout draws the same masks, and the
// same autocast state — and back-propagates through the recomputed segment. Tensors the
// segment updates in place (BatchNorm running statistics: options.buffers) are restored
// after the recompute, so they are updated once per forward, as without checkpointing.
//
// Composition with DDP and ZeRO (why the segment's parameters are explicit inputs):
// DistributedDataParallel and ZeRO-2 reduce gradients from post-hooks on each parameter's
// grad accumulator and need each hook to fire exactly once per parameter per backward. So
// the parameters are differentiable inputs of the checkpoint's autograd node. Its backward
// recomputes the segment and calls torch::autograd::grad with respect to the (detached)
// segment inputs and the parameters — which computes their gradients without accumulating
// them or running their accumulators — and returns the parameter gradients as the node's
// input gradients. The outer backward then accumulates them into .grad through each
// parameter's own AccumulateGrad node: once, in the normal outer backward, so each
// grad-accumulator post-hook fires once (no "marked ready twice"), and the first segment
// works even though its input (the images) does not require grad.
// The parameter list must be complete: the backward walks the recomputed graph and throws
// largo::Error if it reaches a leaf that requires grad but is neither an input nor listed.
// (libtorch >= 2.x runs tensor pre-hooks registered with Tensor::register_hook on a leaf
// when torch::autograd::grad captures its gradient, so such hooks on a segment's
// parameters also fire during the recompute; grad-accumulator post-hooks do not.)
//
// Contract for ZeRO-3 / FSDP (parameters gathered before a unit's forward): `function` must
// run the segment's modules through their normal forward path — the recompute calls the
// same `function`, so each unit's pre-forward step gathers its parameters again. The
// parameters passed here are taken when checkpoint() is called (the module overloads collect
// them from the modules then), so they must be the leaves the forward really uses (for FSDP:
// the flat parameter, registered as a parameter of the wrapping module); and a unit's
// gathered parameters must stay valid until the outer backward has accumulated the gradients
// this node returns (FSDP frees them from the grad-accumulator post-hook, which fires after).
//
// Limits: the backward cannot build a graph of its own (create_graph / double backward is
// refused with a clear error); `function` must not modify its inputs in place (caught by
// autograd's version check at backward); it must be deterministic apart from RNG draws.
//
// No collectives.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace largo::parallel {

// A segment: inputs -> outputs. It must compute the same outputs when called again with
// the same inputs, RNG state and autocast state.
using SegmentFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

struct CheckpointOptions {
  // The leaves `function` uses that need gradients, besides its inputs: normally every
  // parameter of the segment's modules. Parameters that do not require grad are ignored.
  TORCH_ARG(std::vector<at::Tensor>, parameters) = {};
  // Tensors the segment's forward updates in place (BatchNorm running_mean, running_var,
  // num_batches_tracked): copied before the recompute and restored after it.
  TORCH_ARG(std::vector<at::Tensor>, buffers) = {};
  // Stash the RNG state of the CPU and of every CUDA device the inputs or parameters live on
  // at forward and replay it in the recompute, so dropout recomputes identically. The
  // caller's RNG state is left as if the recompute had not drawn anything.
  TORCH_ARG(bool, preserve_rng_state) = true;
};

// Runs `function(inputs)` as a checkpointed segment (see the top of this file) and returns
// its outputs. Outputs of floating types are differentiable. Without grad mode, or when
// neither an input nor a parameter requires grad, it simply calls `function`.
std::vector<at::Tensor> checkpoint(
    SegmentFunction function, std::vector<at::Tensor> inputs, CheckpointOptions options = {});

// 0 outside a checkpointed segment's backward; inside it (its recompute and the
// back-propagation through the recomputed graph, on this thread) an id unique to that
// recompute. FullyShardedDataParallel uses it to keep its prefetches inside the segment
// being recomputed.
int64_t current_recompute_id();

// A segment made of `modules`: their parameters and buffers (collected recursively now, at
// call time) become options.parameters and options.buffers.
std::vector<at::Tensor> checkpoint_modules(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
    SegmentFunction function,
    std::vector<at::Tensor> inputs,
    bool preserve_rng_state = true);

// Where torch.utils.checkpoint.checkpoint_sequential cuts `num_blocks` blocks into
// `num_segments`: every segment has num_blocks / num_segments blocks and the last one takes
// the remainder. Returns the boundaries {0, b_1, ..., num_blocks}; segment i is blocks
// [b_i, b_{i+1}). Throws largo::Error unless 1 <= num_segments <= num_blocks.
std::vector<int64_t> segment_boundaries_by_count(int64_t num_blocks, int64_t num_segments);

// Whether `boundaries` cut `num_blocks` blocks into non-empty segments:
// 0 = b_0 < b_1 < ... < b_n = num_blocks, n >= 1 (activation checkpointing's segments and a
// pipeline's stages alike).
bool is_segmentation(const std::vector<int64_t>& boundaries, int64_t num_blocks);
// Throws largo::Error "segment boundaries [...] do not cut <what> into non-empty segments"
// unless is_segmentation(boundaries, num_blocks).
void check_segmentation(
    const std::vector<int64_t>& boundaries, int64_t num_blocks, const std::string& what);

// Cuts blocks with the given costs into `num_segments` contiguous, non-empty segments so
// that the largest segment cost is as small as possible (ties: the earliest such cut).
// With activation bytes as the cost this minimizes the peak of a checkpointed backward,
// which holds one segment's activations at a time. Same boundaries format as above.
std::vector<int64_t>
balanced_segment_boundaries(const std::vector<double>& block_costs, int64_t num_segments);

// Runs `sequential` on `input`, cut at `boundaries` (as returned above); every segment but
// the last is checkpointed, as torch.utils.checkpoint.checkpoint_sequential does.
at::Tensor checkpoint_sequential(
    const torch::nn::Sequential& sequential,
    const std::vector<int64_t>& boundaries,
    at::Tensor input,
    bool preserve_rng_state = true);

// The same with PyTorch's cut into `num_segments` (segment_boundaries_by_count).
at::Tensor checkpoint_sequential(
    const torch::nn::Sequential& sequential,
    int64_t num_segments,
    at::Tensor input,
    bool preserve_rng_state = true);

} // namespace largo::parallel
