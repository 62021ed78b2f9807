// A multi-layer perceptron trunk for images: flatten, then Linear + ReLU layers.
// The simplest model, for tests and for checking the training machinery.
//
// Trunk blocks:
//   block 0      flatten [b, c, h, w] -> [b, c*h*w], Linear -> hidden_dims[0], ReLU (+dropout)
//   block i      Linear hidden_dims[i-1] -> hidden_dims[i], ReLU (+dropout)
// With no hidden layers the trunk is one block that only flattens.
#pragma once

#include <largo/models/trunk_head_model.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <vector>

namespace largo::models {

struct MlpOptions {
  std::vector<int64_t> hidden_dims{512, 256}; // MODEL.TRUNK.MLP.HIDDEN_DIMS
  double dropout = 0.0;                       // after each ReLU
};

// Throws ConfigError for a non-positive hidden dim, a dropout outside [0, 1), or a
// non-positive input size.
Trunk build_mlp_trunk(const MlpOptions& options, int64_t in_channels, int64_t image_size);

// One layer: [b, ...] -> (flatten when `flatten_input`) -> Linear -> ReLU -> dropout.
// With out_features == 0 it only flattens.
class MlpBlockImpl : public torch::nn::Module {
 public:
  MlpBlockImpl(int64_t in_features, int64_t out_features, bool flatten_input, double dropout);
  at::Tensor forward(at::Tensor x);

  // The hook of tensor parallelism (parallel/tensor_parallel/tensor_parallel_plan.h): replaces the Linear child
  // (same name, so parameter names stay) by `parallel`, built from it, which maps the block's
  // input (or this rank's share of it) to its output (or this rank's share). The models layer
  // knows no process groups, hence a module of any type.
  void use_tensor_parallel_linear(torch::nn::AnyModule parallel);

 private:
  torch::nn::Linear linear_{nullptr};
  torch::nn::AnyModule parallel_linear_; // empty unless tensor-parallel
  bool flatten_input_;
  double dropout_;
};
TORCH_MODULE(MlpBlock);

} // namespace largo::models
