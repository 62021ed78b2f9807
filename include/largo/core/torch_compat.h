// Every difference between the libtorch versions Largo builds against lives here:
// Debian's libtorch 1.13 (CPU) and the libtorch 2.x (+CUDA) inside PyTorch wheels.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#define LARGO_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

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

} // namespace largo::compat
