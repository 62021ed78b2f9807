// The fused BatchNorm + (add +) ReLU kernels of batch_norm_relu_cuda.h, for channels-last
// activations seen as a row-major [rows, channels] matrix.
//
// Training forward, three kernels:
//   statistics_kernel   per chunk of rows and per channel: count, mean and M2 (sum of squared
//                       deviations) by Welford's update, merged across the block's threads;
//   finalize_statistics merges the chunks per channel, writes mean and 1 / sqrt(var + eps),
//                       updates the running statistics;
//   forward_kernel      y = relu((x - mean) * weight * invstd + bias [+ residual]).
// Backward, three kernels: per-chunk sums of g and g * (x - mean), where g = dy where y > 0
// else 0; their per-channel totals (grad_bias, grad_weight); then grad_x from ATen's formula
//   grad_x = weight * invstd * (g - sum(g) / M - (x - mean) * invstd^2 * sum(g * (x - mean)) / M)
// and grad_residual = g. Evaluation uses the running statistics, and its grad_x is
// weight * invstd * g.
//
// Statistics accumulate in float32 by Welford's update and Chan's merge, not as sum(x) and
// sum(x^2): the latter's variance, E[x^2] - E[x]^2, cancels catastrophically when the mean is
// large against the spread (a channel with mean 100 and std 0.01 keeps no correct digit in
// float32), while Welford's error grows with the condition sqrt(1 + mean^2 / var), not its
// square (Chan, Golub & LeVeque 1983). One division per row is shared by the row's channels.
// Every reduction runs in a fixed order (chunks, then a tree): results are deterministic.
//
// Passes over activation-sized memory, against ATen's sequence (BatchNorm, in-place add,
// in-place ReLU): forward 3 (read x twice, write y) + 1 for the residual, against 5 and 8;
// backward 7 (read dy, y, x twice each, write grad_x) + 1 for grad_residual, against 8
// (threshold_backward's 3, BatchNorm backward's 5; ATen's grad_residual is g itself). The
// backward saves launches, not traffic: a 1-bit ReLU mask written by the forward (as MLPerf's
// NHWC kernels keep) would replace both reads of y.
#include "batch_norm_relu_cuda.h"

#include "cuda_vector_io.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace largo::kernels::cuda {
namespace {

constexpr int kThreads = 256;     // per block, as block_x (channels) * block_y (rows)
constexpr int kVectorBytes = 16;  // one load or store of a thread's channels
constexpr int kFinalizeLanes = 8; // threads per channel combining the chunks
constexpr int kFinalizeChannels = 32;
constexpr int64_t kMaxGridY = 65535; // CUDA's limit on gridDim.y

using vector_io::load;
using vector_io::store;

// ReLU as ATen's (clamp_min): NaN passes through.
__device__ __forceinline__ float relu(float value) {
  return value > 0.0f || value != value ? value : 0.0f;
}

// The gradient through the ReLU as ATen's threshold_backward(dy, y, 0): zero where y <= 0.
__device__ __forceinline__ float masked(float grad_output, float output) {
  return output <= 0.0f ? 0.0f : grad_output;
}

// Chan's merge of (count, mean, m2) with (count_b, mean_b, m2_b); count_b > 0.
__device__ __forceinline__ void
merge(float& count, float& mean, float& m2, float count_b, float mean_b, float m2_b) {
  const float total = count + count_b;
  const float share_b = count_b / total;
  const float delta = mean_b - mean;
  mean += delta * share_b;
  m2 += m2_b + delta * delta * count * share_b;
  count = total;
}

// The block shape for `channels` in vectors of V: block_x threads across the channel vectors
// (a power of two up to a warp, so that a warp reads whole rows when C is small), block_y
// across rows (a power of two: the trees below halve it).
struct Shape {
  int block_x;
  int block_y;
  int64_t grid_x;
};

Shape shape_for(int64_t channels, int vector_width) {
  const int64_t columns = (channels + vector_width - 1) / vector_width;
  int block_x = 1;
  while (block_x < columns && block_x < 32) {
    block_x *= 2;
  }
  return {block_x, kThreads / block_x, (columns + block_x - 1) / block_x};
}

// ---- training statistics -----------------------------------------------------------------

// Grid (grid_x, chunks); block (block_x, block_y). Thread (x, y) of chunk b takes rows
// b * rows_per_chunk + y, + block_y, ... and the V channels from x's vector; the block's
// threads then merge along y. Shared memory: (2 V + 1) * kThreads floats.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) statistics_kernel(
    const T* __restrict__ input,
    int64_t rows,
    int64_t channels,
    int64_t rows_per_chunk,
    float* __restrict__ chunk_mean, // [chunks, channels]
    float* __restrict__ chunk_m2) { // [chunks, channels]
  extern __shared__ float shared[];
  const int64_t first_channel = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const bool active = first_channel < channels; // V divides channels
  const int64_t begin = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float count = 0.0f;
  float mean[V];
  float m2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mean[j] = 0.0f;
    m2[j] = 0.0f;
  }
  if (active) {
#pragma unroll 4
    for (int64_t row = begin + threadIdx.y; row < end; row += blockDim.y) {
      float x[V];
      load<T, V>(input + row * channels + first_channel, x);
      count += 1.0f;
      const float inverse_count = 1.0f / count;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float delta = x[j] - mean[j];
        mean[j] += delta * inverse_count;
        m2[j] += delta * (x[j] - mean[j]);
      }
    }
  }
  // Tree merge along y: slot (y, x) absorbs slot (y + stride, x).
  const int slot = threadIdx.y * blockDim.x + threadIdx.x;
  float* shared_count = shared;                        // [kThreads]
  float* shared_mean = shared + kThreads;              // [kThreads][V]
  float* shared_m2 = shared + kThreads + kThreads * V; // [kThreads][V]
  shared_count[slot] = count;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    shared_mean[slot * V + j] = mean[j];
    shared_m2[slot * V + j] = m2[j];
  }
  __syncthreads();
  for (int stride = blockDim.y / 2; stride > 0; stride /= 2) {
    if (threadIdx.y < stride) {
      const int other = slot + stride * blockDim.x;
      const float count_b = shared_count[other];
      if (count_b > 0.0f) {
        // merge()'s arithmetic, its count factors shared by the V channels.
        const float total = count + count_b;
        const float share_b = count_b / total;
        const float cross = count * share_b;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float delta = shared_mean[other * V + j] - mean[j];
          mean[j] += delta * share_b;
          m2[j] += shared_m2[other * V + j] + delta * delta * cross;
          shared_mean[slot * V + j] = mean[j];
          shared_m2[slot * V + j] = m2[j];
        }
        count = total;
        shared_count[slot] = count;
      }
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      chunk_mean[int64_t(blockIdx.y) * channels + first_channel + j] = mean[j];
      chunk_m2[int64_t(blockIdx.y) * channels + first_channel + j] = m2[j];
    }
  }
}

// Grid ceil(channels / kFinalizeChannels); block (kFinalizeChannels, kFinalizeLanes). Lane y
// merges chunks y, y + lanes, ... of its channel, then the lanes merge as a tree.
__global__ void __launch_bounds__(kFinalizeChannels* kFinalizeLanes) finalize_statistics_kernel(
    const float* __restrict__ chunk_mean,
    const float* __restrict__ chunk_m2,
    int64_t chunks,
    int64_t rows_per_chunk,
    int64_t rows,
    int64_t channels,
    float eps,
    float momentum,
    float* __restrict__ save_mean,
    float* __restrict__ save_invstd,
    float* __restrict__ running_mean,
    float* __restrict__ running_var) {
  __shared__ float shared_count[kFinalizeLanes][kFinalizeChannels];
  __shared__ float shared_mean[kFinalizeLanes][kFinalizeChannels];
  __shared__ float shared_m2[kFinalizeLanes][kFinalizeChannels];
  const int64_t channel = int64_t(blockIdx.x) * kFinalizeChannels + threadIdx.x;
  const bool active = channel < channels;
  float count = 0.0f;
  float mean = 0.0f;
  float m2 = 0.0f;
  if (active) {
    for (int64_t chunk = threadIdx.y; chunk < chunks; chunk += kFinalizeLanes) {
      const float chunk_rows = float(min(rows_per_chunk, rows - chunk * rows_per_chunk));
      merge(
          count,
          mean,
          m2,
          chunk_rows,
          chunk_mean[chunk * channels + channel],
          chunk_m2[chunk * channels + channel]);
    }
  }
  shared_count[threadIdx.y][threadIdx.x] = count;
  shared_mean[threadIdx.y][threadIdx.x] = mean;
  shared_m2[threadIdx.y][threadIdx.x] = m2;
  __syncthreads();
  for (int stride = kFinalizeLanes / 2; stride > 0; stride /= 2) {
    if (threadIdx.y < stride && shared_count[threadIdx.y + stride][threadIdx.x] > 0.0f) {
      merge(
          count,
          mean,
          m2,
          shared_count[threadIdx.y + stride][threadIdx.x],
          shared_mean[threadIdx.y + stride][threadIdx.x],
          shared_m2[threadIdx.y + stride][threadIdx.x]);
      shared_count[threadIdx.y][threadIdx.x] = count;
      shared_mean[threadIdx.y][threadIdx.x] = mean;
      shared_m2[threadIdx.y][threadIdx.x] = m2;
    }
    __syncthreads();
  }
  if (threadIdx.y != 0 || !active) {
    return;
  }
  const float biased_var = m2 / float(rows);
  save_mean[channel] = mean;
  save_invstd[channel] = 1.0f / sqrtf(biased_var + eps);
  if (running_mean != nullptr) {
    // rows > 1: the caller refuses training with one value per channel, as ATen does.
    const float unbiased_var = m2 / float(rows - 1);
    running_mean[channel] = (1.0f - momentum) * running_mean[channel] + momentum * mean;
    running_var[channel] = (1.0f - momentum) * running_var[channel] + momentum * unbiased_var;
  }
}

// Evaluation: the running statistics, in the form the forward and backward kernels read.
__global__ void eval_statistics_kernel(
    const float* __restrict__ running_mean,
    const float* __restrict__ running_var,
    int64_t channels,
    float eps,
    float* __restrict__ save_mean,
    float* __restrict__ save_invstd) {
  const int64_t channel = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (channel < channels) {
    save_mean[channel] = running_mean[channel];
    save_invstd[channel] = 1.0f / sqrtf(running_var[channel] + eps);
  }
}

// ---- element-wise passes ------------------------------------------------------------------

// Grid (grid_x, up to kMaxGridY), block (block_x, block_y), rows in a grid-stride loop; each
// thread keeps its V channels' coefficients in registers.
template <typename T, int V, bool kResidual>
__global__ void __launch_bounds__(kThreads) forward_kernel(
    const T* __restrict__ input,
    const T* __restrict__ residual,
    const float* __restrict__ weight,
    const float* __restrict__ bias,
    const float* __restrict__ mean,
    const float* __restrict__ invstd,
    int64_t rows,
    int64_t channels,
    T* __restrict__ output) {
  const int64_t first_channel = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (first_channel >= channels) {
    return;
  }
  float channel_mean[V];
  float scale[V];
  float shift[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    channel_mean[j] = mean[first_channel + j];
    scale[j] = weight[first_channel + j] * invstd[first_channel + j];
    shift[j] = bias[first_channel + j];
  }
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
#pragma unroll 2
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < rows; row += row_step) {
    const int64_t offset = row * channels + first_channel;
    float x[V];
    load<T, V>(input + offset, x);
    float added[V];
    if constexpr (kResidual) {
      load<T, V>(residual + offset, added);
    }
    float y[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      // (x - mean) * scale + shift rather than x * scale + (shift - mean * scale): no
      // cancellation when the mean is large against the spread.
      float value = fmaf(x[j] - channel_mean[j], scale[j], shift[j]);
      if constexpr (kResidual) {
        value += added[j];
      }
      y[j] = relu(value);
    }
    store<T, V>(y, output + offset);
  }
}

// Per chunk and channel: sum of g and of g * (x - mean), as statistics_kernel's grid; shared
// memory: 2 V * kThreads floats.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) backward_reduce_kernel(
    const T* __restrict__ grad_output,
    const T* __restrict__ output,
    const T* __restrict__ input,
    const float* __restrict__ mean,
    int64_t rows,
    int64_t channels,
    int64_t rows_per_chunk,
    float* __restrict__ chunk_sum_g,            // [chunks, channels]
    float* __restrict__ chunk_sum_g_centered) { // [chunks, channels]
  extern __shared__ float shared[];
  const int64_t first_channel = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const bool active = first_channel < channels;
  const int64_t begin = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float sum_g[V];
  float sum_g_centered[V];
  float channel_mean[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sum_g[j] = 0.0f;
    sum_g_centered[j] = 0.0f;
    channel_mean[j] = active ? mean[first_channel + j] : 0.0f;
  }
  if (active) {
#pragma unroll 2
    for (int64_t row = begin + threadIdx.y; row < end; row += blockDim.y) {
      const int64_t offset = row * channels + first_channel;
      float dy[V];
      float y[V];
      float x[V];
      load<T, V>(grad_output + offset, dy);
      load<T, V>(output + offset, y);
      load<T, V>(input + offset, x);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float g = masked(dy[j], y[j]);
        sum_g[j] += g;
        sum_g_centered[j] = fmaf(g, x[j] - channel_mean[j], sum_g_centered[j]);
      }
    }
  }
  const int slot = threadIdx.y * blockDim.x + threadIdx.x;
  float* shared_g = shared;                         // [kThreads][V]
  float* shared_g_centered = shared + kThreads * V; // [kThreads][V]
#pragma unroll
  for (int j = 0; j < V; ++j) {
    shared_g[slot * V + j] = sum_g[j];
    shared_g_centered[slot * V + j] = sum_g_centered[j];
  }
  __syncthreads();
  for (int stride = blockDim.y / 2; stride > 0; stride /= 2) {
    if (threadIdx.y < stride) {
      const int other = slot + stride * blockDim.x;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sum_g[j] += shared_g[other * V + j];
        sum_g_centered[j] += shared_g_centered[other * V + j];
        shared_g[slot * V + j] = sum_g[j];
        shared_g_centered[slot * V + j] = sum_g_centered[j];
      }
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      chunk_sum_g[int64_t(blockIdx.y) * channels + first_channel + j] = sum_g[j];
      chunk_sum_g_centered[int64_t(blockIdx.y) * channels + first_channel + j] = sum_g_centered[j];
    }
  }
}

// grad_bias = sum(g), grad_weight = invstd * sum(g * (x - mean)), per channel, from the chunks
// (finalize_statistics_kernel's grid).
__global__ void __launch_bounds__(kFinalizeChannels* kFinalizeLanes) finalize_backward_kernel(
    const float* __restrict__ chunk_sum_g,
    const float* __restrict__ chunk_sum_g_centered,
    int64_t chunks,
    int64_t channels,
    const float* __restrict__ invstd,
    float* __restrict__ grad_weight,
    float* __restrict__ grad_bias) {
  __shared__ float shared_g[kFinalizeLanes][kFinalizeChannels];
  __shared__ float shared_g_centered[kFinalizeLanes][kFinalizeChannels];
  const int64_t channel = int64_t(blockIdx.x) * kFinalizeChannels + threadIdx.x;
  const bool active = channel < channels;
  float sum_g = 0.0f;
  float sum_g_centered = 0.0f;
  if (active) {
    for (int64_t chunk = threadIdx.y; chunk < chunks; chunk += kFinalizeLanes) {
      sum_g += chunk_sum_g[chunk * channels + channel];
      sum_g_centered += chunk_sum_g_centered[chunk * channels + channel];
    }
  }
  shared_g[threadIdx.y][threadIdx.x] = sum_g;
  shared_g_centered[threadIdx.y][threadIdx.x] = sum_g_centered;
  __syncthreads();
  for (int stride = kFinalizeLanes / 2; stride > 0; stride /= 2) {
    if (threadIdx.y < stride) {
      sum_g += shared_g[threadIdx.y + stride][threadIdx.x];
      sum_g_centered += shared_g_centered[threadIdx.y + stride][threadIdx.x];
      shared_g[threadIdx.y][threadIdx.x] = sum_g;
      shared_g_centered[threadIdx.y][threadIdx.x] = sum_g_centered;
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && active) {
    grad_bias[channel] = sum_g;
    grad_weight[channel] = sum_g_centered * invstd[channel];
  }
}

// grad_x (when grad_input is given) and grad_residual = g (when kResidualGrad), as
// forward_kernel's grid. In training the statistics' gradient enters through the per-channel
// totals: mean_g = sum(g) / M and mean_g_centered_scaled = sum(g * (x - mean)) * invstd^2 / M
// (= grad_weight * invstd / M).
template <typename T, int V, bool kResidualGrad>
__global__ void __launch_bounds__(kThreads) backward_kernel(
    const T* __restrict__ grad_output,
    const T* __restrict__ output,
    const T* __restrict__ input,
    const float* __restrict__ weight,
    const float* __restrict__ mean,
    const float* __restrict__ invstd,
    const float* __restrict__ grad_weight,
    const float* __restrict__ grad_bias,
    bool training,
    int64_t rows,
    int64_t channels,
    T* __restrict__ grad_input,
    T* __restrict__ grad_residual) {
  const int64_t first_channel = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (first_channel >= channels) {
    return;
  }
  const float inverse_rows = 1.0f / float(rows);
  float channel_mean[V];
  float scale[V];
  float mean_g[V];
  float mean_g_centered_scaled[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t channel = first_channel + j;
    channel_mean[j] = mean[channel];
    scale[j] = weight[channel] * invstd[channel];
    mean_g[j] = training ? grad_bias[channel] * inverse_rows : 0.0f;
    mean_g_centered_scaled[j] =
        training ? grad_weight[channel] * invstd[channel] * inverse_rows : 0.0f;
  }
  const bool centered = training && grad_input != nullptr;
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < rows; row += row_step) {
    const int64_t offset = row * channels + first_channel;
    float dy[V];
    float y[V];
    float x[V] = {};
    load<T, V>(grad_output + offset, dy);
    load<T, V>(output + offset, y);
    if (centered) {
      load<T, V>(input + offset, x);
    }
    float g[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      g[j] = masked(dy[j], y[j]);
    }
    if constexpr (kResidualGrad) {
      store<T, V>(g, grad_residual + offset); // exact: g is dy or 0
    }
    if (grad_input != nullptr) {
      float dx[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float centered_term =
            centered ? (x[j] - channel_mean[j]) * mean_g_centered_scaled[j] : 0.0f;
        dx[j] = scale[j] * (g[j] - mean_g[j] - centered_term);
      }
      store<T, V>(dx, grad_input + offset);
    }
  }
}

// ---- launching ----------------------------------------------------------------------------

int multiprocessors(int device) {
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 132; // an H100/H200's; only the grid's size depends on it
  }
  return count;
}

bool aligned(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % kVectorBytes == 0;
}

template <typename T>
struct TypeTag {
  using type = T;
};
template <int V>
using Width = std::integral_constant<int, V>;

// Calls fn(TypeTag<T>(), Width<V>()) for the activations' type, V the widest vector (16
// bytes) when C and every pointer allow it, else 1.
template <typename Fn>
const char*
dispatch(ElementType type, int64_t channels, std::initializer_list<const void*> pointers, Fn&& fn) {
  bool vectorizable = true;
  for (const void* pointer : pointers) {
    vectorizable = vectorizable && (pointer == nullptr || aligned(pointer));
  }
  switch (type) {
  case ElementType::kFloat32:
    if (vectorizable && channels % 4 == 0) {
      fn(TypeTag<float>(), Width<4>());
    } else {
      fn(TypeTag<float>(), Width<1>());
    }
    break;
  case ElementType::kBFloat16:
    if (vectorizable && channels % 8 == 0) {
      fn(TypeTag<__nv_bfloat16>(), Width<8>());
    } else {
      fn(TypeTag<__nv_bfloat16>(), Width<1>());
    }
    break;
  case ElementType::kFloat16:
    if (vectorizable && channels % 8 == 0) {
      fn(TypeTag<__half>(), Width<8>());
    } else {
      fn(TypeTag<__half>(), Width<1>());
    }
    break;
  }
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

int vector_width_for(ElementType type, int64_t channels) {
  const int width = type == ElementType::kFloat32 ? 4 : 8;
  return channels % width == 0 ? width : 1;
}

// The element-wise passes' grid: enough rows per thread (4) to amortise its coefficients.
dim3 elementwise_grid(const Shape& shape, int64_t rows) {
  const int64_t rows_per_block = int64_t(shape.block_y) * 4;
  return dim3(
      unsigned(shape.grid_x),
      unsigned(std::min((rows + rows_per_block - 1) / rows_per_block, kMaxGridY)));
}

dim3 finalize_grid(int64_t channels) {
  return dim3(unsigned((channels + kFinalizeChannels - 1) / kFinalizeChannels));
}

} // namespace

Reduction plan_reduction(const Activations& activations) {
  // Sized for the widest vector: a narrower one only has more threads along x.
  const Shape shape =
      shape_for(activations.channels, vector_width_for(activations.type, activations.channels));
  // One wave of 8 blocks of 256 threads per SM (2048 threads, an SM's maximum), with at least
  // 8 rows per thread so that the loads outweigh the merges.
  const int64_t wanted_blocks = 8 * int64_t(multiprocessors(activations.device));
  const int64_t min_rows_per_chunk = int64_t(shape.block_y) * 8;
  int64_t chunks = std::max<int64_t>(1, wanted_blocks / shape.grid_x);
  chunks = std::min(chunks, (activations.rows + min_rows_per_chunk - 1) / min_rows_per_chunk);
  chunks = std::max<int64_t>(1, std::min(chunks, kMaxGridY));
  Reduction reduction;
  reduction.rows_per_chunk = (activations.rows + chunks - 1) / chunks;
  reduction.chunks = (activations.rows + reduction.rows_per_chunk - 1) / reduction.rows_per_chunk;
  return reduction;
}

const char* batch_norm_relu_forward(const Activations& activations, const ForwardArguments& args) {
  if (const cudaError_t error = cudaSetDevice(activations.device); error != cudaSuccess) {
    return cudaGetErrorString(error);
  }
  const int64_t rows = activations.rows;
  const int64_t channels = activations.channels;
  cudaStream_t stream = activations.stream;
  if (args.training) {
    const char* error =
        dispatch(activations.type, channels, {args.input}, [&](auto type_tag, auto width) {
          using T = typename decltype(type_tag)::type;
          constexpr int V = decltype(width)::value;
          const Shape shape = shape_for(channels, V);
          const dim3 grid(unsigned(shape.grid_x), unsigned(args.reduction.chunks));
          const dim3 block(shape.block_x, shape.block_y);
          const size_t shared_bytes = (2 * V + 1) * kThreads * sizeof(float);
          statistics_kernel<T, V><<<grid, block, shared_bytes, stream>>>(
              static_cast<const T*>(args.input),
              rows,
              channels,
              args.reduction.rows_per_chunk,
              args.workspace,
              args.workspace + args.reduction.chunks * channels);
        });
    if (error != nullptr) {
      return error;
    }
    finalize_statistics_kernel<<<
        finalize_grid(channels),
        dim3(kFinalizeChannels, kFinalizeLanes),
        0,
        stream>>>(
        args.workspace,
        args.workspace + args.reduction.chunks * channels,
        args.reduction.chunks,
        args.reduction.rows_per_chunk,
        rows,
        channels,
        args.eps,
        args.momentum,
        args.save_mean,
        args.save_invstd,
        args.running_mean,
        args.running_var);
  } else {
    const unsigned blocks = unsigned((channels + kThreads - 1) / kThreads);
    eval_statistics_kernel<<<blocks, kThreads, 0, stream>>>(
        args.running_mean, args.running_var, channels, args.eps, args.save_mean, args.save_invstd);
  }
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) {
    return cudaGetErrorString(error);
  }
  return dispatch(
      activations.type,
      channels,
      {args.input, args.residual, args.output},
      [&](auto type_tag, auto width) {
        using T = typename decltype(type_tag)::type;
        constexpr int V = decltype(width)::value;
        const Shape shape = shape_for(channels, V);
        const dim3 grid = elementwise_grid(shape, rows);
        const dim3 block(shape.block_x, shape.block_y);
        const auto* input = static_cast<const T*>(args.input);
        const auto* residual = static_cast<const T*>(args.residual);
        auto* output = static_cast<T*>(args.output);
        if (residual != nullptr) {
          forward_kernel<T, V, true><<<grid, block, 0, stream>>>(
              input,
              residual,
              args.weight,
              args.bias,
              args.save_mean,
              args.save_invstd,
              rows,
              channels,
              output);
        } else {
          forward_kernel<T, V, false><<<grid, block, 0, stream>>>(
              input,
              nullptr,
              args.weight,
              args.bias,
              args.save_mean,
              args.save_invstd,
              rows,
              channels,
              output);
        }
      });
}

const char*
batch_norm_relu_backward(const Activations& activations, const BackwardArguments& args) {
  if (const cudaError_t error = cudaSetDevice(activations.device); error != cudaSuccess) {
    return cudaGetErrorString(error);
  }
  const int64_t rows = activations.rows;
  const int64_t channels = activations.channels;
  cudaStream_t stream = activations.stream;
  const char* error = dispatch(
      activations.type,
      channels,
      {args.grad_output, args.output, args.input},
      [&](auto type_tag, auto width) {
        using T = typename decltype(type_tag)::type;
        constexpr int V = decltype(width)::value;
        const Shape shape = shape_for(channels, V);
        const dim3 grid(unsigned(shape.grid_x), unsigned(args.reduction.chunks));
        const dim3 block(shape.block_x, shape.block_y);
        const size_t shared_bytes = 2 * V * kThreads * sizeof(float);
        backward_reduce_kernel<T, V><<<grid, block, shared_bytes, stream>>>(
            static_cast<const T*>(args.grad_output),
            static_cast<const T*>(args.output),
            static_cast<const T*>(args.input),
            args.save_mean,
            rows,
            channels,
            args.reduction.rows_per_chunk,
            args.workspace,
            args.workspace + args.reduction.chunks * channels);
      });
  if (error != nullptr) {
    return error;
  }
  finalize_backward_kernel<<<
      finalize_grid(channels),
      dim3(kFinalizeChannels, kFinalizeLanes),
      0,
      stream>>>(
      args.workspace,
      args.workspace + args.reduction.chunks * channels,
      args.reduction.chunks,
      channels,
      args.save_invstd,
      args.grad_weight,
      args.grad_bias);
  if (const cudaError_t launch_error = cudaGetLastError(); launch_error != cudaSuccess) {
    return cudaGetErrorString(launch_error);
  }
  if (args.grad_input == nullptr && args.grad_residual == nullptr) {
    return nullptr;
  }
  return dispatch(
      activations.type,
      channels,
      {args.grad_output, args.output, args.input, args.grad_input, args.grad_residual},
      [&](auto type_tag, auto width) {
        using T = typename decltype(type_tag)::type;
        constexpr int V = decltype(width)::value;
        const Shape shape = shape_for(channels, V);
        const dim3 grid = elementwise_grid(shape, rows);
        const dim3 block(shape.block_x, shape.block_y);
        const auto* grad_output = static_cast<const T*>(args.grad_output);
        const auto* output = static_cast<const T*>(args.output);
        const auto* input = static_cast<const T*>(args.input);
        auto* grad_input = static_cast<T*>(args.grad_input);
        auto* grad_residual = static_cast<T*>(args.grad_residual);
        if (grad_residual != nullptr) {
          backward_kernel<T, V, true><<<grid, block, 0, stream>>>(
              grad_output,
              output,
              input,
              args.weight,
              args.save_mean,
              args.save_invstd,
              args.grad_weight,
              args.grad_bias,
              args.training,
              rows,
              channels,
              grad_input,
              grad_residual);
        } else {
          backward_kernel<T, V, false><<<grid, block, 0, stream>>>(
              grad_output,
              output,
              input,
              args.weight,
              args.save_mean,
              args.save_invstd,
              args.grad_weight,
              args.grad_bias,
              args.training,
              rows,
              channels,
              grad_input,
              nullptr);
        }
      });
}

} // namespace largo::kernels::cuda
