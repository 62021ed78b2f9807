// Tensor parallelism applied to Largo's model zoo (as PyTorch's parallelize_module with a
// ColwiseParallel / RowwiseParallel plan): which Linear layers of a model are split over the
// ranks of a tensor-parallel group, and the gradient norm such a model needs.
//
// The plans (layers from tensor_parallel.h; T = the group's size):
// - ViT encoder layers (models::VitEncoderLayer): attention's qkv column-parallel with q, k
//   and v each split by heads (num_output_blocks 3), so rank r computes heads
//   [r * H/T, (r + 1) * H/T) whole; proj row-parallel. The MLP: fc1 column-, fc2
//   row-parallel. Per layer and step: two all-reduces in forward (after proj and fc2), two in
//   backward (the gradients of the inputs of qkv and fc1). Needs num_heads, hidden_dim and
//   mlp_dim divisible by T.
// - The MLP trunk (models::MlpBlock, Linear + ReLU): consecutive blocks of a Sequential in
//   pairs, the first column-, the second row-parallel (ReLU is elementwise, so it runs on each
//   rank's share); an odd last block stays replicated. Needs the first block's width
//   divisible by T.
// Everything else stays replicated (the same on every rank): embeddings, positions, the class
// token, LayerNorms, Linear heads, layers of other types. With the same input on every rank
// the replicated parameters then also get the same gradient on every rank (under sequence
// parallelism those used on each rank's tokens have theirs summed over the ranks), so they
// stay equal after any deterministic optimizer step.
//
// Sequence parallelism (TensorParallelPlanOptions::sequence_parallel; tensor_parallel.h): in
// ViT layers, the norms, dropouts and residual stream hold only each rank's tokens; a run of
// consecutive encoder layers scatters the tokens before its first layer and gathers them after
// its last (the final norm and the head see every token), qkv and fc1 gather them, proj and
// fc2 reduce-scatter, and the norms' weights and biases and the row layers' biases get their
// gradients summed over the ranks (each rank's covers its tokens). The MLP trunk has no
// tokens: sequence parallelism is refused for it.
//
// Randomness: the tensor-parallel ranks of a replica must be seeded alike, so that dropout on
// replicated activations drops the same elements; dropout on what only one rank holds (its
// heads' attention weights, its share of fc1's output, under sequence parallelism its tokens)
// draws from that rank's own stream (core/shard_random_stream.h), so the ranks' masks differ as
// the single-process model's would over those parts, and the shared stream stays the same on
// every rank. Dropout > 0 is then the single-process model's distribution, not its draws.
//
// Collectives: apply_tensor_parallel issues none (each rank slices its part of the weights it
// already has, so every rank must have built the model identically, e.g. with the same seed);
// the sharded layers issue theirs in forward and backward (tensor_parallel.h), and under
// sequence parallelism the first and last layer of a run one all-gather each (in forward and
// backward respectively), and each norm weight, norm bias and row bias one all-reduce of its
// gradient in backward;
// tensor_parallel_grad_norm and clip_tensor_parallel_grad_norm_ issue one all-reduce;
// planned_tensor_parallel_shards and tensor_parallel_parameter_sizes none (they need no group:
// what `largo estimate` sizes, mesh_memory_estimate.h).
#pragma once

#include <largo/comm/process_group.h>
#include <largo/parallel/estimate/memory_estimate.h>
#include <largo/parallel/tensor_parallel/tensor_parallel.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace largo::parallel {

struct TensorParallelPlanOptions {
  // Split the ViT layers' tokens between their column- and row-parallel layers too (above):
  // those activations per rank cut by T. Needs ViT encoder layers in a Sequential right after
  // their models::VitPatchEmbedding, with at least T tokens.
  bool sequence_parallel = false;
};

// Checks that `model` has a tensor-parallel plan for a group of `tp_size` ranks, without
// changing it. Throws OptionError naming the module, the size and what was expected when a
// size does not divide (heads % T, hidden % T, mlp_dim % T, an MLP width % T), when no layer
// of the model has a plan, when it is already tensor-parallel, or when sequence parallelism
// cannot split its tokens (no ViT layers, fewer tokens than ranks, no patch embedding before).
void check_tensor_parallel_plan(
    torch::nn::Module& model, int64_t tp_size, const TensorParallelPlanOptions& options = {});

// What apply_tensor_parallel(model, group of `tp_size` ranks) would split, without a group
// or any change to `model`: the full names of the parameters it shards and how
// (tensor_parallel_sharded_parameters() of the sharded model). Checks as
// check_tensor_parallel_plan.
std::map<std::string, TensorParallelShardSpec>
planned_tensor_parallel_shards(torch::nn::Module& model, int64_t tp_size);

// `sizes` (parameter_sizes() of `model`) as every rank of a group of `tp_size` holds them once
// apply_tensor_parallel has run: the planned shards' numel / tp_size (the plan's splits are
// even, so every rank holds the same), the replicated parameters whole. Checks as
// check_tensor_parallel_plan; throws c10::Error when `sizes` miss a planned parameter.
std::vector<ParameterSize> tensor_parallel_parameter_sizes(
    torch::nn::Module& model, std::vector<ParameterSize> sizes, int64_t tp_size);

// Replaces the planned Linear layers of `model` by this rank's shards of them, in place
// (parameter names are unchanged; the sharded ones hold this rank's slice). Checks first, as
// check_tensor_parallel_plan. Returns the names of the modules it sharded: the ViT encoder
// layers, then the MLP blocks, each in model order.
// Build the optimizer over model.parameters() after this call.
std::vector<std::string> apply_tensor_parallel(
    torch::nn::Module& model,
    std::shared_ptr<comm::ProcessGroup> tp_group,
    const TensorParallelPlanOptions& options = {});

// The 2-norm of all of `model`'s gradients as the unsharded model would have them: the
// squared norms of the shards summed over the group, the replicated parameters' counted once.
// A collective (one all-reduce) on tp_group; parameters without a gradient count as zero.
double tensor_parallel_grad_norm(const torch::nn::Module& model, comm::ProcessGroup& tp_group);

// torch.nn.utils.clip_grad_norm_ for a tensor-parallel model: scales every gradient by
// max_norm / (norm + 1e-6) when that is below 1. Returns the norm before clipping. One
// all-reduce.
double clip_tensor_parallel_grad_norm_(
    torch::nn::Module& model, double max_norm, comm::ProcessGroup& tp_group);

} // namespace largo::parallel
