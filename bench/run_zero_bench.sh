#!/usr/bin/env bash
# ZeRO stages 0-3 on 2 ranks (2 processes x 1 thread, Gloo on 127.0.0.1), Largo
# (bench/zero_bench.cpp), PyTorch (bench/zero_reference.py: DDP, ZeroRedundancyOptimizer and
# FSDP2's fully_shard) and FairScale (bench/fairscale_reference.py: OSS, ShardedDataParallel
# and FullyShardedDataParallel, the seeds' own ZeRO) side by side on the same wide MLP
# (>= 50 M parameters), batch and optimizer. Prints, per stage: per-rank model-state memory measured, estimated
# (parallel/estimate/memory_estimate.h) and by the ZeRO paper's formula; step time relative to
# Largo's DDP; Largo's stage 1 against PyTorch's ZeroRedundancyOptimizer; stage 3 (FSDP) with
# and without prefetch, and with bfloat16 compute copies, and the most full-unit bytes it
# gathered at once. FairScale's FSDP assumes CUDA streams and NCCL's collectives; on the CPU
# it runs with no-op streams (a shim in fairscale_reference.py, recorded in its output) and
# FairScale's ENABLE_NCCL_BASE_COLLECTIVES=0. Each round runs Largo's stages, PyTorch's and
# FairScale's variants (rotating which goes first); the table shows medians over the rounds
# of each run's median step time. Builds nothing. (Needs FairScale: install_deps.sh --bench.)
#
# Targets (issue 6): memory within 5 % of the formula; stage 1 >= 1.2x the throughput of
# PyTorch's ZeroRedundancyOptimizer; stage 2 no slower than DDP. Issue 7: stage 3 memory
# within 5 % of the formula; prefetch faster than no prefetch.
#
# Usage: bench/run_zero_bench.sh [BUILD_DIR] [ROUNDS] [OPTIMIZER] [-- extra flags for both]
#   defaults: build 2 adamw
set -euo pipefail
build="${1:-build}"; rounds="${2:-2}"; optimizer="${3:-adamw}"
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
extra=("$@")

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/zero_bench"
reference="$here/zero_reference.py"
fairscale="$here/fairscale_reference.py"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON" # the PyTorch Largo is built against
[ -x "$bin" ] || { echo "no $bin: build the target zero_bench first" >&2; exit 1; }
world=2

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Runs "$@" as every rank; rank 0's stdout goes to the results, the others' to /dev/null.
run_ranks() {
  local port pids=() status=0
  port=$(free_port)
  for (( rank = world - 1; rank >= 0; --rank )); do
    if (( rank == 0 )); then
      RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        OMP_NUM_THREADS=1 "$@" >> "$results" &
    else
      RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        OMP_NUM_THREADS=1 "$@" > /dev/null &
    fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  return $status
}

results="$build/bench/zero_results.jsonl"
mkdir -p "$(dirname "$results")"
: > "$results"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $world ranks x 1 thread; rounds $rounds"
run_side() {
  case "$1" in
    largo) run_ranks "$bin" --optimizer "$optimizer" "${extra[@]}" ;;
    pytorch) run_ranks "$python" "$reference" --variants ddp,zero,fsdp2 --optimizer "$optimizer" "${extra[@]}" ;;
    fairscale) run_ranks "$python" "$fairscale" --optimizer "$optimizer" "${extra[@]}" ;;
  esac
}
sides=(largo pytorch fairscale)
for (( round = 0; round < rounds; ++round )); do
  for (( i = 0; i < ${#sides[@]}; ++i )); do
    run_side "${sides[(round + i) % ${#sides[@]}]}"
  done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$results" <<'PY'
import json, statistics, sys
from collections import defaultdict

runs = defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["impl"] == "largo":
        no_prefetch = r["stage"] == 3 and not r.get("prefetch", True)
        copies = r.get("compute_dtype", "float32") == "bfloat16"
        key = ("largo", f"stage {r['stage']}" + (" no prefetch" if no_prefetch else "") +
               (" bf16 copies" if copies else ""))
    else:
        key = (r["impl"], r["variant"])
    runs[key].append(r)
ms = {k: statistics.median(r["ms_per_step"] for r in v) for k, v in runs.items()}
first = next(iter(runs.values()))[0]
print(f"model: wide MLP, {first['num_parameters']:,} float32 parameters; {first['optimizer']}; "
      f"batch {first['batch_per_rank']} per rank; {first['world_size']} ranks")

MiB = 1024.0 * 1024.0
failed = False
print("\nper-rank model state, MiB (rank 0 | rank 1): measured / estimated / formula")
print(f"{'':32} {'parameters':>24} {'gradients':>24} {'optimizer state':>24} {'total':>24}  "
      f"{'measured/formula':>16}")
for key in sorted(k for k in runs if k[0] == "largo"):
    r = runs[key][-1]
    for rank, b in enumerate(r["ranks"]):
        cells = []
        for cat in ("parameters", "gradients", "optimizer_state", "total"):
            formula = sum(b["formula"][c] for c in ("parameters", "gradients", "optimizer_state")) \
                if cat == "total" else b["formula"][cat]
            cells.append(f"{b['measured'][cat] / MiB:7.1f}/{b['estimated'][cat] / MiB:7.1f}/"
                         f"{formula / MiB:7.1f}")
        f_total = sum(b["formula"][c] for c in ("parameters", "gradients", "optimizer_state"))
        ratio = b["measured"]["total"] / f_total
        ok = abs(ratio - 1) <= 0.05
        failed |= not ok
        print(f"largo {key[1]:19} rank {rank}  " + " ".join(f"{c:>24}" for c in cells) +
              f"  {ratio:15.4f} {'ok' if ok else 'OFF'}")
for key in sorted(k for k in runs if k[0] != "largo"):
    r = runs[key][-1]
    for rank, b in enumerate(r["ranks"]):
        m = b["measured"]
        print(f"{key[0]:9} {key[1]:14} rank {rank}  " + " ".join(
            f"{m[c] / MiB:24.1f}" for c in ("parameters", "gradients", "optimizer_state", "total")))

print("\nstep time (median over rounds of each run's median), throughput relative to Largo DDP")
ddp = ms[("largo", "stage 0")]
for key in sorted(ms):
    print(f"{key[0]:8} {key[1]:19} {ms[key]:9.1f} ms/step  {ddp / ms[key]:6.2f}x DDP throughput  "
          f"(runs: {', '.join('%.0f' % r['ms_per_step'] for r in runs[key])})")
if ("pytorch", "zero") in ms and ("largo", "stage 1") in ms:
    ratio = ms[("pytorch", "zero")] / ms[("largo", "stage 1")]
    ok = ratio >= 1.2
    failed |= not ok
    print(f"\nLargo stage 1 / PyTorch ZeroRedundancyOptimizer throughput: {ratio:.2f}x "
          f"(target >= 1.2x) {'ok' if ok else 'MISSED'}")
if ("largo", "stage 2") in ms:
    ratio = ddp / ms[("largo", "stage 2")]
    ok = ratio >= 1.0
    failed |= not ok
    print(f"Largo stage 2 / Largo DDP throughput: {ratio:.2f}x (target >= 1.0x) "
          f"{'ok' if ok else 'MISSED'}")
for key in (("largo", "stage 3"), ("largo", "stage 3 no prefetch"),
            ("largo", "stage 3 bf16 copies")):
    if key in runs:
        r = runs[key][-1]
        print(f"{key[1]}: at most {r['peak_gathered_bytes'] / MiB:.1f} MiB of full units gathered "
              f"at once on rank 0 (transient)")
if ("largo", "stage 3") in ms and ("largo", "stage 3 no prefetch") in ms:
    ratio = ms[("largo", "stage 3 no prefetch")] / ms[("largo", "stage 3")]
    ok = ratio > 1.0
    failed |= not ok
    print(f"Largo stage 3 with prefetch / without: {ratio:.2f}x throughput (target > 1.0x) "
          f"{'ok' if ok else 'MISSED'}")
if ("largo", "stage 3") in ms and ("largo", "stage 3 bf16 copies") in ms:
    print(f"Largo stage 3 bfloat16 compute copies / float32 units: "
          f"{ms[('largo', 'stage 3')] / ms[('largo', 'stage 3 bf16 copies')]:.2f}x throughput, "
          f"{runs[('largo', 'stage 3 bf16 copies')][-1]['peak_gathered_bytes'] / runs[('largo', 'stage 3')][-1]['peak_gathered_bytes']:.2f}x "
          f"the gathered bytes")
if ("pytorch", "ddp") in ms:
    print(f"Largo DDP / PyTorch DDP throughput: {ms[('pytorch', 'ddp')] / ddp:.2f}x")
sys.exit(1 if failed else 0)
PY
