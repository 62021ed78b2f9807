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
#   pytorch_compile        pytorch_tuned_foreach with forward and loss under torch.compile
#                          (inductor, default mode; AOTAutograd compiles the backward): the
#                          same allocator, threads and optimizer, so the ratio is Largo against
#                          compiled kernels. Compiling happens in untimed steps before the
#                          warm-up (train_throughput_reference.py --compile); the table shows
#                          its median seconds ("compile s"; the first run of a model on a cold
#                          inductor cache, /tmp/torchinductor_$USER, takes longer than the
#                          others, which load the cached kernels), and a compile that fails
#                          shows as an "error" row instead of stopping the run.
# The tuned variants isolate the allocator: what remains is Largo's own overhead vs
# Python's. Both sides start from the same weights and batch, so their final losses must
# agree exactly (a check that the reference still mirrors Largo's model). Exactly on every
# CPU, by construction: both run the same libtorch's kernels, op for op, on the same shapes,
# strides, 64-byte alignment (c10's allocator) and thread count, so whichever instruction
# set (AVX2, AVX-512, ...) a kernel picks, it picks it on both sides. An op the reference
# computes another way breaks that even where the maths is the same: attention as matmul,
# softmax, matmul rounds differently from Largo's scaled_dot_product_attention on any CPU,
# so the reference calls that kernel too. Largo's default optimizer pass breaks it as well:
# its SGD updates the parameters in one fused pass that rounds differently from ATen's
# kernels, which use fused multiply-adds (include/largo/optim/sgd.h): its loss drifts from
# PyTorch's by float32 rounding, amplified over the steps. So each model also runs once with
# --foreach (SGD through ATen's _foreach ops, torch.optim's arithmetic), untimed: that run's
# final loss must equal every PyTorch variant's bit for bit ("same loss as largo
# --foreach"), and the fused pass's relative difference from it is printed below the table.
# torch.compile's kernels fuse pointwise ops and reorder reductions, so pytorch_compile is
# not held to bit equality either: its row prints its relative difference from that loss
# instead.
#
# Usage: [VARIANTS="largo pytorch ..."] [BENCH_FLAGS="--warmup W --steps S"]
#        bench/run_train_throughput.sh [BUILD_DIR] [THREADS] [ROUNDS] [MODEL...]
#   defaults: build 2 3 small_cnn resnet18 resnet50 vit mlp; every variant.
#   BENCH_FLAGS go to every run, both sides (e.g. fewer steps for a smoke test).
# Time on the 2-core dev VM, 3 rounds, all five models, default steps: about 7 minutes for
# the eager variants (Python's start-up, ~2.5 s a run, is a good part of it) and 6 (warm
# inductor cache) to 8 minutes (cold) for pytorch_compile's 15 runs. Compiling one model took
# 21-64 s cold (mlp 21, vit 32, small_cnn 42, resnet18 48, resnet50 64) and 15-22 s warm,
# measured under load; the cache is keyed by shapes, so a different --batch compiles anew.
# Leave the compile variant out with VARIANTS="largo pytorch pytorch_tuned pytorch_tuned_foreach".
set -euo pipefail
build="${1:-build}"; threads="${2:-2}"; rounds="${3:-3}"
shift $(( $# < 3 ? $# : 3 ))
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(small_cnn resnet18 resnet50 vit mlp)
read -r -a flags <<< "${BENCH_FLAGS:-}"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/train_throughput_bench"
reference="$here/train_throughput_reference.py"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON" # the PyTorch Largo is built against
[ -x "$bin" ] || { echo "no $bin: build the target train_throughput_bench first" >&2; exit 1; }

# The values of src/largo/core/malloc_tuning.cpp (mmap threshold 32 MiB, trim threshold
# 1 GiB, top pad 64 MiB), as glibc tunables for a process that does not call mallopt.
largo_malloc="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
largo_malloc+=":glibc.malloc.top_pad=67108864"

run_variant() { # model variant
  case "$2" in
    # The untuned variants must not inherit allocator settings from the caller's environment.
    largo) env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$bin" "$1" --threads "$threads" \
      "${flags[@]}" ;;
    pytorch) env -u GLIBC_TUNABLES "$python" "$reference" "$1" --threads "$threads" "${flags[@]}" ;;
    pytorch_tuned)
      GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$1" --threads "$threads" \
        "${flags[@]}" | sed 's/"impl": "pytorch"/"impl": "pytorch_tuned"/' ;;
    pytorch_tuned_foreach)
      GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$1" --threads "$threads" --foreach \
        "${flags[@]}" | sed 's/"impl": "pytorch_foreach"/"impl": "pytorch_tuned_foreach"/' ;;
    pytorch_compile) # the reference prints an "error" line (exit 0) if compiling fails
      GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$1" --threads "$threads" --foreach \
        --compile "${flags[@]}" |
        sed 's/"impl": "pytorch_compile_foreach"/"impl": "pytorch_compile"/' ;;
    *) echo "unknown variant $2" >&2; return 1 ;;
  esac
}

all_variants="largo pytorch pytorch_tuned pytorch_tuned_foreach pytorch_compile"
read -r -a variants <<< "${VARIANTS:-$all_variants}"
# Every run's JSON line is kept next to the binary, for a closer look.
results="$build/bench/train_throughput_results.jsonl"
: > "$results"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores;" \
  "threads $threads; rounds $rounds; variants ${variants[*]}${BENCH_FLAGS:+; flags $BENCH_FLAGS}"
for model in "${models[@]}"; do
  env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$bin" "$model" --threads "$threads" --foreach \
    "${flags[@]}" |
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
order = ["largo", "pytorch", "pytorch_tuned", "pytorch_tuned_foreach", "pytorch_compile"]
print(f"{'model':10} {'batch':>5} {'impl':22} {'images/s':>9} {'ms/step':>9} {'cpu ms/step':>11} "
      f"{'largo/impl':>10} {'compile s':>9}  same loss as largo --foreach")
failed = False
for model in models:
    counts = {impl: rs[0]["num_parameters"] for (m, impl), rs in runs.items() if m == model}
    if len(set(counts.values())) != 1:
        print(f"{model}: parameter counts differ: {counts}", file=sys.stderr)
        failed = True
    # A compiled run that failed carries "error" and no timings: it is reported, not timed.
    ok = {impl: [r for r in runs[(model, impl)] if "error" not in r]
          for impl in order if (model, impl) in runs}
    med = {impl: {k: statistics.median(r[k] for r in rs)
                  for k in ("images_per_sec", "ms_per_step", "cpu_ms_per_step")}
           for impl, rs in ok.items() if rs}
    # Same weights, batch, kernels and optimizer arithmetic (Largo's _foreach path): the
    # final losses agree bit for bit unless the models (or the optimizers) differ.
    reference_losses = {r["final_loss"] for r in runs[(model, "largo_foreach")]}
    foreach_loss = next(iter(reference_losses))
    for impl, rs in ok.items():
        batch = runs[(model, impl)][0]["batch"]
        errors = sorted({r["error"] for r in runs[(model, impl)] if "error" in r})
        if impl not in med:
            print(f"{model:10} {batch:>5} {impl:22} error: {'; '.join(errors)}")
            continue
        m = med[impl]
        ratio = (med["largo"]["images_per_sec"] / m["images_per_sec"] if "largo" in med
                 else float("nan"))
        compile_s = f"{'-':>9}"
        same = "-"
        if impl == "pytorch_compile":
            compile_s = f"{statistics.median(r['compile_s'] for r in rs):9.1f}"
            # inductor fuses pointwise ops and reorders reductions: the loss agrees to float
            # rounding (amplified over the steps), not bit for bit, so print how far it is.
            diffs = {abs(r["final_loss"] - foreach_loss) / abs(foreach_loss) for r in rs}
            same = "rel. diff " + ", ".join(f"{d:.1e}" for d in sorted(diffs))
            timed_recompiles = sum(r["recompiles_in_timed"] for r in rs)
            if timed_recompiles:  # compiling inside the timed steps: its timing is void
                same += f"; {timed_recompiles} RECOMPILE(S) IN THE TIMED STEPS"
                failed = True
        elif impl != "largo":
            same = "yes" if {r["final_loss"] for r in rs} == reference_losses else "NO"
            failed |= same == "NO"
        if errors:
            same += f"; {len(runs[(model, impl)]) - len(rs)} run(s) failed: {'; '.join(errors)}"
        print(f"{model:10} {batch:>5} {impl:22} {m['images_per_sec']:9.1f} {m['ms_per_step']:9.1f} "
              f"{m['cpu_ms_per_step']:11.1f} {ratio:9.2f}x {compile_s}  {same}")
    fused_losses = sorted({r["final_loss"] for r in runs[(model, "largo")]})
    if fused_losses:
        print(f"{model}: {list(counts.values())[0]:,} parameters on every side; final loss "
              f"{foreach_loss:.7g} with --foreach, {', '.join(f'{x:.7g}' for x in fused_losses)} with "
              f"the fused SGD pass (relative difference "
              f"{max(abs(x - foreach_loss) for x in fused_losses) / abs(foreach_loss):.1e}: rounding)")
    compiled = ok.get("pytorch_compile", [])
    if compiled and "pytorch_tuned_foreach" in med:
        speedup = (med["pytorch_compile"]["images_per_sec"]
                   / med["pytorch_tuned_foreach"]["images_per_sec"])
        def cache(r):  # inductor's FX graph cache: warm = every graph loaded from it
            if not r["fx_graph_cache_misses"]:
                return "warm"
            return "partly cached" if r["fx_graph_cache_hits"] else "cold"
        print(f"{model}: torch.compile runs {speedup:.2f}x as fast as eager "
              "(pytorch_tuned_foreach); compile s per run, in run order: "
              + ", ".join(f"{r['compile_s']:.1f} ({cache(r)})" for r in compiled))
sys.exit(1 if failed else 0)
PY
