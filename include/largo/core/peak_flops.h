// The device's peak matrix-multiply rate for a compute dtype: the denominator of model FLOP
// utilisation (MFU = achieved model FLOP/s / peak). Measured as bench/peak_bench does it, the
// best rate of square at::mm calls (on a CPU the sizes grow until one call takes ~20 ms, so a
// slow dtype, float16 without native arithmetic, costs no more time than a fast one), once per
// device, dtype, thread count, ranks sharing the machine and libtorch version, and cached in
// a JSON file: a run measures only what the cache lacks. Several ranks on one machine measure
// at the same time, sharing the cores as their training will.
#pragma once

#include <ATen/ATen.h>

#include <filesystem>
#include <string>

namespace largo {

struct PeakFlops {
  double flops_per_sec = 0.0;
  // What it is the peak of (peak_flops_key), e.g.
  // "cpu Intel(R) Xeon(R) Processor | 2 threads x 1 rank(s) | BFloat16 | torch 2.11.0".
  std::string key;
  bool cached = false; // read from the cache file rather than measured now
};

// The peak for `dtype` on `device` with this process's intra-op threads and
// `ranks_on_machine` ranks sharing it, from `cache_file` or measured (then written there,
// atomically). A cache that cannot be read (another format, a torn edit) is measured over and
// rewritten, and one that cannot be written is left as it is; both with a warning naming the
// file. Throws Error for a device that is neither a CPU nor a CUDA device.
PeakFlops peak_flops(
    c10::Device device,
    at::ScalarType dtype,
    int ranks_on_machine,
    const std::filesystem::path& cache_file);

// The cache's key for a peak: the device's model name, this process's intra-op threads, the
// ranks sharing the machine, the dtype and libtorch's version.
std::string peak_flops_key(c10::Device device, at::ScalarType dtype, int ranks_on_machine);

// $LARGO_CACHE_DIR/peak_flops.json, else $XDG_CACHE_HOME/largo/peak_flops.json, else
// ~/.cache/largo/peak_flops.json (the test scripts point LARGO_CACHE_DIR at a directory of
// their own, so that peaks measured beside other tests are not what a run reads).
std::filesystem::path default_peak_flops_cache();

} // namespace largo
