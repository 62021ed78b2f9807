#!/usr/bin/env bash
# CPU training throughput, Largo vs PyTorch, side by side: the same model, batch, optimizer
# and thread count (bench/train_throughput_bench.cpp and bench/train_throughput_reference.py).
# Each round runs every variant once (in a rotated order, so a burst of load elsewhere does
# not always hit the same one); the table shows medians over the rounds and the ratio
# Largo / variant of images per second (> 1: Largo is faster). Builds nothing.
#
# Variants:
#   largo                  the Largo driver (mallopt tuning at start-up, as the trainer does)
#   pytorch                PyTorch as it runs out of the box: default glibc malloc, SGD's
#                          default per-parameter update
#   pytorch_tuned          PyTorch with Largo's malloc settings (set through GLIBC_TUNABLES)
#   pytorch_tuned_foreach  the same with SGD(foreach=True)
# The tuned variants isolate the allocator: what remains is Largo's own overhead vs Python's.
# Both sides start from the same weights and batch, so their final losses must agree exactly
# (a check that the reference still mirrors Largo's model) -- except that Largo's SGD updates
# the parameters in one fused pass that rounds differently from ATen's kernels, which use
# fused multiply-adds (include/largo/optim/sgd.h): its loss drifts from PyTorch's by float32
# rounding, amplified over the steps. So each model also runs once with --foreach (SGD
# through ATen's _foreach ops, torch.optim's arithmetic), untimed: that run's final loss
# must equal every PyTorch variant's bit for bit ("same loss as largo --foreach"), and the
# fused pass's relative difference from it is printed below the table.
#
# Usage: bench/run_train_throughput.sh [BUILD_DIR] [THREADS] [ROUNDS] [MODEL...]
#   defaults: build 2 3 small_cnn resnet18
set -euo pipefail
build="${1:-build}"; threads="${2:-2}"; rounds="${3:-3}"
shift $(( $# < 3 ? $# : 3 ))
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(small_cnn resnet18)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/train_throughput_bench"
reference="$here/train_throughput_reference.py"
python=/usr/bin/python3
[ -x "$bin" ] || { echo "no $bin: build the target train_throughput_bench first" >&2; exit 1; }

# The values of src/largo/core/malloc_tuning.cpp (mmap threshold 32 MiB, trim threshold
# 1 GiB, top pad 64 MiB), as glibc tunables for a process that does not call mallopt.
largo_malloc="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
largo_malloc+=":glibc.malloc.top_pad=67108864"

run_variant() { # model variant
  case "$2" in
    # The untuned variants must not inherit allocator settings from the caller's environment.
    largo) env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$bin" "$1" --threads "$threads" ;;
    pytorch) env -u GLIBC_TUNABLES "$python" "$reference" "$1" --threads "$threads" ;;
    pytorch_tuned)
      GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$1" --threads "$threads" |
        sed 's/"impl": "pytorch"/"impl": "pytorch_tuned"/' ;;
    pytorch_tuned_foreach)
      GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$1" --threads "$threads" --foreach |
        sed 's/"impl": "pytorch_foreach"/"impl": "pytorch_tuned_foreach"/' ;;
  esac
}

variants=(largo pytorch pytorch_tuned pytorch_tuned_foreach)
# Every run's JSON line is kept next to the binary, for a closer look.
results="$build/bench/train_throughput_results.jsonl"
: > "$results"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores;" \
  "threads $threads; rounds $rounds"
for model in "${models[@]}"; do
  env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$bin" "$model" --threads "$threads" --foreach |
    sed 's/"impl": *"largo"/"impl": "largo_foreach"/' >> "$results"
  for (( round = 0; round < rounds; ++round )); do
    for (( i = 0; i < ${#variants[@]}; ++i )); do
      run_variant "$model" "${variants[(i + round) % ${#variants[@]}]}" >> "$results"
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
    runs[(r["model"], r["impl"])].append(r)
models = list(dict.fromkeys(m for m, _ in runs))
order = ["largo", "pytorch", "pytorch_tuned", "pytorch_tuned_foreach"]
print(f"{'model':10} {'batch':>5} {'impl':22} {'images/s':>9} {'ms/step':>9} {'cpu ms/step':>11} "
      f"{'largo/impl':>10}  same loss as largo --foreach")
failed = False
for model in models:
    counts = {impl: rs[0]["num_parameters"] for (m, impl), rs in runs.items() if m == model}
    if len(set(counts.values())) != 1:
        print(f"{model}: parameter counts differ: {counts}", file=sys.stderr)
        failed = True
    med = {impl: {k: statistics.median(r[k] for r in runs[(model, impl)])
                  for k in ("images_per_sec", "ms_per_step", "cpu_ms_per_step")}
           for impl in order if (model, impl) in runs}
    # Same weights, batch, kernels and optimizer arithmetic (Largo's _foreach path): the
    # final losses agree bit for bit unless the models (or the optimizers) differ.
    reference_losses = {r["final_loss"] for r in runs[(model, "largo_foreach")]}
    for impl, m in med.items():
        ratio = med["largo"]["images_per_sec"] / m["images_per_sec"]
        batch = runs[(model, impl)][0]["batch"]
        same = "-"
        if impl != "largo":
            same = "yes" if {r["final_loss"] for r in runs[(model, impl)]} == reference_losses else "NO"
            failed |= same == "NO"
        print(f"{model:10} {batch:>5} {impl:22} {m['images_per_sec']:9.1f} {m['ms_per_step']:9.1f} "
              f"{m['cpu_ms_per_step']:11.1f} {ratio:9.2f}x  {same}")
    foreach_loss = next(iter(reference_losses))
    fused_losses = sorted({r["final_loss"] for r in runs[(model, "largo")]})
    print(f"{model}: {list(counts.values())[0]:,} parameters on every side; final loss "
          f"{foreach_loss:.7g} with --foreach, {', '.join(f'{x:.7g}' for x in fused_losses)} with "
          f"the fused SGD pass (relative difference "
          f"{max(abs(x - foreach_loss) for x in fused_losses) / abs(foreach_loss):.1e}: rounding)")
sys.exit(1 if failed else 0)
PY
