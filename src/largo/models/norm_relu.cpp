#include <largo/models/norm_relu.h>

#include <largo/kernels/batch_norm_relu.h>

#include <torch/nn/modules/batchnorm.h>

#include <typeinfo>

namespace largo::models {
namespace {

// The layer when the fused call can stand in for its forward: a BatchNorm2d itself (a derived
// SyncBatchNorm computes other statistics) with an exponential moving average (a cumulative
// one reads num_batches_tracked on the host, which the module's forward keeps doing).
torch::nn::BatchNorm2dImpl* fusable_batch_norm(torch::nn::AnyModule& norm) {
  torch::nn::Module* module = norm.ptr().get();
  if (typeid(*module) != typeid(torch::nn::BatchNorm2dImpl)) {
    return nullptr;
  }
  auto* batch_norm = static_cast<torch::nn::BatchNorm2dImpl*>(module);
  return batch_norm->options.momentum().has_value() ? batch_norm : nullptr;
}

// What BatchNorm2dImpl::forward does before its batch_norm call: count the batch when it
// tracks running statistics in training. Returns whether the call uses batch statistics.
bool count_batch(torch::nn::BatchNorm2dImpl& batch_norm) {
  const bool tracks = batch_norm.options.track_running_stats();
  if (batch_norm.is_training() && tracks && batch_norm.num_batches_tracked.defined()) {
    batch_norm.num_batches_tracked += 1;
  }
  return batch_norm.is_training() || !tracks;
}

at::Tensor fused_call(
    torch::nn::BatchNorm2dImpl& batch_norm, const at::Tensor& x, const at::Tensor& residual) {
  const bool batch_statistics = count_batch(batch_norm);
  const double momentum = *batch_norm.options.momentum();
  const double eps = batch_norm.options.eps();
  if (residual.defined()) {
    return kernels::batch_norm_add_relu(
        x,
        residual,
        batch_norm.weight,
        batch_norm.bias,
        batch_norm.running_mean,
        batch_norm.running_var,
        batch_statistics,
        momentum,
        eps);
  }
  return kernels::batch_norm_relu(
      x,
      batch_norm.weight,
      batch_norm.bias,
      batch_norm.running_mean,
      batch_norm.running_var,
      batch_statistics,
      momentum,
      eps);
}

} // namespace

at::Tensor norm_relu(torch::nn::AnyModule& norm, const at::Tensor& x, bool fused) {
  if (auto* batch_norm = fused ? fusable_batch_norm(norm) : nullptr) {
    return fused_call(*batch_norm, x, at::Tensor());
  }
  return norm.forward(x).relu_();
}

at::Tensor norm_add_relu(
    torch::nn::AnyModule& norm, const at::Tensor& x, const at::Tensor& residual, bool fused) {
  if (auto* batch_norm = fused ? fusable_batch_norm(norm) : nullptr) {
    return fused_call(*batch_norm, x, residual);
  }
  at::Tensor out = norm.forward(x);
  out += residual;
  return out.relu_();
}

} // namespace largo::models
