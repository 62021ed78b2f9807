// BatchNorm fused with ReLU, and with a residual add then ReLU: the convolutional trunks'
//   y = relu(batch_norm(x))              (after every convolution but a block's last)
//   y = relu(batch_norm(x) + residual)   (a residual block's end)
// in one pass over memory each way on CUDA, where ATen runs BatchNorm, the add and the ReLU as
// separate kernels (issue 43: BatchNorm is 46 % of ResNet-50's GPU step on an H200).
//
// Callers call them unconditionally. The fused kernels (src/largo/kernels/*.cu) run when all of
//   - Largo was built with them (cuda_kernels_compiled(): a CUDA libtorch and nvcc);
//   - `input` is a CUDA tensor, 4-D [N, C, H, W] with exactly channels-last strides
//     (has_channels_last_strides), of float32, bfloat16 or float16, with N * H * W > 0, C > 0;
//   - `weight` and `bias` are defined float32 contiguous [C] tensors on its device, and so are
//     `running_mean` and `running_var` where defined (both or neither);
//   - `residual` (the add variant) has `input`'s dtype, sizes, device and strides;
// which is what autocast gives a channels-last trunk: activations in bfloat16/float16, the
// BatchNorm's parameters and statistics in float32 (as ATen's cuDNN/native BatchNorm take them).
// Anything else takes ATen's unfused sequence, exactly what the trunks ran before:
//   at::batch_norm(...).relu_()    and    (at::batch_norm(...) += residual).relu_()
// (so on the CPU these are ATen's ops, bit for bit).
//
// The fused path, forward: in training, per-channel mean and biased variance over N * H * W
// (float32, Welford), running_mean / running_var updated in place as ATen does
// (running = (1 - momentum) * running + momentum * batch, the variance unbiased); in evaluation,
// running_mean / running_var normalise. Backward (autograd): gradients for input, weight, bias
// and residual, the ReLU's mask taken from the output (y > 0, as ATen's relu backward does);
// no double backward. Results equal ATen's within rounding (tests/kernels say how close), not
// bit for bit: the reductions are ordered differently, and the add variant rounds once where
// ATen rounds the BatchNorm output before the add.
//
// No collectives: SyncBatchNorm keeps ATen's path.
#pragma once

#include <ATen/ATen.h>

namespace largo::kernels {

// relu(batch_norm(input)): arguments as at::batch_norm's (the running statistics may be
// undefined in training). Throws c10::Error (TORCH_CHECK), naming the argument and its value,
// on either path for what ATen's BatchNorm refuses too: `input` not 4-D, a defined parameter or
// statistic that is not [C], one running statistic without the other, evaluation without
// them, training with one value per channel.
at::Tensor batch_norm_relu(
    const at::Tensor& input,        // [N, C, H, W]
    const at::Tensor& weight,       // [C]
    const at::Tensor& bias,         // [C]
    const at::Tensor& running_mean, // [C], updated in place in training
    const at::Tensor& running_var,  // [C], updated in place in training
    bool training,
    double momentum,
    double eps);

// relu(batch_norm(input) + residual); `residual` must have `input`'s sizes (checked) and, for
// ATen's path, a dtype that adds to it in place.
at::Tensor batch_norm_add_relu(
    const at::Tensor& input,    // [N, C, H, W]
    const at::Tensor& residual, // [N, C, H, W]
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    bool training,
    double momentum,
    double eps);

// Whether this build holds the CUDA kernels (else every call takes ATen's path).
bool cuda_kernels_compiled();

// The fused forward alone, without autograd: the output and the statistics it normalised with,
// which the autograd function saves for backward (the batch's in training, the running ones in
// evaluation). For tests, and callers that run their own backward. Throws unless
// uses_fused_batch_norm(...) holds for the arguments (`residual` undefined: no add).
struct FusedBatchNormReluForward {
  at::Tensor output;      // [N, C, H, W], input's dtype and strides
  at::Tensor save_mean;   // [C] float32
  at::Tensor save_invstd; // [C] float32: 1 / sqrt(variance + eps)
};
FusedBatchNormReluForward fused_batch_norm_relu_forward(
    const at::Tensor& input,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    bool training,
    double momentum,
    double eps);

// Whether a call with these arguments would run the fused CUDA kernels (the conditions above);
// `residual` undefined for batch_norm_relu.
bool uses_fused_batch_norm(
    const at::Tensor& input,
    const at::Tensor& residual,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var);

} // namespace largo::kernels
