#!/usr/bin/env bash
# Optimizer step time over ResNet-50's parameters (25.6 M float32 values, 161 tensors),
# Largo vs PyTorch side by side (bench/optimizer_step_bench.cpp and
# bench/optimizer_step_reference.py): SGD with momentum, SGD inside LARC, AdamW, LAMB.
# Each round runs every variant once, in a rotated order so that a burst of load elsewhere
# does not always hit the same one; the table shows medians over the rounds of each run's
# median step time, and the ratios variant / largo (> 1: Largo is faster). Builds nothing.
#
# Variants:
#   largo            Largo's fused CPU pass (the default on CPU)
#   largo_foreach    Largo's _foreach path (what other devices use)
#   pytorch          torch.optim's default single-tensor loop (foreach=False); LARC and
#                    LAMB as written in tests/reference/reference_optimizers.py
#   pytorch_foreach  torch.optim's foreach=True; the _foreach versions of LARC and LAMB
# All variants run with Largo's malloc settings (the PyTorch ones through GLIBC_TUNABLES),
# so the allocator is not what is compared. The checksums (sum of the parameters after the
# run) must agree to float32 rounding: a check that both sides did the same arithmetic.
#
# Usage: bench/run_optimizer_step_bench.sh [BUILD_DIR] [THREADS] [ROUNDS] [OPTIMIZER...]
#   defaults: build 2 3 sgd sgd_larc adamw lamb
set -euo pipefail
build="${1:-build}"; threads="${2:-2}"; rounds="${3:-3}"
shift $(( $# < 3 ? $# : 3 ))
optimizers=("$@")
[ ${#optimizers[@]} -gt 0 ] || optimizers=(sgd sgd_larc adamw lamb)

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/optimizer_step_bench"
reference="$here/optimizer_step_reference.py"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON" # the PyTorch Largo is built against
[ -x "$bin" ] || { echo "no $bin: build the target optimizer_step_bench first" >&2; exit 1; }

# The values of src/largo/core/malloc_tuning.cpp, as glibc tunables.
largo_malloc="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
largo_malloc+=":glibc.malloc.top_pad=67108864"

params_json="$build/bench/resnet50_parameters.json"
"$bin" --describe --threads "$threads" > "$params_json"

run_variant() { # optimizer variant
  local common=(--threads "$threads")
  case "$2" in
    largo) env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$bin" "$1" --path fused "${common[@]}" ;;
    largo_foreach)
      env -u LARGO_MALLOC_TUNING -u GLIBC_TUNABLES "$bin" "$1" --path foreach "${common[@]}" ;;
    pytorch) GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$params_json" "$1" "${common[@]}" ;;
    pytorch_foreach)
      GLIBC_TUNABLES="$largo_malloc" "$python" "$reference" "$params_json" "$1" --foreach "${common[@]}" ;;
  esac
}

variants=(largo largo_foreach pytorch pytorch_foreach)
results="$build/bench/optimizer_step_results.jsonl"
: > "$results"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg); threads $threads; rounds $rounds"
for (( round = 0; round < rounds; ++round )); do
  for optimizer in "${optimizers[@]}"; do
    for (( i = 0; i < ${#variants[@]}; ++i )); do
      run_variant "$optimizer" "${variants[(i + round) % ${#variants[@]}]}" >> "$results"
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
    runs[(r["optimizer"], r["impl"])].append(r)
optimizers = list(dict.fromkeys(o for o, _ in runs))
order = ["largo", "largo_foreach", "pytorch", "pytorch_foreach"]
print(f"{'optimizer':9} {'impl':16} {'ms/step':>8} {'impl/largo':>10}  checksum vs largo")
failed = False
for optimizer in optimizers:
    med = {impl: statistics.median(r["ms_per_step"] for r in runs[(optimizer, impl)])
           for impl in order if (optimizer, impl) in runs}
    largo_sum = runs[(optimizer, "largo")][0]["checksum"]
    scale = sum(abs(r["checksum"]) for r in runs[(optimizer, "largo")]) or 1.0
    for impl, ms in med.items():
        checksum = runs[(optimizer, impl)][0]["checksum"]
        # float32 parameters, 12 steps: the sides differ in rounding only (and LARC/LAMB in
        # the order of the norm sums), far below 1e-4 of the sum of |checksums|.
        rel = abs(checksum - largo_sum) / scale
        ok = rel < 1e-4
        failed |= not ok
        print(f"{optimizer:9} {impl:16} {ms:8.1f} {ms / med['largo']:9.2f}x  "
              f"{rel:.1e} {'ok' if ok else 'DIFFERENT'}")
n = next(iter(runs.values()))[0]
print(f"{n['num_parameters']:,} parameters in {n['num_tensors']} tensors, float32")
sys.exit(1 if failed else 0)
PY
