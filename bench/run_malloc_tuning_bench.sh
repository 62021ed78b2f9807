#!/usr/bin/env bash
# Compares CPU allocator settings on one training step (see malloc_tuning_bench.cpp):
# untuned glibc, Largo's mallopt tuning, and jemalloc. Prints the ratios.
# Usage: bench/run_malloc_tuning_bench.sh [BUILD_DIR] [THREADS] [STEPS]
set -euo pipefail
build="${1:-build}"; threads="${2:-2}"; steps="${3:-30}"
bin="$build/bench/malloc_tuning_bench"
untuned=$(LARGO_MALLOC_TUNING=0 "$bin" "$threads" "$steps")
tuned=$("$bin" "$threads" "$steps")
echo "untuned glibc: $untuned"
echo "mallopt tuned: $tuned"
jemalloc=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
if [ -e "$jemalloc" ]; then
  je=$(LARGO_MALLOC_TUNING=0 LD_PRELOAD="$jemalloc" "$bin" "$threads" "$steps")
  echo "jemalloc:      $je"
fi
/usr/bin/python3 - "$untuned" "$tuned" "${je:-}" <<'PY'
import json, sys
untuned, tuned = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"speed-up of mallopt tuning over untuned glibc: {untuned['ms_per_step'] / tuned['ms_per_step']:.2f}x")
if sys.argv[3]:
    je = json.loads(sys.argv[3])
    print(f"speed-up of jemalloc over untuned glibc:      {untuned['ms_per_step'] / je['ms_per_step']:.2f}x")
    print(f"mallopt tuning vs jemalloc (time ratio je/tuned): {je['ms_per_step'] / tuned['ms_per_step']:.2f}")
PY
