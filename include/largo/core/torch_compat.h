// The libtorch APIs that changed shape in recent releases and that Largo calls, each in one
// place, so that moving to another libtorch changes this file and not its callers.
// Largo builds against one libtorch: the one inside PyTorch's 2.11 wheels (CUDA 13 build, or
// a libtorch download of the same release); older releases are refused here, at compile time.
// (Debian's libtorch 1.13 was supported until 2026-11; its switches are gone.)
#pragma once

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <c10/util/Logging.h>

#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 11)
// scripts/install_deps.sh installs PyTorch 2.11; README.md says how to name another libtorch.
#error "Largo needs libtorch 2.11 or newer"
#endif

namespace largo::compat {

// True when this libtorch was built with CUDA and a device is visible.
inline bool cuda_available() {
  return torch::cuda::is_available();
}

// ---- autocast -------------------------------------------------------------------------
// One switch and one dtype per device type (at::autocast's device-generic API, which replaced
// the per-device set_enabled / set_cpu_enabled pair in 2.4). Largo only autocasts on the CPU
// and CUDA; other device kinds are rejected by the precision policy before they get here.

inline bool is_autocast_enabled(c10::DeviceType device_type) {
  return at::autocast::is_autocast_enabled(device_type);
}

inline void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
  at::autocast::set_autocast_enabled(device_type, enabled);
}

inline at::ScalarType get_autocast_dtype(c10::DeviceType device_type) {
  return at::autocast::get_autocast_dtype(device_type);
}

inline void set_autocast_dtype(c10::DeviceType device_type, at::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device_type, dtype);
}

// ---- generator state ------------------------------------------------------------------
// libtorch 2.11's Generator::set_state crashes (SIGSEGV; torch.set_rng_state in Python too)
// when the state tensor is a view that does not start its storage, e.g. one rank's row of a
// [ranks, 5056] tensor of saved states; 1.13 took such a view. A state tensor of its own is
// taken by both.
inline void set_generator_state(at::Generator& generator, const at::Tensor& state) {
  generator.set_state(state.storage_offset() == 0 ? state : state.clone());
}

// ---- TF32 -------------------------------------------------------------------------------
// torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32: the at::Context
// setters Python's switches call (2.9 added a finer-grained fp32_precision API beside them,
// which these set); without a GPU they only store the flags.
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

// ---- libtorch's log records ------------------------------------------------------------
// A libtorch built without glog (PyTorch's wheels, 2.11) writes each c10 log record (LOG(...),
// c10d's warnings, TORCH_WARN through the default WarningHandler) as one insertion into
// std::cerr plus a flush (c10::MessageLogger's destructor); core/libtorch_log.h routes
// them by replacing std::cerr's buffer. A glog build writes through glog instead.
constexpr bool libtorch_logs_to_std_cerr() {
  return !c10::IsUsingGoogleLogging();
}

} // namespace largo::compat
