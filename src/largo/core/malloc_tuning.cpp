#include <largo/core/malloc_tuning.h>

#include <cstdlib>
#include <cstring>
#include <malloc.h>

namespace largo {

bool tune_malloc_for_tensors() {
  static const bool tuned = [] {
    const char* switch_value = std::getenv("LARGO_MALLOC_TUNING");
    if (switch_value != nullptr && std::strcmp(switch_value, "0") == 0) {
      return false;
    }
    // glibc caps the mmap threshold at 32 MiB on 64-bit; blocks below it come from the
    // heap and are reused. The trim threshold keeps up to 1 GiB of freed heap mapped
    // instead of returning it to the OS after each step.
    constexpr int kMmapThresholdBytes = 32 * 1024 * 1024;
    constexpr int kTrimThresholdBytes = 1024 * 1024 * 1024;
    constexpr int kTopPadBytes = 64 * 1024 * 1024;
    bool ok = mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes) == 1;
    ok = mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes) == 1 && ok;
    ok = mallopt(M_TOP_PAD, kTopPadBytes) == 1 && ok;
    return ok;
  }();
  return tuned;
}

} // namespace largo
