#!/usr/bin/env bash
# Mixed-precision training, Largo vs PyTorch, side by side: the same model, batch, optimizer,
# threads and precision (bench/precision_bench.cpp and bench/precision_reference.py).
#
# CPU (default): small_cnn and resnet18 in fp32, O1 bfloat16 (autocast) and O2 bfloat16
# (bfloat16 model, BatchNorm and master weights in float32). Each round runs every
# (precision, side) once in a rotated order; the table shows median images/s, the ratio
# Largo / PyTorch, and each side's speed relative to its own fp32. A second pass measures
# memory (one run per cell, see precision_bench.cpp --memory): parameters (+ float32
# masters), gradients, optimizer state (from the tensors) and the peak RSS growth during
# the forward and the whole step (activations and temporaries), with glibc set to return
# freed blocks at once (mmap threshold 64 KiB) on both sides.
# Throughput runs give Python Largo's malloc settings (GLIBC_TUNABLES), so the allocator
# is the same on both sides (see bench/run_train_throughput.sh for what it is worth alone).
#
# CUDA (--device cuda): resnet50 (224x224, batch 128) in fp32 (TF32 off), tf32, O1 float16
# (+ GradScaler), O1 bfloat16, O2 float16, O2 bfloat16: images/s Largo vs PyTorch.
#
# Usage: bench/run_precision_bench.sh [--device cpu|cuda] [BUILD_DIR] [THREADS] [ROUNDS] [MODEL...]
#   defaults: cpu, build, 2 threads, 3 rounds, models small_cnn resnet18 (cuda: resnet50)
#   LARGO_BENCH_WARMUP / LARGO_BENCH_STEPS, when set, replace both sides' warm-up and timed
#   step counts (scripts/gpu_check.sh shortens the CUDA runs to fit its time budget).
set -euo pipefail
device=cpu
if [ "${1:-}" = "--device" ]; then
  device="$2"
  shift 2
fi
build="${1:-build}"; threads="${2:-2}"; rounds="${3:-3}"
shift $(( $# < 3 ? $# : 3 ))
models=("$@")
if [ "$device" = cuda ]; then
  [ ${#models[@]} -gt 0 ] || models=(resnet50)
  precisions=(fp32 tf32 o1_fp16 o1_bf16 o2_fp16 o2_bf16)
else
  [ ${#models[@]} -gt 0 ] || models=(small_cnn resnet18)
  precisions=(fp32 o1_bf16 o2_bf16)
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/precision_bench"
reference="$here/precision_reference.py"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON" # the PyTorch Largo is built against
[ -x "$bin" ] || { echo "no $bin: build the target precision_bench first" >&2; exit 1; }

# Largo's malloc settings (src/largo/core/malloc_tuning.cpp) as glibc tunables.
largo_malloc="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
largo_malloc+=":glibc.malloc.top_pad=67108864"
# For memory runs: every block of 64 KiB or more is its own mapping, returned on free, so
# RSS follows the live tensors.
measuring_malloc="glibc.malloc.mmap_threshold=65536"

run() { # impl model precision [extra flags...]
  local impl="$1" model="$2" precision="$3"
  shift 3
  local flags=(--precision "$precision" --device "$device" --threads "$threads" "$@")
  if [ -n "${LARGO_BENCH_WARMUP:-}" ]; then flags+=(--warmup "$LARGO_BENCH_WARMUP"); fi
  if [ -n "${LARGO_BENCH_STEPS:-}" ]; then flags+=(--steps "$LARGO_BENCH_STEPS"); fi
  if [ "$impl" = largo ]; then
    env -u GLIBC_TUNABLES "$bin" "$model" "${flags[@]}"
  else
    GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$model" "${flags[@]}"
  fi
}

results="$build/bench/precision_results.jsonl"
: > "$results"
echo "device $device; load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores;" \
  "threads $threads; rounds $rounds"
cells=()
for precision in "${precisions[@]}"; do
  for impl in largo pytorch; do
    cells+=("$impl $precision")
  done
done
for model in "${models[@]}"; do
  for (( round = 0; round < rounds; ++round )); do
    for (( i = 0; i < ${#cells[@]}; ++i )); do
      read -r impl precision <<< "${cells[(i + round) % ${#cells[@]}]}"
      run "$impl" "$model" "$precision" >> "$results"
    done
  done
  if [ "$device" = cpu ]; then
    for precision in "${precisions[@]}"; do
      LARGO_MALLOC_TUNING=0 GLIBC_TUNABLES="$measuring_malloc" \
        "$bin" "$model" --precision "$precision" --threads "$threads" --memory |
        sed 's/"impl":"largo"/"impl":"largo","memory_run":true/' >> "$results"
      GLIBC_TUNABLES="$measuring_malloc" \
        "$python" "$reference" "$model" --precision "$precision" --threads "$threads" --memory |
        sed 's/"impl": "pytorch"/"impl": "pytorch", "memory_run": true/' >> "$results"
    done
  fi
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$results" <<'PY'
import json, statistics, sys
from collections import defaultdict

speed = defaultdict(list)
memory = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["model"], r["precision"], r["impl"])
    if r.get("memory_run"):
        memory[key] = r
    else:
        speed[key].append(r)
models = list(dict.fromkeys(k[0] for k in speed))
precisions = list(dict.fromkeys(k[1] for k in speed))
med = {k: statistics.median(r["images_per_sec"] for r in v) for k, v in speed.items()}

print(f"\n{'model':10} {'precision':9} {'batch':>5} {'largo img/s':>11} {'pytorch img/s':>13} "
      f"{'largo/pytorch':>13} {'largo/own fp32':>14} {'pytorch/own fp32':>16}")
for model in models:
    for precision in precisions:
        if (model, precision, "largo") not in med:
            continue
        l, p = med[(model, precision, "largo")], med[(model, precision, "pytorch")]
        lf, pf = med[(model, "fp32", "largo")], med[(model, "fp32", "pytorch")]
        batch = speed[(model, precision, "largo")][0]["batch"]
        print(f"{model:10} {precision:9} {batch:5} {l:11.1f} {p:13.1f} {l / p:12.2f}x "
              f"{l / lf:13.2f}x {p / pf:15.2f}x")
    skipped = {r.get("skipped_steps", 0) for k, v in speed.items() if k[0] == model for r in v}
    if skipped - {0}:
        print(f"{model}: Largo skipped steps (inf/NaN) in some run: {sorted(skipped)}")

if memory:
    mib = lambda b: b / 2**20
    print(f"\nmemory (MiB): params+buffers, float32 masters, gradients (after unscale), optimizer "
          f"state: from the tensors;\nforward / step: peak RSS growth during the forward / the "
          f"whole step above the step's start (activations, temporaries, gradients)")
    print(f"{'model':10} {'precision':9} {'impl':8} {'params':>7} {'masters':>7} {'grads':>7} "
          f"{'opt state':>9} {'forward':>8} {'step':>8} {'step largo/pytorch':>18}")
    for model in models:
        for precision in precisions:
            for impl in ("largo", "pytorch"):
                r = memory.get((model, precision, impl))
                if not r:
                    continue
                other = memory.get((model, precision, "pytorch"))
                ratio = (f"{r['step_peak_bytes'] / other['step_peak_bytes']:17.2f}x"
                         if impl == "largo" and other and other["step_peak_bytes"] else "")
                print(f"{model:10} {precision:9} {impl:8} {mib(r['param_bytes']):7.2f} "
                      f"{mib(r['master_bytes']):7.2f} {mib(r['grad_bytes']):7.2f} "
                      f"{mib(r['optimizer_state_bytes']):9.2f} {mib(r['forward_peak_bytes']):8.1f} "
                      f"{mib(r['step_peak_bytes']):8.1f} {ratio}")
PY
