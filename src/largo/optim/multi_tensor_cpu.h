// CPU multi-tensor apply (private to the optim layer): runs one per-element kernel over
// many tensors in a single parallel region instead of one small ATen op per tensor.
//
// The tensors are cut into chunks of at most kChunkElements; the chunks of all tensors
// form one work list that at::parallel_for shares among the threads, so ResNet-50's 161
// parameters (from 64 to 2.4 M elements) cost one fork/join per pass, not 161. Reductions
// (norms) keep one partial per chunk and add the partials of a tensor in chunk order, so
// their result does not depend on the number of threads (bit-reproducible runs).
//
// Only the update kernels in sgd.cpp, adam_update.cpp, rmsprop.cpp, lamb.cpp, larc.cpp,
// tensor_norms.cpp and grad_clipping.cpp use this; tensors that fail can_use_cpu_kernels() take
// those files' tensor-op (foreach) path instead, which is also the path on other devices.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace largo::optim::detail {

// 32 Ki elements: 128 KiB of float32 per tensor in a chunk, small enough to balance the
// work between threads and large enough that the per-chunk overhead disappears.
constexpr int64_t kChunkElements = int64_t{1} << 15;

// True when the tensors can go through the CPU kernels: all defined, on the CPU, of the
// same floating dtype (float32 or float64), the same shape and the same strides, dense and
// non-overlapping (so element i of each is at the same offset from its data pointer).
inline bool can_use_cpu_kernels(std::initializer_list<const at::Tensor*> tensors) {
  const at::Tensor* first = *tensors.begin();
  if (!first->defined() || !first->device().is_cpu() ||
      (first->scalar_type() != at::kFloat && first->scalar_type() != at::kDouble) ||
      !first->is_non_overlapping_and_dense()) {
    return false;
  }
  for (const at::Tensor* t : tensors) {
    if (!t->defined() || !t->device().is_cpu() || t->scalar_type() != first->scalar_type() ||
        t->sizes() != first->sizes() || t->strides() != first->strides() ||
        !t->is_non_overlapping_and_dense()) {
      return false;
    }
  }
  return true;
}

// Elements [begin, end) of tensor `tensor` (an index into the caller's list).
struct Chunk {
  int64_t tensor = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

inline std::vector<Chunk> make_chunks(const std::vector<int64_t>& numels) {
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < numels.size(); ++t) {
    for (int64_t begin = 0; begin < numels[t]; begin += kChunkElements) {
      chunks.push_back({static_cast<int64_t>(t), begin, std::min(numels[t], begin + kChunkElements)});
    }
  }
  return chunks;
}

// The chunks of a fused pass's items (anything with a `param` tensor), in item order.
template <typename Item>
std::vector<Chunk> chunks_of_items(const std::vector<Item>& items) {
  std::vector<int64_t> numels;
  numels.reserve(items.size());
  for (const Item& item : items) {
    numels.push_back(item.param.numel());
  }
  return make_chunks(numels);
}

// Calls fn(chunk_index, chunk) once for every chunk, in parallel over the chunks.
template <typename Fn>
void for_each_chunk(const std::vector<Chunk>& chunks, const Fn& fn) {
  const auto num_chunks = static_cast<int64_t>(chunks.size());
  if (num_chunks == 0) {
    return;
  }
  at::parallel_for(0, num_chunks, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      fn(i, chunks[static_cast<size_t>(i)]);
    }
  });
}

// Per-tensor totals of per-chunk partial sums, added in chunk order.
inline std::vector<double> sum_per_tensor(
    const std::vector<Chunk>& chunks, const std::vector<double>& partials, size_t num_tensors) {
  std::vector<double> totals(num_tensors, 0.0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    totals[static_cast<size_t>(chunks[i].tensor)] += partials[i];
  }
  return totals;
}

// Calls fn(std::true_type{}) or fn(std::false_type{}): turns a run-time switch into a
// compile-time one, so that each kernel loop is straight-line code the compiler vectorizes
// (nest calls for several switches).
template <typename Fn>
void with_flag(bool flag, Fn&& fn) {
  if (flag) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

// ATen's lerp(self, end, weight) (ATen/native/Lerp.h), which torch.optim's moving averages
// call (Adam's exp_avg, centered RMSprop's grad_avg): one of two forms by the size of the
// weight, each exact at its end of [0, 1]. A per-element kernel calls it to round as ATen does.
template <typename scalar_t>
scalar_t aten_lerp(scalar_t self, scalar_t end, scalar_t weight) {
  return std::abs(weight) < scalar_t(0.5) ? self + weight * (end - self)
                                          : end - (end - self) * (scalar_t(1) - weight);
}

// Sum of x * x over [begin, end), returned in float64, in an order fixed by the code (hence
// reproducible) and written so the compiler vectorizes it: eight accumulators of the
// tensor's type over blocks of 64 elements, the block sums added in float64. For float32
// a block sum has a relative error below 1e-6 (worst case, 8 additions per accumulator),
// which norms used as trust ratios or clipping factors do not notice; converting every
// element to float64 instead made LAMB's and LARC's norm passes compute-bound.
template <typename scalar_t>
double sum_of_squares(const scalar_t* data, int64_t begin, int64_t end) {
  constexpr int64_t kBlock = 64;
  double total = 0.0;
  int64_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    scalar_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < kBlock; j += 8) {
      for (int k = 0; k < 8; ++k) {
        const scalar_t x = data[i + j + k];
        acc[k] += x * x;
      }
    }
    total += static_cast<double>(((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                                 ((acc[4] + acc[5]) + (acc[6] + acc[7])));
  }
  for (; i < end; ++i) {
    const auto x = static_cast<double>(data[i]);
    total += x * x;
  }
  return total;
}

} // namespace largo::optim::detail
