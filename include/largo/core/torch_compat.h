// Every difference between the libtorch versions Largo builds against lives here:
// Debian's libtorch 1.13 (CPU) and the libtorch 2.x (+CUDA) inside PyTorch wheels.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#define LARGO_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace largo::compat {

// True when this libtorch was built with CUDA and a device is visible.
inline bool cuda_available() {
  return torch::cuda::is_available();
}

} // namespace largo::compat
