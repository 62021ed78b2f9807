#include <largo/train/run_peak_flops.h>

#include <largo/models/flop_count.h>

#include <fmt/format.h>

namespace largo::train {

RunPeakFlops run_peak_flops(
    c10::Device device,
    const precision::PrecisionPolicy& precision,
    int world_size,
    int ranks_on_machine,
    const std::filesystem::path& cache_file) {
  const at::ScalarType dtype = precision.enabled ? precision.low_precision : at::kFloat;
  RunPeakFlops peak;
  peak.per_rank = peak_flops(device, dtype, ranks_on_machine, cache_file);
  peak.world = peak.per_rank.flops_per_sec * world_size;
  if (!device.is_cpu() || dtype == at::kFloat) {
    return peak;
  }
  const double float32 = peak_flops(device, at::kFloat, ranks_on_machine, cache_file).flops_per_sec;
  const double low = peak.per_rank.flops_per_sec;
  if (low * 2.0 >= float32) {
    return peak;
  }
  std::string faster = "float32 (MODEL.AMP_PARAMS.USE_AMP False) or a GPU";
  if (dtype != at::kBFloat16) {
    const double bfloat16 =
        peak_flops(device, at::kBFloat16, ranks_on_machine, cache_file).flops_per_sec;
    if (bfloat16 * 2.0 >= float32) {
      faster = fmt::format(
          "bfloat16 ({}/s; MODEL.AMP_PARAMS.DTYPE: bfloat16), {}",
          models::format_flops(bfloat16),
          faster);
    }
  }
  peak.slow_precision_warning = fmt::format(
      "{} multiplies matrices at {}/s on this CPU against {}/s for float32 ({:.1f}x slower, "
      "measured): this run's {} will train about as much slower. Faster here: {}",
      c10::toString(dtype),
      models::format_flops(low),
      models::format_flops(float32),
      float32 / low,
      precision.describe(),
      faster);
  return peak;
}

} // namespace largo::train
