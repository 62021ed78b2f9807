#!/usr/bin/env bash
# Largo against itself: the data-parallel benchmarks of two builds (a change's before and
# after) run alternately in one run, on 2 ranks x 1 thread (Gloo on 127.0.0.1), so that a
# change that should not cost speed is shown not to:
#   DDP   bench/ddp_throughput_bench (small_cnn and resnet18; images/s)
#   ZeRO  bench/zero_bench stages 0-3 (the wide MLP, AdamW; ms per step, stage 3 with prefetch)
# Each round runs every variant with both builds, which one goes first alternating by round;
# the table shows each build's median over the rounds and its range, and after / before
# (> 1 means the after build is faster). Builds nothing.
#
# Usage: bench/run_build_comparison.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [ROUNDS]  (default 3)
set -euo pipefail
before="${1:?usage: run_build_comparison.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [ROUNDS]}"
after="${2:?usage: run_build_comparison.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [ROUNDS]}"
rounds="${3:-3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../scripts/torch_env.sh"
for build in "$before" "$after"; do
  for binary in largo bench/ddp_throughput_bench bench/zero_bench; do
    [ -x "$build/$binary" ] || { echo "no $build/$binary: build it first" >&2; exit 1; }
  done
done

results="$(mktemp)"
trap 'rm -f "$results"' EXIT
# One variant with one build: rank 0's JSON lines, tagged with the build.
run_variant() { # label build variant
  local label="$1" build="$2"
  case "$3" in
    ddp_small_cnn | ddp_resnet18)
      env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES OMP_NUM_THREADS=1 \
        "$build/largo" launch --nproc_per_node 2 -- \
        "$build/bench/ddp_throughput_bench" "${3#ddp_}" --threads 1 ;;
    zero)
      env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES OMP_NUM_THREADS=1 \
        "$build/largo" launch --nproc_per_node 2 -- \
        "$build/bench/zero_bench" --stages 0,1,2,3 --stage3_prefetch on \
        --stage3_compute float32 --threads 1 ;;
  esac | grep '^{' | sed "s/^{/{\"build\": \"$label\", /" >> "$results"
}

variants=(ddp_small_cnn ddp_resnet18 zero)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg); rounds $rounds"
echo "before: $before; after: $after"
for (( round = 0; round < rounds; ++round )); do
  for variant in "${variants[@]}"; do
    if (( round % 2 == 0 )); then
      run_variant before "$before" "$variant"
      run_variant after "$after" "$variant"
    else
      run_variant after "$after" "$variant"
      run_variant before "$before" "$variant"
    fi
  done
  echo "  round $((round + 1))/$rounds done; load $(cut -d' ' -f1 /proc/loadavg)"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$LARGO_PYTHON" - "$results" <<'PY'
import json, statistics, sys
from collections import defaultdict

values = defaultdict(list)  # (what, unit, higher_is_better, build) -> [value per round]
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "images_per_sec" in r:
        key = (f"DDP {r['model']}", "images/s", True)
        values[key + (r["build"],)].append(r["images_per_sec"])
    else:
        key = (f"ZeRO stage {r['stage']}", "ms/step", False)
        values[key + (r["build"],)].append(r["ms_per_step"])
rows = sorted({k[:3] for k in values}, key=lambda k: k[0])
print(f"\n{'variant':18} {'unit':9} {'before (min - max)':>28} {'after (min - max)':>28} {'after/before':>12}")
for what, unit, higher in rows:
    b, a = values[(what, unit, higher, "before")], values[(what, unit, higher, "after")]
    if not a or not b:
        print(f"{what:18} missing runs (before {len(b)}, after {len(a)})")
        continue
    mb, ma = statistics.median(b), statistics.median(a)
    speed = ma / mb if higher else mb / ma  # > 1: after is faster
    cell = lambda xs, m: f"{m:9.1f} ({min(xs):7.1f} - {max(xs):7.1f})"
    print(f"{what:18} {unit:9} {cell(b, mb):>28} {cell(a, ma):>28} {speed:11.3f}x")
print("\nafter/before: the after build's speed relative to the before build's (> 1 faster).")
PY
