// The CUDA half of bias_gelu.h and add_layer_norm.h: launchers over raw device pointers,
// compiled by nvcc (transformer_fusions_cuda.cu) without libtorch's headers; bias_gelu.cpp and
// add_layer_norm.cpp check the tensors, allocate, and call these on the current stream.
//
// Both ops see their activations as a row-major [rows, channels] matrix (a [batch, tokens,
// features] tensor's rows are its tokens): the bias and the LayerNorm's parameters are
// per-channel vectors, grad_bias / grad_weight column reductions (batch_norm_relu_cuda.h's
// Activations, Reduction and plan_reduction, reused: the same chunked, fixed-order, atomic-free
// scheme), LayerNorm's statistics row reductions (one warp per row).
// Every launcher is asynchronous on `activations.stream` and returns nullptr, or the CUDA
// runtime's message for a failed launch.
#pragma once

#include "batch_norm_relu_cuda.h" // ElementType, Activations, Reduction, plan_reduction

namespace largo::kernels::cuda {

enum class GeluApproximation { kNone, kTanh }; // erf's exact GELU, or the tanh formula

// ---- bias_gelu: y = gelu(x + b), activations of activations.type --------------------------

struct BiasGeluForwardArguments {
  const void* input = nullptr; // [rows, channels]
  const float* bias = nullptr; // [channels]: the bias rounded to the activations' dtype, widened
  GeluApproximation approximation = GeluApproximation::kNone;
  void* output = nullptr; // out [rows, channels]
};
const char* bias_gelu_forward(const Activations& activations, const BiasGeluForwardArguments& args);

struct BiasGeluBackwardArguments {
  const void* grad_output = nullptr; // [rows, channels]
  const void* input = nullptr;       // [rows, channels]: the forward's (gelu' is recomputed)
  const float* bias = nullptr;       // [channels], as the forward's
  GeluApproximation approximation = GeluApproximation::kNone;
  Reduction reduction;        // plan_reduction(activations)'s
  float* workspace = nullptr; // reduction.workspace_floats(channels) floats
  void* grad_input = nullptr; // out [rows, channels], or nullptr: not needed
  float* grad_bias = nullptr; // out [channels] float32, or nullptr: not needed
};
const char*
bias_gelu_backward(const Activations& activations, const BiasGeluBackwardArguments& args);

// ---- add_layer_norm: sum = x + residual, y = layer_norm(sum) over the channels --------------

// The dtypes of one call. x and residual: equal, or one float32 and the other bfloat16 /
// float16 (then the sum is float32, as ATen promotes); output: the sum's, or float32 (what
// autocast's float32 layer_norm gives). The parameters come widened to float32.
struct AddLayerNormTypes {
  ElementType x = ElementType::kFloat32;
  ElementType residual = ElementType::kFloat32;
  ElementType sum = ElementType::kFloat32;
  ElementType output = ElementType::kFloat32;
};
// Whether the launchers take these dtypes (the combinations above).
bool add_layer_norm_supports(const AddLayerNormTypes& types);

struct AddLayerNormForwardArguments {
  AddLayerNormTypes types;
  const void* x = nullptr;        // [rows, channels]
  const void* residual = nullptr; // [rows, channels]
  const float* weight = nullptr;  // [channels]
  const float* bias = nullptr;    // [channels]
  float eps = 1e-5f;
  void* sum = nullptr;    // out [rows, channels], types.sum
  void* output = nullptr; // out [rows, channels], types.output
  float* mean = nullptr;  // out [rows]: the sum's mean per row
  float* rstd = nullptr;  // out [rows]: 1 / sqrt(biased variance + eps)
};
// `activations.type` is ignored (the types are args.types).
const char*
add_layer_norm_forward(const Activations& activations, const AddLayerNormForwardArguments& args);

struct AddLayerNormBackwardArguments {
  AddLayerNormTypes types;
  const void* grad_output = nullptr; // [rows, channels], types.output
  const void* grad_sum = nullptr;    // [rows, channels], types.sum, or nullptr: none flows in
  const void* sum = nullptr;         // [rows, channels]: the forward's
  const float* weight = nullptr;
  const float* mean = nullptr; // [rows]: the forward's
  const float* rstd = nullptr;
  Reduction reduction; // plan_reduction of the activations with type types.sum
  float* workspace = nullptr;
  void* grad_sum_total = nullptr; // out [rows, channels], types.sum: LayerNorm's + grad_sum
  float* grad_weight = nullptr;   // out [channels] float32, or nullptr with grad_bias too
  float* grad_bias = nullptr;
};
const char*
add_layer_norm_backward(const Activations& activations, const AddLayerNormBackwardArguments& args);

} // namespace largo::kernels::cuda
