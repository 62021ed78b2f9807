// TF32 (TensorFloat-32) for float32 work on Ampere and newer NVIDIA GPUs: matmuls (cuBLAS)
// and convolutions (cuDNN) round their inputs to 10 bits of mantissa and run on tensor
// cores. Config keys MACHINE.ALLOW_TF32_MATMUL and MACHINE.ALLOW_TF32_CUDNN; the defaults
// are PyTorch's (matmul off since 1.12, cuDNN on). The switches are process-wide; on a CPU
// build libtorch only stores them, so they are harmless there.
#pragma once

namespace largo::precision {

struct Tf32Options {
  bool matmul = false; // torch.backends.cuda.matmul.allow_tf32
  bool cudnn = true;   // torch.backends.cudnn.allow_tf32
};

void apply_tf32(const Tf32Options& options);

} // namespace largo::precision
