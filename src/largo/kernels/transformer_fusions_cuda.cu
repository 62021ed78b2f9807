// The kernels of transformer_fusions_cuda.h: bias + GELU, and residual add + LayerNorm, over
// row-major [rows, channels] activations.
//
// bias_gelu: forward one pass, y = gelu(x + b) (read x, write y: 2 passes over activation-sized
// memory, against ATen's 4: add reads x and writes x + b, gelu reads it and writes y). Backward
// one pass that also reduces: dx = dy * gelu'(x + b), stored, and summed per chunk of rows for
// grad_bias (read dy and x, write dx: 3 passes, against ATen's 4: gelu_backward's 3 and the
// bias gradient's sum over dx); then a small kernel adds the chunks in a fixed order.
//
// add_layer_norm: forward one warp per row, s = x + r rounded to the sum's dtype and stored,
// the row's mean and M2 by Welford's update over the rounded s (what the next kernel and
// backward read) merged across the warp by Chan's rule in a fixed tree, then
// y = (s - mean) * rstd * w + b from a second read of s (the warp's own row, in L1/L2: DRAM
// sees x and r read, s and y written; ATen's add + layer_norm reads x, r, writes s, reads s,
// writes y). Backward: per row, S1 = sum(dy * w), S2 = sum(dy * w * xhat), then
//   ds = rstd * (dy * w - S1 / D - xhat * S2 / D) + grad_sum
// (ATen's LayerNorm input gradient, plus the gradient that reached the sum directly, added
// before the one rounding: ATen writes the LayerNorm's and then adds them in another pass);
// grad_weight = sum(dy * xhat), grad_bias = sum(dy) per channel as chunked column sums, combined
// in a fixed order. Every reduction has a fixed order and no atomics: results are deterministic.
//
// Statistics and sums are float32; the GELU's erf / tanh / exp are CUDA's correctly-bounded
// library functions (no fast-math intrinsics), as ATen's GELU kernels use.
#include "transformer_fusions_cuda.h"

#include "cuda_vector_io.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace largo::kernels::cuda {
namespace {

constexpr int kThreads = 256; // per block
constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp; // layer-norm kernels: a warp per row
constexpr int kVectorBytes = 16;
constexpr int kFinalizeLanes = 8;
constexpr int kFinalizeChannels = 32;
constexpr int64_t kMaxGridY = 65535;
constexpr unsigned kFullMask = 0xffffffffu;

using vector_io::from_float;
using vector_io::load;
using vector_io::store;
using vector_io::to_float;

// ---- GELU ---------------------------------------------------------------------------------
// ATen's formulas (aten/src/ATen/native/cuda/ActivationGeluKernel.cu), in float32:
//   exact: gelu(z) = z / 2 * (1 + erf(z / sqrt 2)),  gelu'(z) = (1 + erf(z / sqrt 2)) / 2 + z
//   phi(z) tanh:  gelu(z) = z / 2 * (1 + tanh(k)),  k = sqrt(2 / pi) (z + 0.044715 z^3),
//          gelu'(z) = (1 + t) / 2 + z / 2 (1 - t^2) sqrt(2 / pi) (1 + 3 * 0.044715 z^2).
constexpr float kSqrtHalf = 0.707106781186547524401f;
constexpr float kInvSqrtTwoPi = 0.398942280401432677940f;
constexpr float kSqrtTwoOverPi = 0.797884560802865355880f;
constexpr float kTanhCubic = 0.044715f;

template <bool kTanh>
__device__ __forceinline__ float gelu(float z) {
  if constexpr (kTanh) {
    const float inner = kSqrtTwoOverPi * (z + kTanhCubic * z * z * z);
    return 0.5f * z * (1.0f + tanhf(inner));
  } else {
    return 0.5f * z * (1.0f + erff(z * kSqrtHalf));
  }
}

template <bool kTanh>
__device__ __forceinline__ float gelu_derivative(float z) {
  if constexpr (kTanh) {
    const float z2 = z * z;
    const float t = tanhf(kSqrtTwoOverPi * (z + kTanhCubic * z2 * z));
    return 0.5f * (1.0f + t) +
           0.5f * z * (1.0f - t * t) * kSqrtTwoOverPi * (1.0f + 3.0f * kTanhCubic * z2);
  } else {
    return 0.5f * (1.0f + erff(z * kSqrtHalf)) + z * kInvSqrtTwoPi * expf(-0.5f * z * z);
  }
}

// The column kernels' block: block_x threads across the channel vectors (a power of two up to
// a warp), block_y across rows (a power of two: the trees halve it). As batch_norm_relu_cuda.cu,
// whose plan_reduction sized the chunks for it.
struct Shape {
  int block_x;
  int block_y;
  int64_t grid_x;
};

Shape shape_for(int64_t channels, int vector_width) {
  const int64_t columns = (channels + vector_width - 1) / vector_width;
  int block_x = 1;
  while (block_x < columns && block_x < kWarp) {
    block_x *= 2;
  }
  return {block_x, kThreads / block_x, (columns + block_x - 1) / block_x};
}

// Adds `values` (this thread's V partial sums) across the block's y in a fixed tree; thread
// (x, 0) ends with its column vector's total. `shared`: kThreads * V floats.
template <int V>
__device__ __forceinline__ void sum_over_block_rows(float (&values)[V], float* shared) {
  const int slot = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    shared[slot * V + j] = values[j];
  }
  __syncthreads();
  for (int stride = blockDim.y / 2; stride > 0; stride /= 2) {
    if (threadIdx.y < stride) {
      const int other = slot + stride * blockDim.x;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        values[j] += shared[other * V + j];
        shared[slot * V + j] = values[j];
      }
    }
    __syncthreads();
  }
}

// total[c] = sum over chunks of chunk_sums[chunk, c], lane y taking chunks y, y + lanes, ...,
// then a tree over the lanes: a fixed order.
__global__ void __launch_bounds__(kFinalizeChannels* kFinalizeLanes) sum_chunks_kernel(
    const float* __restrict__ chunk_sums, // [chunks, channels]
    int64_t chunks,
    int64_t channels,
    float* __restrict__ total) { // [channels]
  __shared__ float shared[kFinalizeLanes][kFinalizeChannels];
  const int64_t channel = int64_t(blockIdx.x) * kFinalizeChannels + threadIdx.x;
  float sum = 0.0f;
  if (channel < channels) {
    for (int64_t chunk = threadIdx.y; chunk < chunks; chunk += kFinalizeLanes) {
      sum += chunk_sums[chunk * channels + channel];
    }
  }
  shared[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kFinalizeLanes / 2; stride > 0; stride /= 2) {
    if (threadIdx.y < stride) {
      sum += shared[threadIdx.y + stride][threadIdx.x];
      shared[threadIdx.y][threadIdx.x] = sum;
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && channel < channels) {
    total[channel] = sum;
  }
}

// ---- bias_gelu ----------------------------------------------------------------------------

// Grid (grid_x, row blocks); block (block_x, block_y); a thread's V channels, every
// gridDim.y * block_y-th row.
template <typename T, int V, bool kTanh>
__global__ void __launch_bounds__(kThreads) bias_gelu_forward_kernel(
    const T* __restrict__ input,
    const float* __restrict__ bias,
    int64_t rows,
    int64_t channels,
    T* __restrict__ output) {
  const int64_t first_channel = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (first_channel >= channels) {
    return;
  }
  float b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    b[j] = bias[first_channel + j];
  }
  const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < rows; row += row_step) {
    const int64_t offset = row * channels + first_channel;
    float x[V];
    load<T, V>(input + offset, x);
    float y[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      y[j] = gelu<kTanh>(x[j] + b[j]);
    }
    store<T, V>(y, output + offset);
  }
}

// Grid (grid_x, chunks); block (block_x, block_y). dx for the chunk's rows, stored (when
// grad_input is given) and summed per channel into chunk_sum[chunk, channel] (the float32
// values, before their rounding to T). Shared memory: V * kThreads floats.
template <typename T, int V, bool kTanh>
__global__ void __launch_bounds__(kThreads) bias_gelu_backward_kernel(
    const T* __restrict__ grad_output,
    const T* __restrict__ input,
    const float* __restrict__ bias,
    int64_t rows,
    int64_t channels,
    int64_t rows_per_chunk,
    T* __restrict__ grad_input,
    float* __restrict__ chunk_sum) { // [chunks, channels]
  extern __shared__ float shared[];
  const int64_t first_channel = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const bool active = first_channel < channels;
  const int64_t begin = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float b[V];
  float sum[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    b[j] = active ? bias[first_channel + j] : 0.0f;
    sum[j] = 0.0f;
  }
  if (active) {
    for (int64_t row = begin + threadIdx.y; row < end; row += blockDim.y) {
      const int64_t offset = row * channels + first_channel;
      float dy[V];
      float x[V];
      load<T, V>(grad_output + offset, dy);
      load<T, V>(input + offset, x);
      float dx[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        dx[j] = dy[j] * gelu_derivative<kTanh>(x[j] + b[j]);
        sum[j] += dx[j];
      }
      if (grad_input != nullptr) {
        store<T, V>(dx, grad_input + offset);
      }
    }
  }
  sum_over_block_rows<V>(sum, shared);
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      chunk_sum[int64_t(blockIdx.y) * channels + first_channel + j] = sum[j];
    }
  }
}

// ---- add_layer_norm -----------------------------------------------------------------------

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

// Grid ceil(rows / kRowsPerBlock); a warp per row, lane l taking the channel vectors l,
// l + 32, ... (TA, TB: x and residual, the narrower first; TS the sum's type, TO the output's).
template <typename TA, typename TB, typename TS, typename TO, int V>
__global__ void __launch_bounds__(kThreads) add_layer_norm_forward_kernel(
    const TA* __restrict__ a,
    const TB* __restrict__ b,
    const float* __restrict__ weight,
    const float* __restrict__ bias,
    int64_t rows,
    int64_t channels,
    float eps,
    TS* __restrict__ sum,
    TO* __restrict__ output,
    float* __restrict__ mean_out,
    float* __restrict__ rstd_out) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) {
    return; // the whole warp: its lanes share the row
  }
  const int lane = threadIdx.x % kWarp;
  const int64_t base = row * channels;
  float count = 0.0f;
  float mean = 0.0f;
  float m2 = 0.0f;
  for (int64_t c = int64_t(lane) * V; c < channels; c += int64_t(kWarp) * V) {
    float x[V];
    float r[V];
    load<TA, V>(a + base + c, x);
    load<TB, V>(b + base + c, r);
    float s[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      s[j] = to_float(from_float<TS>(x[j] + r[j])); // the sum as stored: what is normalised
    }
    store<TS, V>(s, sum + base + c); // exact
#pragma unroll
    for (int j = 0; j < V; ++j) {
      count += 1.0f;
      const float delta = s[j] - mean;
      mean += delta / count;
      m2 += delta * (s[j] - mean);
    }
  }
  // Lane 0 merges the others in a fixed tree, then tells them (a butterfly would merge in
  // different orders on different lanes, and Chan's merge is not commutative in rounding).
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float count_b = __shfl_down_sync(kFullMask, count, offset);
    const float mean_b = __shfl_down_sync(kFullMask, mean, offset);
    const float m2_b = __shfl_down_sync(kFullMask, m2, offset);
    if (lane < offset && count_b > 0.0f) {
      merge(count, mean, m2, count_b, mean_b, m2_b);
    }
  }
  mean = __shfl_sync(kFullMask, mean, 0);
  m2 = __shfl_sync(kFullMask, m2, 0);
  const float rstd = 1.0f / sqrtf(m2 / float(channels) + eps);
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  for (int64_t c = int64_t(lane) * V; c < channels; c += int64_t(kWarp) * V) {
    float s[V];
    load<TS, V>(sum + base + c, s); // this lane's own stores
    float y[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      y[j] = (s[j] - mean) * rstd * weight[c + j] + bias[c + j];
    }
    store<TO, V>(y, output + base + c);
  }
}

// The gradient reaching the sum: a warp per row as the forward.
template <typename TS, typename TO, int V>
__global__ void __launch_bounds__(kThreads) add_layer_norm_backward_kernel(
    const TO* __restrict__ grad_output,
    const TS* __restrict__ grad_sum, // or nullptr
    const TS* __restrict__ sum,
    const float* __restrict__ weight,
    const float* __restrict__ mean_in,
    const float* __restrict__ rstd_in,
    int64_t rows,
    int64_t channels,
    TS* __restrict__ grad_sum_total) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) {
    return;
  }
  const int lane = threadIdx.x % kWarp;
  const int64_t base = row * channels;
  const float mean = mean_in[row];
  const float rstd = rstd_in[row];
  float sum_dxhat = 0.0f;
  float sum_dxhat_xhat = 0.0f;
  for (int64_t c = int64_t(lane) * V; c < channels; c += int64_t(kWarp) * V) {
    float dy[V];
    float s[V];
    load<TO, V>(grad_output + base + c, dy);
    load<TS, V>(sum + base + c, s);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float dxhat = dy[j] * weight[c + j];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * ((s[j] - mean) * rstd);
    }
  }
  // A butterfly: a + b == b + a, so every lane ends with the same bits.
  for (int mask = kWarp / 2; mask > 0; mask /= 2) {
    sum_dxhat += __shfl_xor_sync(kFullMask, sum_dxhat, mask);
    sum_dxhat_xhat += __shfl_xor_sync(kFullMask, sum_dxhat_xhat, mask);
  }
  const float mean_dxhat = sum_dxhat / float(channels);
  const float mean_dxhat_xhat = sum_dxhat_xhat / float(channels);
  for (int64_t c = int64_t(lane) * V; c < channels; c += int64_t(kWarp) * V) {
    float dy[V];
    float s[V];
    float g[V] = {};
    load<TO, V>(grad_output + base + c, dy);
    load<TS, V>(sum + base + c, s);
    if (grad_sum != nullptr) {
      load<TS, V>(grad_sum + base + c, g);
    }
    float ds[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float xhat = (s[j] - mean) * rstd;
      ds[j] = rstd * (dy[j] * weight[c + j] - mean_dxhat - xhat * mean_dxhat_xhat) + g[j];
    }
    store<TS, V>(ds, grad_sum_total + base + c);
  }
}

// Per chunk of rows and per channel: sum(dy * xhat) and sum(dy). Grid (grid_x, chunks); block
// (block_x, block_y); shared memory 2 * V * kThreads floats.
template <typename TS, typename TO, int V>
__global__ void __launch_bounds__(kThreads) layer_norm_parameters_backward_kernel(
    const TO* __restrict__ grad_output,
    const TS* __restrict__ sum,
    const float* __restrict__ mean,
    const float* __restrict__ rstd,
    int64_t rows,
    int64_t channels,
    int64_t rows_per_chunk,
    float* __restrict__ chunk_grad_weight, // [chunks, channels]
    float* __restrict__ chunk_grad_bias) { // [chunks, channels]
  extern __shared__ float shared[];
  const int64_t first_channel = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const bool active = first_channel < channels;
  const int64_t begin = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float grad_weight[V];
  float grad_bias[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    grad_weight[j] = 0.0f;
    grad_bias[j] = 0.0f;
  }
  if (active) {
    for (int64_t row = begin + threadIdx.y; row < end; row += blockDim.y) {
      const int64_t offset = row * channels + first_channel;
      const float row_mean = mean[row];
      const float row_rstd = rstd[row];
      float dy[V];
      float s[V];
      load<TO, V>(grad_output + offset, dy);
      load<TS, V>(sum + offset, s);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        grad_weight[j] += dy[j] * ((s[j] - row_mean) * row_rstd);
        grad_bias[j] += dy[j];
      }
    }
  }
  sum_over_block_rows<V>(grad_weight, shared);
  sum_over_block_rows<V>(grad_bias, shared + kThreads * V);
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      chunk_grad_weight[int64_t(blockIdx.y) * channels + first_channel + j] = grad_weight[j];
      chunk_grad_bias[int64_t(blockIdx.y) * channels + first_channel + j] = grad_bias[j];
    }
  }
}

// ---- launching ----------------------------------------------------------------------------

template <typename T>
struct TypeTag {
  using type = T;
};

// Whether `pointer` (nullptr counts as aligned) allows vectors of `width` elements of T.
template <typename T>
bool aligned_for(const void* pointer, int width) {
  return reinterpret_cast<uintptr_t>(pointer) % (sizeof(T) * width) == 0;
}

const char* last_error() {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? nullptr : cudaGetErrorString(error);
}

// The element-wise grid: 4 rows per thread at least, to amortise the per-channel loads.
dim3 elementwise_grid(const Shape& shape, int64_t rows) {
  const int64_t rows_per_block = int64_t(shape.block_y) * 4;
  return dim3(
      unsigned(shape.grid_x),
      unsigned(std::min((rows + rows_per_block - 1) / rows_per_block, kMaxGridY)));
}

const char* launch_sum_chunks(
    const float* chunk_sums, int64_t chunks, int64_t channels, float* total, cudaStream_t stream) {
  const dim3 grid(unsigned((channels + kFinalizeChannels - 1) / kFinalizeChannels));
  sum_chunks_kernel<<<grid, dim3(kFinalizeChannels, kFinalizeLanes), 0, stream>>>(
      chunk_sums, chunks, channels, total);
  return last_error();
}

// Calls fn(TypeTag<T>()) for an activations' type.
template <typename Fn>
void with_type(ElementType type, Fn&& fn) {
  switch (type) {
  case ElementType::kFloat32:
    fn(TypeTag<float>());
    break;
  case ElementType::kBFloat16:
    fn(TypeTag<__nv_bfloat16>());
    break;
  case ElementType::kFloat16:
    fn(TypeTag<__half>());
    break;
  }
}

} // namespace

const char*
bias_gelu_forward(const Activations& activations, const BiasGeluForwardArguments& args) {
  if (const cudaError_t error = cudaSetDevice(activations.device); error != cudaSuccess) {
    return cudaGetErrorString(error);
  }
  const int64_t rows = activations.rows;
  const int64_t channels = activations.channels;
  with_type(activations.type, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr int kWidth = kVectorBytes / sizeof(T);
    const bool wide = channels % kWidth == 0 && aligned_for<T>(args.input, kWidth) &&
                      aligned_for<T>(args.output, kWidth);
    const auto launch = [&](auto width, auto use_tanh) {
      constexpr int V = decltype(width)::value;
      const Shape shape = shape_for(channels, V);
      bias_gelu_forward_kernel<T, V, decltype(use_tanh)::value>
          <<<elementwise_grid(shape, rows),
             dim3(shape.block_x, shape.block_y),
             0,
             activations.stream>>>(
              static_cast<const T*>(args.input),
              args.bias,
              rows,
              channels,
              static_cast<T*>(args.output));
    };
    const auto with_width = [&](auto use_tanh) {
      if (wide) {
        launch(std::integral_constant<int, kWidth>(), use_tanh);
      } else {
        launch(std::integral_constant<int, 1>(), use_tanh);
      }
    };
    if (args.approximation == GeluApproximation::kTanh) {
      with_width(std::true_type());
    } else {
      with_width(std::false_type());
    }
  });
  return last_error();
}

const char*
bias_gelu_backward(const Activations& activations, const BiasGeluBackwardArguments& args) {
  if (const cudaError_t error = cudaSetDevice(activations.device); error != cudaSuccess) {
    return cudaGetErrorString(error);
  }
  const int64_t rows = activations.rows;
  const int64_t channels = activations.channels;
  with_type(activations.type, [&](auto type_tag) {
    using T = typename decltype(type_tag)::type;
    constexpr int kWidth = kVectorBytes / sizeof(T);
    const bool wide = channels % kWidth == 0 && aligned_for<T>(args.grad_output, kWidth) &&
                      aligned_for<T>(args.input, kWidth) && aligned_for<T>(args.grad_input, kWidth);
    const auto launch = [&](auto width, auto use_tanh) {
      constexpr int V = decltype(width)::value;
      const Shape shape = shape_for(channels, V);
      const dim3 grid(unsigned(shape.grid_x), unsigned(args.reduction.chunks));
      bias_gelu_backward_kernel<T, V, decltype(use_tanh)::value>
          <<<grid,
             dim3(shape.block_x, shape.block_y),
             V * kThreads * sizeof(float),
             activations.stream>>>(
              static_cast<const T*>(args.grad_output),
              static_cast<const T*>(args.input),
              args.bias,
              rows,
              channels,
              args.reduction.rows_per_chunk,
              static_cast<T*>(args.grad_input),
              args.workspace);
    };
    const auto with_width = [&](auto use_tanh) {
      if (wide) {
        launch(std::integral_constant<int, kWidth>(), use_tanh);
      } else {
        launch(std::integral_constant<int, 1>(), use_tanh);
      }
    };
    if (args.approximation == GeluApproximation::kTanh) {
      with_width(std::true_type());
    } else {
      with_width(std::false_type());
    }
  });
  if (const char* error = last_error(); error != nullptr || args.grad_bias == nullptr) {
    return error;
  }
  return launch_sum_chunks(
      args.workspace, args.reduction.chunks, channels, args.grad_bias, activations.stream);
}

namespace {

bool is_reduced(ElementType type) {
  return type != ElementType::kFloat32;
}

// Calls fn(TypeTag<TA>(), TypeTag<TB>(), TypeTag<TS>(), TypeTag<TO>()) for supported types,
// TA the narrower of x and residual (the caller swaps them: x + r == r + x, bit for bit).
template <typename Fn>
void with_forward_types(ElementType narrower, ElementType wider, ElementType output, Fn&& fn) {
  using F = TypeTag<float>;
  using B = TypeTag<__nv_bfloat16>;
  using H = TypeTag<__half>;
  if (!is_reduced(narrower)) {
    fn(F(), F(), F(), F());
  } else if (!is_reduced(wider)) {
    narrower == ElementType::kBFloat16 ? fn(B(), F(), F(), F()) : fn(H(), F(), F(), F());
  } else if (narrower == ElementType::kBFloat16) {
    is_reduced(output) ? fn(B(), B(), B(), B()) : fn(B(), B(), B(), F());
  } else {
    is_reduced(output) ? fn(H(), H(), H(), H()) : fn(H(), H(), H(), F());
  }
}

// Calls fn(TypeTag<TS>(), TypeTag<TO>()) for a supported sum and output type.
template <typename Fn>
void with_backward_types(ElementType sum, ElementType output, Fn&& fn) {
  with_type(sum, [&](auto sum_tag) {
    if (is_reduced(output)) {
      fn(sum_tag, sum_tag);
    } else {
      fn(sum_tag, TypeTag<float>());
    }
  });
}

// The widest vector every one of the tensors allows (16 bytes of the widest type), or 1.
template <typename... Ts>
struct VectorWidth {
  static constexpr int kWide = kVectorBytes / std::max({sizeof(Ts)...});
};

unsigned row_blocks(int64_t rows) {
  return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

} // namespace

bool add_layer_norm_supports(const AddLayerNormTypes& types) {
  const bool same = types.x == types.residual;
  const bool one_float32 = is_reduced(types.x) != is_reduced(types.residual);
  if (!same && !one_float32) {
    return false;
  }
  const ElementType sum = same ? types.x : ElementType::kFloat32;
  return types.sum == sum && (types.output == sum || types.output == ElementType::kFloat32);
}

const char*
add_layer_norm_forward(const Activations& activations, const AddLayerNormForwardArguments& args) {
  if (!add_layer_norm_supports(args.types)) {
    return "add_layer_norm_forward: unsupported dtypes";
  }
  if (const cudaError_t error = cudaSetDevice(activations.device); error != cudaSuccess) {
    return cudaGetErrorString(error);
  }
  const bool swap = !is_reduced(args.types.x) && is_reduced(args.types.residual);
  const void* narrower = swap ? args.residual : args.x;
  const void* wider = swap ? args.x : args.residual;
  const int64_t rows = activations.rows;
  const int64_t channels = activations.channels;
  with_forward_types(
      swap ? args.types.residual : args.types.x,
      swap ? args.types.x : args.types.residual,
      args.types.output,
      [&](auto a_tag, auto b_tag, auto sum_tag, auto output_tag) {
        using TA = typename decltype(a_tag)::type;
        using TB = typename decltype(b_tag)::type;
        using TS = typename decltype(sum_tag)::type;
        using TO = typename decltype(output_tag)::type;
        constexpr int kWidth = VectorWidth<TA, TB, TS, TO>::kWide;
        const bool wide = channels % kWidth == 0 && aligned_for<TA>(narrower, kWidth) &&
                          aligned_for<TB>(wider, kWidth) && aligned_for<TS>(args.sum, kWidth) &&
                          aligned_for<TO>(args.output, kWidth);
        const auto launch = [&](auto width) {
          add_layer_norm_forward_kernel<TA, TB, TS, TO, decltype(width)::value>
              <<<row_blocks(rows), kThreads, 0, activations.stream>>>(
                  static_cast<const TA*>(narrower),
                  static_cast<const TB*>(wider),
                  args.weight,
                  args.bias,
                  rows,
                  channels,
                  args.eps,
                  static_cast<TS*>(args.sum),
                  static_cast<TO*>(args.output),
                  args.mean,
                  args.rstd);
        };
        if (wide) {
          launch(std::integral_constant<int, kWidth>());
        } else {
          launch(std::integral_constant<int, 1>());
        }
      });
  return last_error();
}

const char*
add_layer_norm_backward(const Activations& activations, const AddLayerNormBackwardArguments& args) {
  if (!add_layer_norm_supports(args.types)) {
    return "add_layer_norm_backward: unsupported dtypes";
  }
  if (const cudaError_t error = cudaSetDevice(activations.device); error != cudaSuccess) {
    return cudaGetErrorString(error);
  }
  const int64_t rows = activations.rows;
  const int64_t channels = activations.channels;
  const bool parameters = args.grad_weight != nullptr;
  with_backward_types(args.types.sum, args.types.output, [&](auto sum_tag, auto output_tag) {
    using TS = typename decltype(sum_tag)::type;
    using TO = typename decltype(output_tag)::type;
    constexpr int kWidth = VectorWidth<TS, TO>::kWide;
    const bool wide = channels % kWidth == 0 && aligned_for<TO>(args.grad_output, kWidth) &&
                      aligned_for<TS>(args.grad_sum, kWidth) && aligned_for<TS>(args.sum, kWidth) &&
                      aligned_for<TS>(args.grad_sum_total, kWidth);
    const auto launch = [&](auto width) {
      constexpr int V = decltype(width)::value;
      add_layer_norm_backward_kernel<TS, TO, V>
          <<<row_blocks(rows), kThreads, 0, activations.stream>>>(
              static_cast<const TO*>(args.grad_output),
              static_cast<const TS*>(args.grad_sum),
              static_cast<const TS*>(args.sum),
              args.weight,
              args.mean,
              args.rstd,
              rows,
              channels,
              static_cast<TS*>(args.grad_sum_total));
      if (!parameters) {
        return;
      }
      const Shape shape = shape_for(channels, V);
      const dim3 grid(unsigned(shape.grid_x), unsigned(args.reduction.chunks));
      layer_norm_parameters_backward_kernel<TS, TO, V>
          <<<grid,
             dim3(shape.block_x, shape.block_y),
             2 * V * kThreads * sizeof(float),
             activations.stream>>>(
              static_cast<const TO*>(args.grad_output),
              static_cast<const TS*>(args.sum),
              args.mean,
              args.rstd,
              rows,
              channels,
              args.reduction.rows_per_chunk,
              args.workspace,
              args.workspace + args.reduction.chunks * channels);
    };
    if (wide) {
      launch(std::integral_constant<int, kWidth>());
    } else {
      launch(std::integral_constant<int, 1>());
    }
  });
  if (const char* error = last_error(); error != nullptr || !parameters) {
    return error;
  }
  const cudaStream_t stream = activations.stream;
  if (const char* error = launch_sum_chunks(
          args.workspace, args.reduction.chunks, channels, args.grad_weight, stream);
      error != nullptr) {
    return error;
  }
  return launch_sum_chunks(
      args.workspace + args.reduction.chunks * channels,
      args.reduction.chunks,
      channels,
      args.grad_bias,
      stream);
}

} // namespace largo::kernels::cuda
