#!/usr/bin/env bash
# Tensor parallelism against one process: bench/tensor_parallel_bench.cpp (a ViT trained with
# AdamW; default ViT-S/16 at 224x224, batch 8) in 1 process and split over 2 ranks (Gloo on
# 127.0.0.1, 1 thread each), without and with sequence parallelism, ROUNDS rounds alternating
# the order; the table shows each side's per-rank model state, activation memory and speed
# (medians over the rounds), and each TP 2 run's share of the one process's. Target (issue 30): parameters, gradients and optimizer state
# per rank halved within 5 % (a share of 0.475-0.525); the replicated parts (patch
# embedding, positions, LayerNorms, the head) keep it above one half. Builds nothing.
#
# Usage: bench/run_tensor_parallel_bench.sh [BUILD_DIR] [ROUNDS] [-- flags for the bench]
set -euo pipefail
build="${1:-build}"; rounds="${2:-2}"
shift $(( $# < 2 ? $# : 2 ))
[ "${1:-}" = "--" ] && shift
extra=("$@")
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$build/bench/tensor_parallel_bench"
source "$here/../scripts/torch_env.sh"
python="$LARGO_PYTHON"
[ -x "$bin" ] || { echo "no $bin: build the target tensor_parallel_bench first" >&2; exit 1; }

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Runs the bench as every rank of a world of $1, with the bench flags after it; rank 0's line
# goes to the results.
run_world() {
  local world=$1 port pids=() status=0
  shift
  port=$(free_port)
  for (( rank = world - 1; rank >= 0; --rank )); do
    local out=/dev/null
    (( rank == 0 )) && out="$results.part"
    RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      OMP_NUM_THREADS=1 "$bin" "${extra[@]}" "$@" > "$out" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  cat "$results.part" >> "$results"
  return $status
}

results="$build/bench/tensor_parallel_results.jsonl"
mkdir -p "$(dirname "$results")"
: > "$results"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "load average before: $(cut -d' ' -f1-3 /proc/loadavg); rounds $rounds"
for (( round = 0; round < rounds; ++round )); do
  if (( round % 2 == 0 )); then
    run_world 1; run_world 2; run_world 2 --sequence-parallel 1
  else
    run_world 2 --sequence-parallel 1; run_world 2; run_world 1
  fi
done
rm -f "$results.part"
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$results" <<'PY'
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
keys = ["parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "activation_bytes",
        "median_step_ms", "images_per_second"]
# One process, TP 2, TP 2 with sequence parallelism (SP).
by_side = {}
for run in runs:
    side = "one" if run["world_size"] == 1 else ("sp" if run.get("sequence_parallel") else "tp")
    by_side.setdefault(side, []).append(run)
median = {s: {k: statistics.median(r[k] for r in rs) for k in keys} for s, rs in by_side.items()}
print(f"ViT, {runs[0]['full_parameters']:,} parameters; per rank, medians of {len(by_side['one'])} run(s)")
print(f"{'':24}{'1 process':>12}{'TP 2':>10}{'share':>8}{'TP 2 + SP':>12}{'share':>8}")
mib = 2.0 ** 20
def row(label, value, scale=1.0, digits=2):
    one = value(median["one"])
    cells = "".join(f"{value(median[s]) / scale:{w}.{digits}f}{value(median[s]) / one:8.3f}"
                    for s, w in (("tp", 10), ("sp", 12)))
    print(f"{label:24}{one / scale:12.{digits}f}{cells}")
for key, label in [("parameter_bytes", "parameters MiB"), ("gradient_bytes", "gradients MiB"),
                   ("optimizer_state_bytes", "optimizer state MiB"),
                   ("activation_bytes", "activations MiB")]:
    row(label, lambda m, k=key: m[k], mib)
row("model state MiB",
    lambda m: m["parameter_bytes"] + m["gradient_bytes"] + m["optimizer_state_bytes"], mib)
row("step ms", lambda m: m["median_step_ms"], digits=1)
row("images/s", lambda m: m["images_per_second"], digits=1)
PY
