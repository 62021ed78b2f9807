#!/usr/bin/env bash
# Data-parallel training throughput, Largo DDP vs PyTorch DDP, side by side: the same model,
# weights, global batch and optimizer; 2 processes x 1 thread each over Gloo on 127.0.0.1
# (bench/ddp_throughput_bench.cpp started by `largo launch`, and
# bench/ddp_throughput_reference.py, which starts its ranks with torch.multiprocessing), each
# also alone in 1 process x 1 thread on the whole global batch. Each round runs every variant
# once (in a rotated order, so a burst of load elsewhere does not always hit the same one);
# the tables show medians over the rounds. Builds nothing.
#
# Variants (the malloc settings each side runs with are part of the name):
#   largo, largo_ddp        Largo (mallopt tuning at start-up, as the trainer does), 1 / 2 procs
#   largo_ddp_delay         Largo DDP with delay_allreduce (all communication after backward)
#   pytorch, pytorch_ddp    PyTorch as it runs out of the box (default glibc malloc)
#   pytorch_tuned, pytorch_tuned_ddp
#                           PyTorch with Largo's malloc settings (through GLIBC_TUNABLES)
# Printed: images/s, Largo DDP / PyTorch DDP, each side's scaling efficiency (2-process
# images/s over twice its own 1-process images/s), overlap / delay_allreduce, and whether the
# runs of both sides reach bit for bit the same final loss (with Largo's SGD on its _foreach
# path, in two extra untimed runs per model: the timed runs use the fused pass, which rounds
# differently).
#
# Usage: bench/run_ddp_bench.sh [BUILD_DIR] [ROUNDS] [MODEL...]   defaults: build 3 small_cnn resnet18
set -euo pipefail
build="${1:-build}"; rounds="${2:-3}"
shift $(( $# < 2 ? $# : 2 ))
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(small_cnn resnet18)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/ddp_throughput_bench"
largo="$build/largo"
reference="$here/ddp_throughput_reference.py"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON" # the PyTorch Largo is built against
[ -x "$bin" ] || { echo "no $bin: build the target ddp_throughput_bench first" >&2; exit 1; }
[ -x "$largo" ] || { echo "no $largo: build the target largo_app first" >&2; exit 1; }

# The values of src/largo/core/malloc_tuning.cpp (mmap threshold 32 MiB, trim threshold
# 1 GiB, top pad 64 MiB), as glibc tunables for a process that does not call mallopt.
largo_malloc="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
largo_malloc+=":glibc.malloc.top_pad=67108864"

run_variant() { # model variant; prints rank 0's JSON line
  local model="$1"
  case "$2" in
    # The untuned variants must not inherit allocator settings from the caller's environment.
    largo) env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$bin" "$model" --threads 1 ;;
    largo_ddp) env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$largo" launch --nproc_per_node 2 -- \
        "$bin" "$model" --threads 1 ;;
    largo_ddp_delay) env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$largo" launch --nproc_per_node 2 -- \
        "$bin" "$model" --threads 1 --delay_allreduce ;;
    largo_foreach) env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$bin" "$model" --threads 1 --foreach ;;
    largo_ddp_foreach) env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$largo" launch --nproc_per_node 2 -- \
        "$bin" "$model" --threads 1 --foreach ;;
    pytorch) env -u GLIBC_TUNABLES "$python" "$reference" "$model" --procs 1 ;;
    pytorch_ddp) env -u GLIBC_TUNABLES "$python" "$reference" "$model" --procs 2 ;;
    pytorch_tuned) GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$model" --procs 1 |
        sed 's/"impl": "pytorch"/"impl": "pytorch_tuned"/' ;;
    pytorch_tuned_ddp) GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$model" --procs 2 |
        sed 's/"impl": "pytorch_ddp"/"impl": "pytorch_tuned_ddp"/' ;;
  esac | grep '^{'   # the launcher's own log lines are not results
}

variants=(largo largo_ddp largo_ddp_delay pytorch pytorch_ddp pytorch_tuned pytorch_tuned_ddp)
results="$build/bench/ddp_bench_results.jsonl"
: > "$results"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; rounds $rounds;" \
  "2 processes x 1 thread (OMP_NUM_THREADS=1) vs 1 process x 1 thread"
for model in "${models[@]}"; do
  for (( round = 0; round < rounds; ++round )); do
    for (( i = 0; i < ${#variants[@]}; ++i )); do
      run_variant "$model" "${variants[(i + round) % ${#variants[@]}]}" >> "$results"
    done
    echo "  $model round $((round + 1))/$rounds done; load $(cut -d' ' -f1 /proc/loadavg)"
  done
  # Untimed: Largo with SGD's _foreach path, for the bit-exact loss check.
  run_variant "$model" largo_foreach >> "$results"
  run_variant "$model" largo_ddp_foreach >> "$results"
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
order = ["largo", "largo_ddp", "largo_ddp_delay", "pytorch", "pytorch_ddp", "pytorch_tuned",
         "pytorch_tuned_ddp"]
failed = False
for model in models:
    med = {impl: statistics.median(r["images_per_sec"] for r in runs[(model, impl)])
           for impl in order if (model, impl) in runs}
    lo = {impl: min(r["images_per_sec"] for r in runs[(model, impl)]) for impl in med}
    hi = {impl: max(r["images_per_sec"] for r in runs[(model, impl)]) for impl in med}
    counts = {r["num_parameters"] for impl in med for r in runs[(model, impl)]}
    if len(counts) != 1:
        print(f"{model}: parameter counts differ: {counts}", file=sys.stderr)
        failed = True
    r0 = runs[(model, "largo")][0]
    checks = {impl: runs.pop((model, impl))[0]["final_loss"]
              for impl in ("largo_foreach", "largo_ddp_foreach") if (model, impl) in runs}
    print(f"\n{model}: global batch {r0['batch']}, {r0['steps']} timed steps, "
          f"{counts.pop():,} parameters")
    print(f"  {'variant':18} {'procs':>5} {'images/s':>9} {'(min - max)':>17} {'ms/step':>8}")
    for impl in med:
        procs = runs[(model, impl)][0]["procs"]
        ms = statistics.median(r["ms_per_step"] for r in runs[(model, impl)])
        print(f"  {impl:18} {procs:>5} {med[impl]:9.1f} ({lo[impl]:7.1f} - {hi[impl]:7.1f}) {ms:8.1f}")

    def ratio(a, b):
        return med[a] / med[b] if a in med and b in med else float("nan")

    print(f"  Largo DDP / PyTorch DDP:              {ratio('largo_ddp', 'pytorch_ddp'):.2f}x"
          f"   (/ PyTorch DDP with Largo's malloc settings: "
          f"{ratio('largo_ddp', 'pytorch_tuned_ddp'):.2f}x)")
    for two, one in [("largo_ddp", "largo"), ("largo_ddp_delay", "largo"),
                     ("pytorch_ddp", "pytorch"), ("pytorch_tuned_ddp", "pytorch_tuned")]:
        print(f"  scaling efficiency {two:18} {ratio(two, one) / 2:.2f}  (2 procs / 2 x {one})")
    print(f"  bucketed overlap / delay_allreduce:   {ratio('largo_ddp', 'largo_ddp_delay'):.2f}x")
    # Same weights, data, model and loss. With SGD's _foreach path (torch.optim's ops in its
    # order) rank 0's final loss must equal PyTorch's bit for bit, with DDP and without: any
    # difference in what the two DDPs compute shows. The timed runs use the fused SGD pass,
    # which rounds a + lr*b twice where ATen fuses the multiply-add (docs/optimization.md):
    # their final losses drift apart in the last bits over the steps, so they are only shown.
    for mine, theirs, timed in [("largo_ddp_foreach", "pytorch_ddp", "largo_ddp"),
                                ("largo_foreach", "pytorch", "largo")]:
        if mine in checks and (model, theirs) in runs:
            ref = runs[(model, theirs)][0]["final_loss"]
            same = checks[mine] == ref
            failed = failed or not same
            print(f"  final loss {mine} vs {theirs}: {'bit for bit equal' if same else 'DIFFER'}"
                  f" ({checks[mine]!r} vs {ref!r}; fused {timed}: "
                  f"{runs[(model, timed)][0]['final_loss']!r})")
sys.exit(1 if failed else 0)
PY
