#include <largo/optim/tensor_norms.h>

#include "multi_tensor_cpu.h"

#include <largo/core/error.h>

#include <fmt/format.h>

namespace largo::optim {

at::Tensor reduce_partials(
    const PartialNormReducer& reducer, const at::Tensor& partials, NormReduceOp op) {
  if (!reducer) {
    return partials;
  }
  at::Tensor reduced = reducer(partials, op);
  if (!reduced.defined() || reduced.sizes() != partials.sizes()) {
    throw Error(fmt::format(
        "the partial-norm reducer returned a tensor of shape [{}] for partials of shape [{}]; "
        "it must return the reduced values in the shape it was given",
        reduced.defined() ? fmt::format("{}", fmt::join(reduced.sizes(), ", ")) : "undefined",
        fmt::join(partials.sizes(), ", ")));
  }
  return reduced;
}

at::Tensor squared_norms(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) {
    return at::empty({0}, at::kDouble);
  }
  const at::Device device = tensors.front().device();
  std::vector<size_t> fused;     // indices of tensors the CPU pass handles
  std::vector<int64_t> numels;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].device() != device) {
      throw Error(fmt::format(
          "squared_norms: tensor {} is on {} but tensor 0 is on {}; norms are computed per "
          "device",
          i, tensors[i].device().str(), device.str()));
    }
    if (detail::can_use_cpu_kernels({&tensors[i]})) {
      fused.push_back(i);
      numels.push_back(tensors[i].numel());
    }
  }
  if (!device.is_cpu()) {
    std::vector<at::Tensor> norms;
    for (const at::Tensor& t : tensors) {
      norms.push_back(at::linalg_vector_norm(t.detach(), 2, c10::nullopt, false, at::kDouble).square());
    }
    return at::stack(norms);
  }

  at::Tensor result = at::empty({static_cast<int64_t>(tensors.size())}, at::kDouble);
  auto* out = result.data_ptr<double>();
  std::vector<bool> done(tensors.size(), false);
  const std::vector<detail::Chunk> chunks = detail::make_chunks(numels);
  std::vector<double> partials(chunks.size());
  detail::for_each_chunk(chunks, [&](int64_t i, const detail::Chunk& chunk) {
    const at::Tensor& t = tensors[fused[static_cast<size_t>(chunk.tensor)]];
    AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "squared_norms", [&] {
      partials[static_cast<size_t>(i)] =
          detail::sum_of_squares(t.data_ptr<scalar_t>(), chunk.begin, chunk.end);
    });
  });
  const std::vector<double> totals = detail::sum_per_tensor(chunks, partials, fused.size());
  for (size_t k = 0; k < fused.size(); ++k) {
    out[fused[k]] = totals[k];
    done[fused[k]] = true;
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!done[i]) { // e.g. bfloat16 or a strided view
      out[i] = at::linalg_vector_norm(tensors[i].detach(), 2, c10::nullopt, false, at::kDouble)
                   .square()
                   .item<double>();
    }
  }
  return result;
}

} // namespace largo::optim
