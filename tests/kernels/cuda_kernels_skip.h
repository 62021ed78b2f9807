// The fused kernels' CUDA tests: skipped without a CUDA device (CI, the CPU machines), failed on
// one whose build lacks the kernels (a GPU run must not pass by testing ATen's fallback).
#pragma once

#include <largo/kernels/batch_norm_relu.h> // cuda_kernels_compiled

#include <gtest/gtest.h>
#include <torch/cuda.h>

#define LARGO_SKIP_WITHOUT_CUDA_KERNELS()                                                          \
  do {                                                                                             \
    if (!torch::cuda::is_available()) {                                                            \
      GTEST_SKIP() << "no CUDA device: the fused kernels are checked on GPU machines only";        \
    }                                                                                              \
    ASSERT_TRUE(largo::kernels::cuda_kernels_compiled())                                           \
        << "a CUDA device, but a build without the kernels";                                       \
  } while (false)
