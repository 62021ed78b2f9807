// A convolutional block's norm layer followed by ReLU, and by a residual add then ReLU:
//   relu(norm(x))    and    relu(norm(x) + residual)
// through largo::kernels' fused BatchNorm + ReLU (kernels/batch_norm_relu.h) when `fused` and
// the layer is a plain torch::nn::BatchNorm2d with a momentum (not a SyncBatchNorm, whose
// statistics are all-reduced; not a GroupNorm or a swapped-in module): the same BatchNorm
// arithmetic as the module's forward (num_batches_tracked counted, the running statistics
// updated), one pass over memory each way on CUDA where the kernels apply (channels-last,
// float32/bfloat16/float16) and ATen's ops otherwise. Anything else runs
// norm.forward(x) (+= residual), relu_(), as the trunks did before. On the CPU both ways are
// ATen's same ops, bit for bit (tested). No collectives.
#pragma once

#include <torch/nn/modules/container/any.h>

namespace largo::models {

at::Tensor norm_relu(torch::nn::AnyModule& norm, const at::Tensor& x, bool fused);
at::Tensor norm_add_relu(
    torch::nn::AnyModule& norm, const at::Tensor& x, const at::Tensor& residual, bool fused);

} // namespace largo::models
