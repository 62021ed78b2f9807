// Which of ATen's scaled-dot-product-attention kernels CUDA attention tries first: the ViT's
// (models/vit.cpp calls at::scaled_dot_product_attention) and any other in the process. ATen
// picks the first backend in its priority order that takes the inputs (dtype, head size,
// dropout, layout) and falls through to the next otherwise, so a preferred backend that cannot
// run a call changes nothing for it. The switch is process-wide, as PyTorch's
// torch.backends.cuda settings are; the CPU's attention has its own choice and ignores it.
// MACHINE.ATTENTION_BACKEND; measured by bench/attention_backend_bench.cpp.
#pragma once

#include <string>
#include <vector>

namespace largo::models {

enum class AttentionBackend {
  kAuto,            // ATen's priority order as it was before Largo changed it
  kFlash,           // FlashAttention-2
  kMemoryEfficient, // xFormers' memory-efficient kernel
  kCudnn,           // cuDNN's fused attention
  kMath,            // the unfused matmul-softmax-matmul
};

// Puts `backend` first in ATen's priority order, the others after it in the order ATen had
// (kAuto: that order itself).
void prefer_attention_backend(AttentionBackend backend);

// The backend first in ATen's priority order now (kAuto when the order is the original one).
AttentionBackend preferred_attention_backend();

// "auto", "flash", "efficient", "cudnn", "math": the names MACHINE.ATTENTION_BACKEND takes.
std::vector<std::string> attention_backend_names();
// The backend of one of those names; std::invalid_argument for another.
AttentionBackend attention_backend_from_name(const std::string& name);

} // namespace largo::models
