// Bias + GELU fused: y = gelu(input + bias), what a ViT MLP's fc1 computes after its matmul
// (models/vit.cpp: at::gelu(linear(x))), as one pass over memory each way on CUDA, where ATen
// runs the add and the GELU as separate kernels (issue 43, part 2). The matmul stays ATen's
// (at::matmul / at::mm without the bias), then this.
//
// Callers call it unconditionally. The fused kernels (src/largo/kernels/*.cu) run when all of
//   - Largo was built with them (cuda_kernels_compiled());
//   - `input` is a contiguous CUDA tensor of float32, bfloat16 or float16, with at least one
//     dimension and no zero-sized one;
//   - `bias` is a contiguous [N] tensor (N = input's last size) on input's device, of float32
//     or input's dtype;
// Anything else runs ATen's unfused sequence:
//   at::gelu(input + bias.to(input.scalar_type()), approximate)
// (on the CPU bit for bit). The bias is cast to the input's dtype first, as autocast's
// at::linear casts fc1's float32 bias to the bfloat16 of its matmul: with autocast on, the
// matmul's bfloat16 output and the model's float32 bias give a bfloat16 activation, as the
// unsplit linear + gelu does (without the cast ATen's type promotion would give float32, which
// would change the model's dtypes, not fuse it). Where bias has input's dtype the cast is a
// no-op and this is exactly at::gelu(input + bias).
//
// approximate: "none" (the exact GELU, 0.5 z (1 + erf(z / sqrt 2)), nn.GELU()'s default and
// the ViT's) or "tanh" (ATen's tanh formula), as at::gelu takes them. cuBLASLt's GELU epilogue
// (CUBLASLT_EPILOGUE_GELU_BIAS), which would fold this into the matmul, computes the tanh
// approximation only: the project does not use it for the exact-GELU ViT, since that would
// change the model, not fuse it (the two functions differ by up to 4.7e-4, at z = -2.7: a
// systematic difference, not a rounding: a model trained or evaluated with one GELU is not the
// model of the other, and a float32 run's outputs would move far beyond float32's rounding).
//
// The fused path: forward reads input and writes y; it keeps `input` for backward and
// recomputes z = input + bias there (see bias_gelu.cpp for why not the pre-activation).
// Backward (autograd): grad_input = grad * gelu'(z), and grad_bias = the sum of that over every
// dimension but the last, in float32 by a fixed-order reduction (no atomics: deterministic),
// returned in bias's dtype. z and gelu are evaluated in float32 and rounded to input's dtype
// once (ATen rounds z to input's dtype before the GELU); results equal ATen's within rounding
// (tests/kernels/transformer_fusions_cuda_test.cpp says how close), not bit for bit. No double
// backward.
#pragma once

#include <ATen/ATen.h>

#include <string_view>

namespace largo::kernels {

// gelu(input + bias) over input's last dimension. Throws c10::Error (TORCH_CHECK) naming the
// argument, on either path: `input` or `bias` undefined, `input` 0-dimensional, `bias` not
// [input.size(-1)] or on another device, `approximate` neither "none" nor "tanh".
at::Tensor bias_gelu(
    const at::Tensor& input, // [..., N], e.g. [batch, tokens, mlp_dim]
    const at::Tensor& bias,  // [N]
    std::string_view approximate = "none");

// Whether a call with these arguments would run the fused CUDA kernels (the conditions above).
bool uses_fused_bias_gelu(const at::Tensor& input, const at::Tensor& bias);

} // namespace largo::kernels
