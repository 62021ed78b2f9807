// The peak a run's model FLOP utilisation (MFU) is measured against: every rank's device peak
// for the run's compute dtype (core/peak_flops.h: float32, or the low-precision dtype of
// mixed precision) times the ranks, so that MFU = model FLOP/s of all ranks / this.
#pragma once

#include <largo/core/peak_flops.h>
#include <largo/precision/precision_policy.h>

#include <optional>
#include <string>

namespace largo::train {

struct RunPeakFlops {
  PeakFlops per_rank; // this rank's device, the compute dtype
  double world = 0.0; // per_rank x the world size
  // On a CPU whose low-precision dtype multiplies far (over 2x) slower than float32 (float16
  // without native arithmetic: the SwAV example's O1 ran 8 steps in over 10 minutes, float32
  // in 80 s), what to say at start-up: the measured rates and the faster choices.
  std::optional<std::string> slow_precision_warning;
};

// Measured or read from `cache_file` on every rank (no collective: each measures its own
// device, the ranks of a machine at the same time).
RunPeakFlops run_peak_flops(
    c10::Device device,
    const precision::PrecisionPolicy& precision,
    int world_size,
    int ranks_on_machine,
    const std::filesystem::path& cache_file);

} // namespace largo::train
