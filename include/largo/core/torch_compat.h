// Every difference between the libtorch versions Largo builds against lives here:
// Debian's libtorch 1.13 (CPU) and the libtorch 2.x (+CUDA) inside PyTorch wheels.
#pragma once

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <torch/torch.h>
#include <torch/version.h>

#define LARGO_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// c10::Allocator::allocate() is const up to libtorch 2.2 and non-const from 2.3, which also
// added the pure virtual copy_data(). Allocator subclasses declare
//   c10::DataPtr allocate(size_t n) LARGO_ALLOCATOR_ALLOCATE_CONST override;
#if LARGO_TORCH_AT_LEAST(2, 3)
#define LARGO_ALLOCATOR_ALLOCATE_CONST
#define LARGO_ALLOCATOR_HAS_COPY_DATA 1
#else
#define LARGO_ALLOCATOR_ALLOCATE_CONST const
#define LARGO_ALLOCATOR_HAS_COPY_DATA 0
#endif

// CUDA memory statistics through the device-generic at::accelerator API (libtorch >= 2.9),
// which needs no CUDA headers or c10_cuda at build time.
#define LARGO_HAS_ACCELERATOR_MEMORY_STATS LARGO_TORCH_AT_LEAST(2, 9)

namespace c10d {
class ProcessGroup;
class Backend;
} // namespace c10d

namespace largo::compat {

// The c10d class that ProcessGroupGloo / ProcessGroupNCCL derive from and that carries the
// collectives: ProcessGroup in 1.13, Backend from 2.0 on (ProcessGroup became a dispatcher).
#if LARGO_TORCH_AT_LEAST(2, 0)
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// True when this libtorch was built with CUDA and a device is visible.
inline bool cuda_available() {
  return torch::cuda::is_available();
}

// ---- autocast -------------------------------------------------------------------------
// libtorch up to 2.3 has one switch and one dtype per device kind
// (at::autocast::set_enabled / set_autocast_gpu_dtype for CUDA, set_cpu_enabled /
// set_autocast_cpu_dtype for the CPU). 2.4 made them device-generic
// (set_autocast_enabled(device_type, on), set_autocast_dtype(device_type, dtype)) and
// deprecated the old ones. clear_cache, increment_nesting and decrement_nesting are the same
// in both. Largo only autocasts on the CPU and CUDA; other device kinds are rejected by the
// precision policy before they get here.

inline bool is_autocast_enabled(c10::DeviceType device_type) {
#if LARGO_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device_type);
#else
  return device_type == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                              : at::autocast::is_cpu_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
#if LARGO_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device_type, enabled);
#else
  if (device_type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
#endif
}

inline at::ScalarType get_autocast_dtype(c10::DeviceType device_type) {
#if LARGO_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device_type);
#else
  return device_type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                              : at::autocast::get_autocast_cpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device_type, at::ScalarType dtype) {
#if LARGO_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device_type, dtype);
#else
  if (device_type == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

// ---- TF32 -------------------------------------------------------------------------------
// torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32. The same
// at::Context setters exist in 1.13 and 2.x (2.9 added a finer-grained fp32_precision API
// beside them); on a CPU-only build they only store the flags.
inline void set_allow_tf32(bool matmul, bool cudnn) {
  at::globalContext().setAllowTF32CuBLAS(matmul);
  at::globalContext().setAllowTF32CuDNN(cudnn);
}

inline bool allow_tf32_matmul() {
  return at::globalContext().allowTF32CuBLAS();
}

inline bool allow_tf32_cudnn() {
  return at::globalContext().allowTF32CuDNN();
}

// ---- collectives -------------------------------------------------------------------------
// libtorch 1.13's ProcessGroupGloo rejects bfloat16 tensors ("Invalid scalar type"); the 2.x
// sources (checked: 2.11) reduce them. The first 2.x release with it was not pinned down, so
// the 2.x side of this switch is only known for 2.11.
constexpr bool kGlooReducesBFloat16 = LARGO_TORCH_AT_LEAST(2, 0);

} // namespace largo::compat
