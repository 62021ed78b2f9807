// Measured memory: the bytes of tensor storage the process holds on a device, and their
// peak, so that Largo can report what a feature saves (activation checkpointing) and check
// its estimates against reality (ZeRO).
//
// CPU: libtorch keeps no statistics of its CPU allocator, so install_cpu_memory_counter()
// wraps c10's CPU allocator (c10::SetCPUAllocator) in one that counts the bytes of every
// allocation it serves and of every free. Only allocations made after it is installed are
// counted (their frees too), so install it before the work to be measured.
// CUDA: the caching allocator's own statistics (bytes allocated to tensors, not the bytes it
// reserved from the driver), read through at::accelerator; without a visible GPU CUDA
// memory cannot be measured (MemoryTracker::supported says so).
//
// Like torch.cuda.max_memory_allocated(), the counts are process-wide: every thread's
// tensors count (the data loader's prefetched batches too), and the peak is one per device,
// so run one measurement window (start_window .. window_peak_bytes) at a time.
// No collectives.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace largo {

// Installs the counting CPU allocator around the current one. Idempotent and thread-safe;
// the wrapper stays installed for the life of the process. Costs a lock and a hash-map
// insert/erase per CPU allocation (negligible next to the kernels that use the memory).
void install_cpu_memory_counter();
bool cpu_memory_counter_installed();

// Bytes of tensor storage live on one device and their peak.
class MemoryTracker {
 public:
  // CPU: installs the counting allocator if it is not yet. Throws largo::Error when this
  // build cannot measure `device` (see supported()).
  explicit MemoryTracker(torch::Device device);

  // Whether `device` can be measured: always for the CPU; for CUDA, when a GPU is visible.
  static bool supported(const torch::Device& device);

  const torch::Device& device() const {
    return device_;
  }
  // Bytes live now (CPU: allocated since the counter was installed and not yet freed).
  int64_t current_bytes() const;
  // The highest current_bytes() since the last start_window() (or since the counter was
  // installed).
  int64_t peak_bytes() const;

  // Starts a measurement window: the device's peak is reset to the bytes live now, which
  // are remembered as the window's baseline.
  void start_window();
  // The highest bytes live since start_window(), minus those live at start_window().
  int64_t window_peak_bytes() const;
  // Bytes live now minus those live at start_window().
  int64_t window_current_bytes() const;

 private:
  torch::Device device_;
  int64_t window_start_bytes_ = 0;
};

} // namespace largo
