// The CUDA half of batch_norm_relu.h: launchers over raw device pointers, compiled by nvcc
// (batch_norm_relu_cuda.cu) without libtorch's headers, so that nvcc never parses them;
// batch_norm_relu.cpp checks the tensors, allocates, and calls these on the current stream.
//
// A channels-last [N, C, H, W] tensor is, in memory, a row-major [rows = N * H * W,
// channels = C] matrix: BatchNorm's per-channel reductions are column reductions of it, and a
// thread owns `vector_width` adjacent channels of a row (16-byte loads where C allows).
// Every launcher is asynchronous on `stream` and returns nullptr, or the CUDA runtime's
// message for a failed launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace largo::kernels::cuda {

// The activations' dtype; statistics, parameters and gradients of parameters are float32.
enum class ElementType { kFloat32, kBFloat16, kFloat16 };

struct Activations {
  int64_t rows = 0;     // N * H * W
  int64_t channels = 0; // C
  ElementType type = ElementType::kFloat32;
  int device = 0;
  cudaStream_t stream = nullptr;
};

// How a column reduction splits its rows: `chunks` blocks of rows (along y) of
// `rows_per_chunk` rows each (the last fewer), each writing one partial result per channel to
// a workspace of 2 * chunks * channels floats, which a second kernel combines in a fixed order
// (no atomics: the results are deterministic). Sized to fill the device's SMs.
struct Reduction {
  int64_t chunks = 1;
  int64_t rows_per_chunk = 1;
  int64_t workspace_floats(int64_t channels) const {
    return 2 * chunks * channels;
  }
};
Reduction plan_reduction(const Activations& activations);

struct ForwardArguments {
  const void* input = nullptr;    // [rows, channels]
  const void* residual = nullptr; // [rows, channels], or nullptr: batch_norm_relu
  const float* weight = nullptr;  // [channels]
  const float* bias = nullptr;    // [channels]
  float* running_mean = nullptr;  // [channels]: read in evaluation, updated in training; or
  float* running_var = nullptr;   //   nullptr in training (no running statistics)
  bool training = true;
  float momentum = 0.1f;
  float eps = 1e-5f;
  Reduction reduction;          // training: plan_reduction's
  float* workspace = nullptr;   // training: reduction.workspace_floats(channels) floats
  float* save_mean = nullptr;   // out [channels]: the batch's (training) or running mean
  float* save_invstd = nullptr; // out [channels]: 1 / sqrt(variance + eps)
  void* output = nullptr;       // out [rows, channels]
};
const char* batch_norm_relu_forward(const Activations& activations, const ForwardArguments& args);

struct BackwardArguments {
  const void* grad_output = nullptr; // [rows, channels]
  const void* output = nullptr;      // [rows, channels]: the forward's, whose > 0 is the mask
  const void* input = nullptr;       // [rows, channels]
  const float* weight = nullptr;     // [channels]
  const float* save_mean = nullptr;  // [channels]: the forward's
  const float* save_invstd = nullptr;
  bool training = true; // whether the statistics were the batch's (their gradient flows)
  Reduction reduction;
  float* workspace = nullptr;
  float* grad_weight = nullptr;  // out [channels]
  float* grad_bias = nullptr;    // out [channels]
  void* grad_input = nullptr;    // out [rows, channels], or nullptr: not needed
  void* grad_residual = nullptr; // out [rows, channels], or nullptr (batch_norm_relu)
};
const char* batch_norm_relu_backward(const Activations& activations, const BackwardArguments& args);

} // namespace largo::kernels::cuda
