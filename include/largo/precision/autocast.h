// An RAII scope that runs the ops inside it under autocast, like Python's
// `with torch.autocast(device_type, dtype):`. Matmuls and convolutions run in the low
// precision, precision-sensitive ops (softmax, losses, norms) in float32, following
// libtorch's per-device autocast op lists.
//
// Scopes nest: each saves the enabled flag and dtype it found and restores them on exit; the
// outermost scope clears autocast's cast cache on exit (the cache holds the low-precision
// copies of weights made during the forward, so they are cast once per forward, not once per
// use). An AutocastGuard with enabled = false turns autocast *off* inside (for a region that
// must run in float32 within an autocast forward).
//
// CPU autocast in libtorch 1.13 supports bfloat16 only (float16 would silently run the
// float32 kernels); MixedPrecision rejects float16 on such a CPU before it gets here.
// The switch is thread-local, as in PyTorch: ops on other threads are not affected.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace largo::precision {

class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, at::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool previous_enabled_;
  at::ScalarType previous_dtype_;
};

} // namespace largo::precision
