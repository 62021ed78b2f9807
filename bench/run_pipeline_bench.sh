#!/usr/bin/env bash
# Pipeline parallelism on the CPU: bench/pipeline_bench.cpp started by `largo launch` (2
# processes x 1 thread over Gloo on 127.0.0.1) or alone (1 process x 1 thread). Three tables:
#
#   bubble      every schedule at 2 stages, M = 4, 8, 16 micro-batches (deep MLP): each rank's
#               measured idle fraction of the schedule next to the closed form
#               (S-1)/(V*M+S-1) (zb_h1: (S-1)(F+I-W)/(M(F+I+W)+(S-1)(F+I-W)) with F = I = W)
#               and the simulation with unit pass costs.
#   memory      peak bytes allocated during one forward_backward per rank (activations,
#               messages, temporaries), M = 8: each schedule against gpipe's, next to the
#               in-flight count the simulation predicts (S - r for 1f1b on rank r, out of
#               M); 1f1b with checkpointed stages too.
#   throughput  deep MLP and ViT: one process on the whole batch, DDP over 2 processes, and
#               2 pipeline stages with each schedule (M = 8): images/s and ratios.
#   passes      one stage's forward F, backward B, and zb_h1's input I and weight W passes
#               (one process, a micro-batch of M = 8): zb_h1 gains (S-1)(B-I+W) of bubble
#               and pays M(I+W-B) of compute per step.
# Each configuration runs ROUNDS times; tables show medians. Builds nothing: build the
# targets pipeline_bench and largo_app first.
#
# Usage: bench/run_pipeline_bench.sh [BUILD_DIR] [ROUNDS] [STEPS]   defaults: build 3 5
set -euo pipefail
build="${1:-build}"; rounds="${2:-3}"; steps="${3:-5}"
bin="$build/bench/pipeline_bench"
largo="$build/largo"
python=/usr/bin/python3
[ -x "$bin" ] || { echo "no $bin: build the target pipeline_bench first" >&2; exit 1; }
[ -x "$largo" ] || { echo "no $largo: build the target largo_app first" >&2; exit 1; }
results="$build/bench/pipeline_bench_results.jsonl"
: > "$results"
cores=$(nproc --all)
export OMP_NUM_THREADS=1

run() { # section, procs, pipeline_bench arguments...; appends rank 0's JSON line tagged
  local section="$1" procs="$2"; shift 2
  local line
  if [ "$procs" -eq 1 ]; then
    line=$("$bin" "$@" --steps "$steps" | grep '^{')
  else
    line=$("$largo" launch --nproc_per_node "$procs" -- "$bin" "$@" --steps "$steps" | grep '^{')
  fi
  echo "{\"section\": \"$section\", \"result\": $line}" >> "$results"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $cores cores; rounds $rounds," \
  "$steps timed steps per run"
for (( round = 0; round < rounds; ++round )); do
  for m in 4 8 16; do
    for schedule in gpipe 1f1b zb_h1; do
      run bubble 2 pipeline mlp --schedule $schedule --microbatches $m --batch 1024
    done
    run bubble 2 pipeline mlp --schedule interleaved_1f1b --virtual 2 --microbatches $m --batch 1024
  done
  for schedule in gpipe 1f1b zb_h1; do
    run memory 2 pipeline mlp --schedule $schedule --microbatches 8 --batch 2048
  done
  run memory 2 pipeline mlp --schedule interleaved_1f1b --virtual 2 --microbatches 8 --batch 2048
  run memory 2 pipeline mlp --schedule 1f1b --microbatches 8 --batch 2048 --checkpoint
  for model in mlp vit; do
    batch=$([ $model = mlp ] && echo 1024 || echo 64)
    run throughput 1 plain $model --batch $batch
    run throughput 2 plain $model --batch $batch
    for schedule in gpipe 1f1b zb_h1; do
      run throughput 2 pipeline $model --schedule $schedule --microbatches 8 --batch $batch
    done
    run throughput 2 pipeline $model --schedule interleaved_1f1b --virtual 2 --microbatches 8 \
      --batch $batch
  done
  for model in mlp vit; do
    batch=$([ $model = mlp ] && echo 1024 || echo 64)
    run passes 1 passes $model --batch $batch --microbatches 8
  done
  echo "  round $((round + 1))/$rounds done; load $(cut -d' ' -f1 /proc/loadavg)"
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$results" <<'PY'
import json, statistics, sys
from collections import defaultdict

runs = defaultdict(list)
for line in open(sys.argv[1]):
    entry = json.loads(line)
    r = entry["result"]
    key = (entry["section"], r["model"], r["mode"], r.get("procs", 1), r.get("schedule", "-"),
           r.get("microbatches", 0), r.get("virtual_stages", 1), r.get("checkpoint", False))
    runs[key].append(r)

def med(rs, field, rank=None):
    values = [r[field][rank] if rank is not None else r[field] for r in rs]
    return statistics.median(values)

def name(schedule, virtual, checkpoint=False):
    return schedule + (f" V={virtual}" if virtual > 1 else "") + (" +ckpt" if checkpoint else "")

print("\nbubble: 2 stages, deep MLP (batch 1024); idle fraction of the schedule per rank")
print(f"  {'schedule':22} {'M':>3} {'rank 0':>7} {'rank 1':>7} {'mean':>7} {'formula':>8}"
      f" {'simulated':>9} {'mean/formula':>12}")
for key, rs in sorted((k, v) for k, v in runs.items() if k[0] == "bubble"):
    _, model, mode, procs, schedule, m, virtual, ckpt = key
    idle = [med(rs, "idle_fraction", r) for r in range(2)]
    mean = sum(idle) / 2
    formula = rs[0]["bubble_formula"]
    print(f"  {name(schedule, virtual):22} {m:>3} {idle[0]:7.3f} {idle[1]:7.3f} {mean:7.3f}"
          f" {formula:8.3f} {rs[0]['bubble_simulated']:9.3f} {mean / formula:12.2f}")

print("\nmemory: 2 stages, M = 8, deep MLP (batch 2048): peak MiB allocated in one step")
memory = {k: v for k, v in runs.items() if k[0] == "memory"}
gpipe = next((v for k, v in memory.items() if k[4] == "gpipe"), None)
print(f"  {'schedule':22} {'rank 0':>8} {'rank 1':>8} {'/gpipe 0':>9} {'/gpipe 1':>9}"
      f" {'in flight (sim.)':>17}")
for key, rs in sorted(memory.items()):
    peaks = [med(rs, "peak_activation_bytes", r) / 2**20 for r in range(2)]
    ratios = [p / (med(gpipe, "peak_activation_bytes", r) / 2**20) if gpipe else float("nan")
              for r, p in enumerate(peaks)]
    flight = rs[0]["peak_in_flight_simulated"]
    print(f"  {name(key[4], key[6], key[7]):22} {peaks[0]:8.1f} {peaks[1]:8.1f} {ratios[0]:9.2f}"
          f" {ratios[1]:9.2f} {str(flight) + ' of M=8':>17}")
print("  (1f1b's activations in flight are (S - r)/M of gpipe's: 0.25 on rank 0, 0.125 on"
      " rank 1; measured peaks also hold one layer's temporaries)")

print("\nthroughput: images/s (2 procs x 1 thread, or 1 proc x 1 thread)")
for model in ("mlp", "vit"):
    rows = {k: v for k, v in runs.items() if k[0] == "throughput" and k[1] == model}
    if not rows:
        continue
    single = next(v for k, v in rows.items() if k[2] == "plain" and k[3] == 1)
    ddp = next(v for k, v in rows.items() if k[2] == "plain" and k[3] == 2)
    r0 = single[0]
    print(f"  {model}: {r0['num_parameters']:,} parameters, global batch {r0['batch']}")
    print(f"    {'variant':26} {'images/s':>9} {'/1 proc':>8} {'/DDP':>6} {'state MiB/rank':>15}")
    for key, rs in sorted(rows.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][4])):
        label = ("1 process" if key[3] == 1 else "DDP 2 procs") if key[2] == "plain" \
            else "pipeline " + name(key[4], key[6])
        ips = med(rs, "images_per_sec")
        state = max(rs[0]["model_state_bytes"]) / 2**20
        print(f"    {label:26} {ips:9.1f} {ips / med(single, 'images_per_sec'):8.2f}"
              f" {ips / med(ddp, 'images_per_sec'):6.2f} {state:15.1f}")

print("\npasses: one stage (the second half of the blocks), one micro-batch of M = 8; ms (1 process)")
print(f"  {'model':5} {'rows':>5} {'F':>7} {'B':>7} {'I':>7} {'W':>7} {'(I+W)/B':>8}"
      f" {'zb_h1 gain':>11} {'zb_h1 cost':>11} (per step, S = 2, M = 8)")
for key, rs in sorted((k, v) for k, v in runs.items() if k[0] == "passes"):
    f, b, i, w = (med(rs, x) for x in ("forward_ms", "backward_ms", "input_ms", "weight_ms"))
    print(f"  {key[1]:5} {rs[0]['microbatch_rows']:>5} {f:7.2f} {b:7.2f} {i:7.2f} {w:7.2f}"
          f" {(i + w) / b:8.2f} {(b - i + w):10.2f}ms {8 * (i + w - b):10.2f}ms")
PY
