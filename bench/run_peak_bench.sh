#!/usr/bin/env bash
# Model FLOP utilisation on this machine, Largo beside PyTorch, in one run:
#   1. bench/peak_bench measures the float32 and bfloat16 peaks of GEMM and convolution
#      (the best of a few shapes each) and prints the machine report;
#   2. bench/train_throughput_bench (Largo) and bench/train_throughput_reference.py (PyTorch)
#      train small_cnn, resnet18 (cifar stem), resnet50 (224, batch 8), vit and mlp, each in
#      float32 and under bfloat16 autocast, ROUNDS times in alternating order;
#   3. the table: images/s (median of the rounds), achieved GFLOP/s (Largo's analytic
#      training FLOPs per image x images/s; PyTorch's profiler count must agree), MFU = that
#      over the matching peak (same dtype; convolution peak for the CNNs, GEMM peak for vit
#      and mlp), and Largo / PyTorch. PyTorch runs as shipped ("pytorch") and with Largo's
#      malloc settings ("pytorch_tuned", see run_train_throughput.sh).
# Builds nothing (targets peak_bench and train_throughput_bench).
#
# Usage: bench/run_peak_bench.sh [BUILD_DIR] [THREADS] [ROUNDS] [MODEL...]
#   defaults: build 2 2 small_cnn resnet18 resnet50 vit mlp
#   PRECISIONS="float32 bfloat16" (environment) limits the precisions.
set -euo pipefail
build="${1:-build}"; threads="${2:-2}"; rounds="${3:-2}"
shift $(( $# < 3 ? $# : 3 ))
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(small_cnn resnet18 resnet50 vit mlp)
read -r -a precisions <<< "${PRECISIONS:-float32 bfloat16}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON" # the PyTorch Largo is built against
for bin in peak_bench train_throughput_bench; do
  [ -x "$build/bench/$bin" ] || { echo "no $build/bench/$bin: build the target $bin" >&2; exit 1; }
done
# src/largo/core/malloc_tuning.cpp's settings as glibc tunables (run_train_throughput.sh).
largo_malloc="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
largo_malloc+=":glibc.malloc.top_pad=67108864"

results="$build/bench/peak_bench_results.jsonl"
: > "$results"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; threads $threads;" \
  "rounds $rounds"
"$build/bench/peak_bench" --threads "$threads" | tee -a "$results" | grep -E '"machine"|"peaks"'

run_side() { # side model precision
  local args=("$2" --threads "$threads" --precision "$3")
  case "$1" in
    largo) env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$build/bench/train_throughput_bench" "${args[@]}" ;;
    pytorch) env -u GLIBC_TUNABLES "$python" "$here/train_throughput_reference.py" "${args[@]}" ;;
    pytorch_tuned)
      GLIBC_TUNABLES="$largo_malloc" "$python" "$here/train_throughput_reference.py" "${args[@]}" |
        sed 's/"impl": "pytorch"/"impl": "pytorch_tuned"/' ;;
  esac
}

sides=(largo pytorch pytorch_tuned)
for model in "${models[@]}"; do
  for precision in "${precisions[@]}"; do
    for (( round = 0; round < rounds; ++round )); do
      for (( i = 0; i < ${#sides[@]}; ++i )); do
        run_side "${sides[(i + round) % ${#sides[@]}]}" "$model" "$precision" >> "$results"
      done
    done
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
"$python" "$here/peak_bench_table.py" "$results"
