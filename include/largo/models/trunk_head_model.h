// The shape every Largo model has: an ordered trunk of blocks, then a head.
//
// Activation checkpointing, FSDP wrapping and pipeline stages all cut a model at block
// boundaries, so the trunk is a flat list of blocks, each mapping one tensor to one tensor:
//   images [batch, channels, h, w] -> block 0 -> ... -> block n-1 -> features [batch, dim]
//   features -> head -> logits [batch, num_classes]
// The last trunk block ends with pooling/flattening, so the trunk's output is always
// [batch, trunk_output_dim()]. Parameters are named "trunk.<block>.*" and "head.*"
// (the optimizer's param groups rely on the "head." prefix).
#pragma once

#include <largo/models/module_swap.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>

namespace largo::models {

// What a trunk builder returns: the ordered blocks and the width of their output.
struct Trunk {
  torch::nn::Sequential blocks;
  int64_t output_dim = 0; // the trunk maps [batch, ...] to [batch, output_dim]
};

class TrunkHeadModelImpl : public torch::nn::Module, public SwappableChildren {
 public:
  // `head` maps [batch, trunk.output_dim] to the model's output.
  TrunkHeadModelImpl(Trunk trunk, torch::nn::Sequential head);

  // images [batch, channels, h, w] -> head output [batch, num_classes]
  at::Tensor forward(at::Tensor x);
  // images -> features [batch, trunk_output_dim()]
  at::Tensor forward_trunk(at::Tensor x);
  // Runs trunk blocks [begin, end) on x (the output of block begin-1, or the images when
  // begin is 0). forward_trunk_range(forward_trunk_range(x, 0, k), k, n) == forward_trunk(x).
  // Throws largo::Error unless 0 <= begin <= end <= num_trunk_blocks().
  at::Tensor forward_trunk_range(at::Tensor x, int64_t begin, int64_t end);
  // features [batch, trunk_output_dim()] -> head output
  at::Tensor forward_head(at::Tensor features);

  int64_t num_trunk_blocks() const;
  // Block `index` of the trunk (registered as "trunk.<index>"); throws largo::Error when out
  // of range.
  std::shared_ptr<torch::nn::Module> trunk_block(int64_t index) const;
  int64_t trunk_output_dim() const {
    return trunk_output_dim_;
  }

  const torch::nn::Sequential& trunk() const {
    return trunk_;
  }
  const torch::nn::Sequential& head() const {
    return head_;
  }
  // "trunk" or "head", replaced by a Sequential (models/module_swap.h).
  void swap_child(const std::string& name, const SwappedModule& replacement) override;

 private:
  torch::nn::Sequential trunk_;
  torch::nn::Sequential head_;
  int64_t trunk_output_dim_;
};

TORCH_MODULE(TrunkHeadModel);

} // namespace largo::models
