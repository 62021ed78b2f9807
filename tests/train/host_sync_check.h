// While one lives, any CUDA call that makes the host wait for the device (a tensor read with
// item(), a copy to the host, a stream or device synchronisation) throws c10::Error, through
// c10's sync debug mode (torch.cuda.set_sync_debug_mode("error") in Python). For tests that a
// piece of code queues its work without waiting. The mode in effect before is restored after.
#pragma once

#if __has_include(<c10/cuda/CUDAFunctions.h>)
#include <c10/cuda/CUDAFunctions.h>
#define LARGO_HAS_CUDA_SYNC_DEBUG 1
#endif

namespace largo::testing {

class HostSyncCheck {
 public:
#ifdef LARGO_HAS_CUDA_SYNC_DEBUG
  HostSyncCheck() : before_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~HostSyncCheck() {
    c10::cuda::warning_state().set_sync_debug_mode(before_);
  }
  static constexpr bool available() {
    return true;
  }
#else
  HostSyncCheck() = default;
  static constexpr bool available() { // a libtorch without CUDA: nothing to check
    return false;
  }
#endif
  HostSyncCheck(const HostSyncCheck&) = delete;
  HostSyncCheck& operator=(const HostSyncCheck&) = delete;

 private:
#ifdef LARGO_HAS_CUDA_SYNC_DEBUG
  c10::cuda::SyncDebugMode before_;
#endif
};

} // namespace largo::testing
