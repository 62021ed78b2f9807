// CPU allocator tuning. glibc malloc serves large blocks with mmap and gives them back
// to the OS on free, so every big tensor of every step page-faults anew: a libtorch conv
// forward+backward measured 180 ms instead of 5 ms here. Raising the mmap and trim
// thresholds once at start-up keeps freed blocks in the heap for reuse.
// bench/malloc_tuning_bench measures the effect.
#pragma once

namespace largo {

// Idempotent; cheap. Returns false if glibc refused a setting (then Largo runs, slower).
// Setting LARGO_MALLOC_TUNING=0 in the environment skips it (for measurements).
bool tune_malloc_for_tensors();

} // namespace largo
