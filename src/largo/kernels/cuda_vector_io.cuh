// Device helpers the kernels of this folder share: conversions between the activation dtypes
// (float, bfloat16, half) and float32, and one thread's vector of V elements loaded or stored
// as a single aligned access (16 bytes: the widest load a thread issues).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace largo::kernels::cuda::vector_io {

template <typename T>
__device__ __forceinline__ float to_float(T value);
template <>
__device__ __forceinline__ float to_float<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half value) {
  return __half2float(value);
}

// Round to nearest even, as ATen's float -> bfloat16 / half conversions.
template <typename T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ float from_float<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float value) {
  return __float2half_rn(value);
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Vector {
  T value[V];
};

template <typename T, int V>
__device__ __forceinline__ void load(const T* __restrict__ from, float (&to)[V]) {
  const Vector<T, V> vector = *reinterpret_cast<const Vector<T, V>*>(from);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    to[j] = to_float(vector.value[j]);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store(const float (&from)[V], T* __restrict__ to) {
  Vector<T, V> vector;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    vector.value[j] = from_float<T>(from[j]);
  }
  *reinterpret_cast<Vector<T, V>*>(to) = vector;
}

} // namespace largo::kernels::cuda::vector_io
