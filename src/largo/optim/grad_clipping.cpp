#include <largo/optim/grad_clipping.h>

#include "multi_tensor_cpu.h"

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace largo::optim {
namespace {

// Sum of |x|^p (or the max |x| for inf) over [begin, end), accumulated in float64.
template <typename scalar_t>
double partial_kernel(const scalar_t* data, int64_t begin, int64_t end, double norm_type) {
  if (norm_type == 2.0) {
    return detail::sum_of_squares(data, begin, end);
  }
  double acc = 0.0;
  if (std::isinf(norm_type)) {
    for (int64_t i = begin; i < end; ++i) {
      const double x = std::abs(static_cast<double>(data[i]));
      acc = (x > acc || std::isnan(x)) ? x : acc; // NaN propagates, as in torch.max
    }
  } else if (norm_type == 1.0) {
    for (int64_t i = begin; i < end; ++i) {
      acc += std::abs(static_cast<double>(data[i]));
    }
  } else {
    for (int64_t i = begin; i < end; ++i) {
      acc += std::pow(std::abs(static_cast<double>(data[i])), norm_type);
    }
  }
  return acc;
}

std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& param : params) {
    if (param.grad().defined()) {
      grads.push_back(param.grad());
    }
  }
  return grads;
}

} // namespace

at::Tensor local_grad_norm_partial(const std::vector<at::Tensor>& params, double norm_type) {
  const bool is_max = std::isinf(norm_type);
  const std::vector<at::Tensor> grads = defined_grads(params);
  std::vector<at::Tensor> fused, others;
  for (const at::Tensor& grad : grads) {
    (detail::can_use_cpu_kernels({&grad}) ? fused : others).push_back(grad);
  }
  double fused_total = 0.0;
  if (!fused.empty()) {
    std::vector<int64_t> numels;
    for (const at::Tensor& grad : fused) {
      numels.push_back(grad.numel());
    }
    const auto chunks = detail::make_chunks(numels);
    std::vector<double> partials(chunks.size());
    detail::for_each_chunk(chunks, [&](int64_t c, const detail::Chunk& chunk) {
      const at::Tensor& grad = fused[static_cast<size_t>(chunk.tensor)];
      AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "grad_norm_partial", [&] {
        partials[static_cast<size_t>(c)] =
            partial_kernel(grad.data_ptr<scalar_t>(), chunk.begin, chunk.end, norm_type);
      });
    });
    for (double partial : partials) { // in chunk order: reproducible
      fused_total = is_max ? ((partial > fused_total || std::isnan(partial)) ? partial : fused_total)
                           : fused_total + partial;
    }
  }
  const at::Device device = grads.empty() ? at::Device(at::kCPU) : grads.front().device();
  at::Tensor total = at::full({1}, fused_total, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const at::Tensor& grad : others) {
    const at::Tensor norm =
        at::linalg_vector_norm(grad.detach(), norm_type, c10::nullopt, false, at::kDouble).reshape({1});
    total = is_max ? at::maximum(total, norm) : total + norm.pow(norm_type);
  }
  return total;
}

double clip_grad_norm(
    const std::vector<at::Tensor>& params,
    double max_norm,
    double norm_type,
    const PartialNormReducer& reducer) {
  torch::NoGradGuard no_grad;
  if (!(max_norm > 0.0)) {
    throw ConfigError(
        fmt::format("clip_grad_norm's max_norm = {} is invalid; use a number > 0", max_norm));
  }
  if (!(norm_type > 0.0)) {
    throw ConfigError(fmt::format(
        "clip_grad_norm's norm_type = {} is invalid; use a number > 0 or inf", norm_type));
  }
  const bool is_max = std::isinf(norm_type);
  const at::Tensor partial = reduce_partials(
      reducer, local_grad_norm_partial(params, norm_type),
      is_max ? NormReduceOp::max : NormReduceOp::sum);
  const double reduced = partial.item<double>();
  const double total_norm = is_max ? reduced : std::pow(reduced, 1.0 / norm_type);
  const double clip_coef = max_norm / (total_norm + 1e-6);
  if (clip_coef >= 1.0) {
    return total_norm; // PyTorch multiplies by 1.0 here, which changes nothing
  }
  std::vector<at::Tensor> fused, others;
  for (const at::Tensor& grad : defined_grads(params)) {
    (detail::can_use_cpu_kernels({&grad}) ? fused : others).push_back(grad);
  }
  std::vector<int64_t> numels;
  for (const at::Tensor& grad : fused) {
    numels.push_back(grad.numel());
  }
  detail::for_each_chunk(detail::make_chunks(numels), [&](int64_t, const detail::Chunk& chunk) {
    const at::Tensor& grad = fused[static_cast<size_t>(chunk.tensor)];
    AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "clip_grad_norm", [&] {
      const auto coef = static_cast<scalar_t>(clip_coef);
      scalar_t* data = grad.data_ptr<scalar_t>();
      for (int64_t i = chunk.begin; i < chunk.end; ++i) {
        data[i] = data[i] * coef;
      }
    });
  });
  if (!others.empty()) {
    at::_foreach_mul_(others, clip_coef);
  }
  return total_norm;
}

} // namespace largo::optim
