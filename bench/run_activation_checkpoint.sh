#!/usr/bin/env bash
# Activation checkpointing on the CPU, Largo vs PyTorch, side by side: peak activation memory
# and step time against the number of splits (0 = plain model, 1..4 = the trunk cut into that
# many segments, all but the last checkpointed), for ResNet-50 and a ViT, in one run
# (bench/activation_checkpoint_bench.cpp and bench/activation_checkpoint_reference.py).
# Every point is a fresh process. Builds nothing.
#
# Variants:
#   largo           Largo, cut like PyTorch's checkpoint_sequential (equal block counts)
#   largo_balanced  Largo, cut as the trainer cuts: balanced measured activation bytes
#   pytorch         torch.utils.checkpoint.checkpoint_sequential (PyTorch 2.11, reentrant),
#                   with Largo's malloc settings (GLIBC_TUNABLES), as the Largo side sets them
# Memory is the peak bytes allocated during a step above those live before it (gradients stay
# allocated, so this is activations + temporaries): Largo counts them with its counting CPU
# allocator, PyTorch with the allocator's own reports to torch.profiler (profile_memory), each
# in a separate measured step after the timed ones. Time: process CPU time per step (less
# sensitive to other load on the shared machine than wall time, which is printed too).
# Target (issue 8): at 2+ splits, peak activation memory at least 40 % lower than at 0 splits
# with step time at most 40 % higher.
#
# Usage: [SPLITS="0 2 4"] [BENCH_FLAGS="--batch B --image S"] bench/run_activation_checkpoint.sh [BUILD_DIR] [THREADS] [ROUNDS] [MODEL...]
#   BENCH_FLAGS go to both sides (e.g. a larger input that stresses memory more).
#   defaults: build 2 1 resnet50 vit, SPLITS="0 1 2 3 4" (0 must be among them: the changes are
#   against it; fewer points for a quick run on a loaded machine)
set -euo pipefail
build="${1:-build}"; threads="${2:-2}"; rounds="${3:-1}"
shift $(( $# < 3 ? $# : 3 ))
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(resnet50 vit)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/activation_checkpoint_bench"
reference="$here/activation_checkpoint_reference.py"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON" # the PyTorch Largo is built against
[ -x "$bin" ] || { echo "no $bin: build the target activation_checkpoint_bench first" >&2; exit 1; }

# src/largo/core/malloc_tuning.cpp's settings as glibc tunables (see run_train_throughput.sh).
largo_malloc="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
largo_malloc+=":glibc.malloc.top_pad=67108864"

run_variant() { # model variant splits
  case "$2" in
    largo) env -u LARGO_MALLOC_TUNING "$bin" "$1" --splits "$3" --cut count --threads "$threads" \
        ${BENCH_FLAGS:-} ;;
    largo_balanced)
      env -u LARGO_MALLOC_TUNING "$bin" "$1" --splits "$3" --cut activation --threads "$threads" \
        ${BENCH_FLAGS:-} ;;
    pytorch)
      GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$1" --splits "$3" --threads "$threads" \
        ${BENCH_FLAGS:-} ;;
  esac
}

results="$build/bench/activation_checkpoint_results.jsonl"
: > "$results"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; threads $threads;" \
  "rounds $rounds"
for model in "${models[@]}"; do
  for (( round = 0; round < rounds; ++round )); do
    for splits in ${SPLITS:-0 1 2 3 4}; do
      variants=(largo pytorch)
      [ "$splits" -ge 2 ] && variants=(largo largo_balanced pytorch)
      for (( i = 0; i < ${#variants[@]}; ++i )); do
        run_variant "$model" "${variants[(i + round + splits) % ${#variants[@]}]}" "$splits" >> "$results"
      done
    done
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$results" <<'PY'
import json, statistics, sys
from collections import defaultdict

runs = defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["model"], r["impl"], r["splits"])].append(r)

def med(model, impl, splits, key):
    rs = runs.get((model, impl, splits)) or (runs.get((model, "largo", 0)) if splits == 0 else None)
    return statistics.median(r[key] for r in rs) if rs else None

mib = 1024.0 * 1024.0
failed = False
for model in dict.fromkeys(m for m, _, _ in runs):
    first = next(rs[0] for (m, _, _), rs in runs.items() if m == model)
    counts = {impl: rs[0]["num_parameters"] for (m, impl, _), rs in runs.items() if m == model}
    print(f"\n{model}: batch {first['batch']}, image {first['image']}, {first['num_blocks']} trunk "
          f"blocks, parameters {counts}")
    print(f"{'splits':>6} {'impl':15} {'peak MiB':>9} {'mem vs 0':>9} {'cpu ms':>8} {'cpu vs 0':>9} "
          f"{'wall ms':>8} {'mem largo/pt':>12} {'cpu largo/pt':>12}  cut (Largo)   target")
    for splits in range(5):
        for impl in ("largo", "largo_balanced", "pytorch"):
            if (model, impl, splits) not in runs:
                continue
            peak = med(model, impl, splits, "peak_activation_bytes")
            cpu = med(model, impl, splits, "cpu_ms_per_step")
            wall = med(model, impl, splits, "ms_per_step")
            peak0 = med(model, impl, 0, "peak_activation_bytes")
            cpu0 = med(model, impl, 0, "cpu_ms_per_step")
            mem_change = peak / peak0 - 1.0
            cpu_change = cpu / cpu0 - 1.0
            pt_peak = med(model, "pytorch", splits, "peak_activation_bytes")
            pt_cpu = med(model, "pytorch", splits, "cpu_ms_per_step")
            cut = runs[(model, impl, splits)][0].get("boundaries", "")
            target = ""
            if splits >= 2 and impl != "pytorch":
                met = mem_change <= -0.40 and cpu_change <= 0.40
                target = "met" if met else "NOT met"
            print(f"{splits:>6} {impl:15} {peak / mib:9.1f} {100 * mem_change:+8.0f}% {cpu:8.0f} "
                  f"{100 * cpu_change:+8.0f}% {wall:8.0f} {peak / pt_peak:11.2f}x {cpu / pt_cpu:11.2f}x"
                  f"  {str(cut):13} {target}")
PY
