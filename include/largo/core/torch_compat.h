// Every difference between the libtorch versions Largo builds against lives here:
// Debian's libtorch 1.13 (CPU) and the libtorch 2.x (+CUDA) inside PyTorch wheels.
#pragma once

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

// Autocast's thread-local switches for one device type (kCPU or kCUDA). libtorch 2.4 made
// them per device type; 1.13 has one function pair per device.
inline bool autocast_enabled(c10::DeviceType device_type) {
#if LARGO_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device_type);
#else
  return device_type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                             : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
#if LARGO_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device_type, enabled);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

inline at::ScalarType autocast_dtype(c10::DeviceType device_type) {
#if LARGO_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device_type);
#else
  return device_type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                             : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device_type, at::ScalarType dtype) {
#if LARGO_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device_type, dtype);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

} // namespace largo::compat
