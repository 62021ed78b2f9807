// Residual add fused with the LayerNorm that follows it: a transformer block's
//   sum = x + residual                         (the residual stream the next block reads)
//   output = layer_norm(sum) over the last dimension (ViT-B: 768)
// in one pass over memory each way on CUDA, where ATen runs the add and the LayerNorm as
// separate kernels and, in backward, adds the LayerNorm's input gradient to the gradient that
// reached `sum` directly in a third (issue 43, part 2).
//
// Callers call it unconditionally. The fused kernels (src/largo/kernels/*.cu) run when all of
//   - Largo was built with them (cuda_kernels_compiled());
//   - `x` and `residual` are contiguous CUDA tensors of the same sizes (at least one dimension,
//     none zero-sized), of equal dtypes among float32, bfloat16 and float16, or one float32 and
//     the other bfloat16 / float16 (the sum is then float32, as ATen promotes: a ViT under
//     autocast has a float32 residual stream and bfloat16 branch outputs);
//   - `weight` and `bias` are defined contiguous [D] tensors (D = x's last size) on x's device,
//     of one dtype: float32 or the sum's dtype (with CUDA autocast on, also any of the three,
//     which autocast casts to float32);
// Anything else runs ATen's unfused sequence (on the CPU bit for bit):
//   sum = x + residual;  output = at::layer_norm(sum, {D}, weight, bias, eps)
//
// The dtype contract, which the fused path mirrors exactly:
//   - sum has ATen's promoted dtype of x and residual;
//   - output: with CUDA autocast on (at::autocast::is_autocast_enabled(at::kCUDA)), float32,
//     since autocast runs layer_norm in float32 (it is on autocast's float32 list: the sum,
//     weight and bias are cast to float32 and so is the result; the next linear casts it back
//     to the autocast dtype); without autocast, the sum's dtype (ATen's layer_norm returns its
//     input's dtype, with float32 or input-dtype weights alike);
//   - gradients in each argument's own dtype.
// transformer_fusions_cuda_test checks the first two against ATen's on a GPU, autocast included.
//
// The fused path: forward writes sum (rounded to its dtype) and normalises that rounded sum, as
// ATen's layer_norm does; mean and 1 / sqrt(var + eps) per row in float32 (Welford's update,
// merged in a fixed tree), saved for backward with sum. Backward (autograd): the gradient of
// sum is the LayerNorm's input gradient plus any gradient that reached sum directly, rounded
// once (the gradient of x and of residual, each cast to its dtype); grad_weight and grad_bias
// are fixed-order float32 column sums, in the parameters' dtype. No atomics: deterministic.
// Results equal ATen's within rounding (tests/kernels/transformer_fusions_cuda_test.cpp says how
// close), not bit for bit (`sum` is bit for bit: the same add and rounding). No double backward.
#pragma once

#include <ATen/ATen.h>

namespace largo::kernels {

struct AddLayerNormOutput {
  at::Tensor sum;    // [..., D]: x + residual, the residual stream
  at::Tensor output; // [..., D]: layer_norm(sum)
};

// x + residual and its LayerNorm over the last dimension; `weight` / `bias` may be undefined
// (then ATen's path, as at::layer_norm takes them). Throws c10::Error (TORCH_CHECK) naming the
// argument, on either path: x or residual undefined, x 0-dimensional, residual not of x's sizes
// or not on its device, a defined weight or bias not [D] or not on x's device.
AddLayerNormOutput add_layer_norm(
    const at::Tensor& x,        // [..., D], e.g. [batch, tokens, hidden]: a branch's output
    const at::Tensor& residual, // [..., D]: the residual stream
    const at::Tensor& weight,   // [D]
    const at::Tensor& bias,     // [D]
    double eps);

// Whether a call with these arguments would run the fused CUDA kernels (the conditions above;
// the autocast state is the current thread's).
bool uses_fused_add_layer_norm(
    const at::Tensor& x,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias);

} // namespace largo::kernels
