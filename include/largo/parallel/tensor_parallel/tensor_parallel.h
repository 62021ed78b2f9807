// Tensor parallelism's building blocks (Megatron-LM, Shoeybi et al. 2019; PyTorch's
// ColwiseParallel / RowwiseParallel): Linear layers whose weight is split over the ranks of a
// tensor-parallel group, the autograd collectives between them, and the arithmetic of which
// slice of a full parameter a rank holds. The plans that apply them to Largo's models are in
// tensor_parallel_plan.h.
//
// A column-parallel Linear holds rows [r * out/T, (r + 1) * out/T) of the full [out, in]
// weight (and of the bias) on rank r of T: given the full input it computes this rank's
// out/T output features. A row-parallel Linear holds columns [r * in/T, (r + 1) * in/T) and
// takes exactly those input features (a column-parallel layer's output, after an elementwise
// activation); the ranks' partial products are summed by an all-reduce and the full bias,
// replicated, is added once after it. Column then row is the Megatron MLP (and attention):
// one all-reduce in forward (the row layer's) and one in backward (the column layer's input
// gradient), and no communication between the two layers.
//
// Both are built FROM a full torch::nn::Linear by slicing this rank's part, so a model built
// with the same seed on every rank and then sharded computes what the unsharded model did.
// full_parameter() gives the full tensors back (an all-gather) for checkpoints.
//
// Sequence parallelism (Korthikanti et al. 2022, Megatron-LM's sequence_parallel): between a
// row- and the next column-parallel layer every rank would otherwise hold the same whole
// activations (LayerNorm, dropout, the residual stream). Split along the tokens instead (dim
// -2, see SequenceShard), the row layer reduce-scatters its partial sums to each rank's tokens
// instead of all-reducing them, and the column layer all-gathers the tokens before its
// product: the same bytes moved as the all-reduce, and those activations cut by T.
//
// Collectives, on the tensor-parallel group, which every rank of it must issue in the same
// order (c10d's contract, comm/process_group.h):
// - ColumnParallelLinear: forward none (with gather_output: one all-gather of the output;
//   with a sequence_length: one all-gather of the input); backward one all-reduce of the
//   input's gradient (with a sequence_length: an all-gather of the input and a
//   reduce-scatter of its gradient).
// - RowParallelLinear: forward one all-reduce of the output (with scatter_sequence: one
//   reduce-scatter); backward none (with scatter_sequence: one all-gather of the output's
//   gradient and one all-reduce of the bias's).
// - full_parameter() / full_parameters(): one all-gather per sharded parameter, in
//   named_parameters() order.
// With a group of one rank every collective is the identity. The group must outlive every
// backward through these layers (the layers keep it alive).
#pragma once

#include <largo/comm/process_group.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace largo::parallel {

// ---- autograd collectives ---------------------------------------------------------------
// Forward the identity, backward an all-reduce (sum) of the gradient: where a replicated
// activation enters a column-parallel layer, each rank's gradient covers only its columns.
at::Tensor copy_to_tensor_parallel_region(const at::Tensor& input, comm::ProcessGroup& group);
// Forward an all-reduce (sum), backward the identity: the row-parallel layer's partial sums;
// the output (and so its gradient) is then the same on every rank.
at::Tensor reduce_from_tensor_parallel_region(const at::Tensor& input, comm::ProcessGroup& group);
// Forward an all-gather along the last dim ([..., n] -> [..., T * n], rank order), backward
// this rank's slice of the gradient (which is the full gradient on every rank, since what
// follows the gather is replicated).
at::Tensor gather_from_tensor_parallel_region(const at::Tensor& input, comm::ProcessGroup& group);

// ---- sequence parallelism ------------------------------------------------------------------
// Which tokens of a sequence of `length` rank r of T holds: [r * c, min((r + 1) * c, length)),
// c = ceil(length / T), so the last ranks hold fewer when T does not divide the length (a
// ViT's 197 tokens) and a rank may hold none (length < T).
struct SequenceShard {
  int64_t begin = 0;
  int64_t size = 0;
};
SequenceShard sequence_shard_of(int64_t length, int rank, int world_size);

// Forward this rank's tokens (dim -2) of the full sequence, the same on every rank; backward
// an all-gather of the tokens' gradients.
at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& input, comm::ProcessGroup& group);
// Forward an all-gather of every rank's tokens (dim -2) into the full sequence of `length`,
// for replicated layers after it; backward this rank's tokens of the gradient (the same on
// every rank). A column-parallel layer gathers its input itself (ColumnParallelLinearOptions::
// sequence_length), with a reduce-scatter of the partial gradients in backward.
at::Tensor gather_from_sequence_parallel_region(
    const at::Tensor& input, comm::ProcessGroup& group, int64_t length);
// Forward the sum over ranks of the full-sequence partial sums, of which each rank keeps its
// tokens (a reduce-scatter along dim -2); backward an all-gather of the tokens' gradients.
at::Tensor
reduce_scatter_to_sequence_parallel_region(const at::Tensor& input, comm::ProcessGroup& group);

// ---- which slice a rank holds ---------------------------------------------------------------
// How a parameter is split over a tensor-parallel group of T ranks: dimension `dim` is read as
// `num_blocks` equal consecutive blocks, and each block is cut into T equal parts; rank r holds
// part r of every block, concatenated. num_blocks = 1 is a plain split; the fused qkv
// projection, whose output is [q of all heads | k | v], uses 3 so that each rank holds the q,
// k and v of its own heads.
struct TensorParallelShardSpec {
  int64_t dim = 0;
  int64_t num_blocks = 1;
};

// Rank `rank`'s slice of `full` (a copy, contiguous). Throws OptionError when the size of
// dim is not a multiple of num_blocks * world_size.
at::Tensor shard_of(const at::Tensor& full, TensorParallelShardSpec spec, int rank, int world_size);
// The inverse: every rank's `local` slice gathered into the full tensor. A collective (one
// all-gather) on `group`.
at::Tensor
unshard(const at::Tensor& local, TensorParallelShardSpec spec, comm::ProcessGroup& group);

// A module some of whose own parameters (not its children's) are tensor-parallel shards.
class TensorParallelModule {
 public:
  virtual ~TensorParallelModule() = default;
  // Local parameter name ("weight", "bias") -> how it is split. Parameters not named are
  // replicated: the same on every rank of the group.
  virtual std::map<std::string, TensorParallelShardSpec> sharded_parameters() const = 0;
  // The number of ranks the parameters are split over (what parallelize() checks
  // ParallelOptions::tensor_parallel_size against).
  virtual int64_t tensor_parallel_size() const = 0;
  // Whether the layer takes or gives only this rank's tokens (sequence parallelism).
  virtual bool splits_sequence() const {
    return false;
  }
};

struct ColumnParallelLinearOptions {
  // All-gather the output, so that every rank gets all `out` features (a layer whose consumer
  // needs the full width); false leaves each rank with its out/T features, for a row-parallel
  // layer next.
  bool gather_output = false;
  // The output features as this many equal blocks, each split over the ranks (3 for a fused
  // qkv projection; TensorParallelShardSpec). gather_output needs 1.
  int64_t num_output_blocks = 1;
  // Sequence parallelism: > 0, the input holds only this rank's tokens (dim -2, SequenceShard)
  // of a sequence of this many, which are all-gathered before the product (and again in
  // backward, where the input's gradient is reduce-scattered back to them: only this rank's
  // tokens are kept for backward). 0: the input is whole on every rank.
  int64_t sequence_length = 0;
};

struct RowParallelLinearOptions {
  // Sequence parallelism: reduce-scatter the output to this rank's tokens (dim -2,
  // SequenceShard) instead of all-reducing it, and add the bias to those tokens (its gradient
  // is then summed over the ranks, each having seen its tokens). false: every rank gets the
  // whole output.
  bool scatter_sequence = false;
};

// [..., in] (the same on every rank; with a sequence_length this rank's tokens of it) ->
// [..., out/T] (or [..., out] with gather_output).
class ColumnParallelLinearImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  // Copies this rank's rows of `full`'s weight and bias. Throws OptionError when out is not a
  // multiple of num_output_blocks * T, for gather_output with num_output_blocks > 1 or with a
  // sequence_length.
  ColumnParallelLinearImpl(
      const torch::nn::LinearImpl& full,
      std::shared_ptr<comm::ProcessGroup> tp_group,
      ColumnParallelLinearOptions options = {});
  at::Tensor forward(const at::Tensor& input);
  // This rank's product without the bias, [..., out/T], for a caller that adds `bias` itself
  // in a fused op (the ViT's fc1: kernels::bias_gelu). Throws Error with gather_output.
  at::Tensor forward_without_bias(const at::Tensor& input);
  std::map<std::string, TensorParallelShardSpec> sharded_parameters() const override;
  int64_t tensor_parallel_size() const override {
    return tp_group_->world_size();
  }
  bool splits_sequence() const override {
    return options_.sequence_length > 0;
  }

  at::Tensor weight; // [out/T, in]
  at::Tensor bias;   // [out/T], undefined without bias

 private:
  // This rank's input @ weight^T (+ with_bias, when defined), before any gather.
  at::Tensor local_product(const at::Tensor& input, const at::Tensor& with_bias);

  std::shared_ptr<comm::ProcessGroup> tp_group_;
  ColumnParallelLinearOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

// [..., in/T] (this rank's input features) -> [..., out] (the same on every rank; with
// scatter_sequence this rank's tokens of it).
class RowParallelLinearImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  // Copies this rank's columns of `full`'s weight and the whole bias. Throws OptionError when
  // in is not a multiple of T.
  RowParallelLinearImpl(
      const torch::nn::LinearImpl& full,
      std::shared_ptr<comm::ProcessGroup> tp_group,
      RowParallelLinearOptions options = {});
  at::Tensor forward(const at::Tensor& input);
  std::map<std::string, TensorParallelShardSpec> sharded_parameters() const override;
  int64_t tensor_parallel_size() const override {
    return tp_group_->world_size();
  }
  bool splits_sequence() const override {
    return options_.scatter_sequence;
  }

  at::Tensor weight; // [out, in/T]
  at::Tensor bias;   // [out], replicated; undefined without bias

 private:
  std::shared_ptr<comm::ProcessGroup> tp_group_;
  RowParallelLinearOptions options_;
};
TORCH_MODULE(RowParallelLinear);

// ---- whole models -----------------------------------------------------------------------
// Every tensor-parallel shard of `model`, by full parameter name ("trunk.1.qkv.weight").
// Parameters not listed are replicated. Not a collective.
std::map<std::string, TensorParallelShardSpec>
tensor_parallel_sharded_parameters(const torch::nn::Module& model);

// The full (unsharded) value of parameter `name` of `model`: gathered for a shard, a copy of
// the local tensor for a replicated one. A collective (one all-gather) when `name` is a shard:
// every rank must ask for the same names in the same order. Throws largo::Error for a name
// the model does not have.
at::Tensor full_parameter(
    const torch::nn::Module& model, const std::string& name, comm::ProcessGroup& tp_group);

// Every parameter of `model`, full, in named_parameters() order (what an unsharded model's
// state holds): one all-gather per shard.
std::vector<std::pair<std::string, at::Tensor>>
full_parameters(const torch::nn::Module& model, comm::ProcessGroup& tp_group);

} // namespace largo::parallel
