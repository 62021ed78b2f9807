#!/usr/bin/env bash
# `largo train` of two builds side by side (A/B): e.g. a commit before a refactor against one
# after it, on the program users run. Each round runs every config with A and with B (which
# goes first alternates by round), on synthetic data so that nothing but the build differs;
# each run's images/s is the median of its metrics.jsonl train lines after the first (which
# holds start-up). Prints per config the median images/s of A and B over the rounds, their
# ranges and B / A. Builds nothing.
#
# Usage: bench/run_largo_ab.sh BUILD_A BUILD_B ROUNDS CONFIG_NAME=OVERRIDES...
#   CONFIG_NAME=OVERRIDES: a name, '=', then `largo train` overrides separated by spaces, e.g.
#   ddp="DISTRIBUTED.NUM_PROC_PER_NODE=2 OPTIMIZER.use_zero=False"
# Every run also gets the overrides in $LARGO_AB_COMMON (default: a 2-rank, 1-thread synthetic
# job of the small CNN's data shape with the resnet trunk; see below).
set -euo pipefail
[ $# -ge 4 ] || { sed -n 2,13p "$0"; exit 2; }
build_a="$1"; build_b="$2"; rounds="$3"; shift 3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../scripts/torch_env.sh"
default_common='DATA.TRAIN.DATA_SOURCES=[synthetic] DATA.TEST.DATA_SOURCES=[synthetic]
  DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=1024 DATA.TRAIN.SYNTHETIC.IMAGE_SHAPE=[3,32,32]
  DATA.TEST.SYNTHETIC.IMAGE_SHAPE=[3,32,32] DATA.TRAIN.BATCHSIZE_PER_REPLICA=32
  DATA.TRAIN.TRANSFORMS=[{"name":"ToTensor"}] DATA.NUM_DATALOADER_WORKERS=1 TEST_MODEL=False
  MODEL.TRUNK.NAME=resnet MODEL.TRUNK.RESNETS.DEPTH=18 MODEL.TRUNK.RESNETS.STEM=cifar
  OPTIMIZER.num_epochs=1 LOG_FREQUENCY=2 MACHINE.DEVICE=cpu MACHINE.NUM_THREADS=1
  DISTRIBUTED.NUM_PROC_PER_NODE=2 CHECKPOINT.CHECKPOINT_FREQUENCY=100'
common="${LARGO_AB_COMMON:-$default_common}"
work=$(mktemp -d)
results="$work/results.txt"
echo "A: $build_a ($(git -C "$build_a/.." log --oneline -1 2>/dev/null | cut -c1-60))"
echo "B: $build_b ($(git -C "$build_b/.." log --oneline -1 2>/dev/null | cut -c1-60))"
echo "machine: $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg); rounds $rounds"

run() { # side build name overrides: appends "name side images/s"
  local dir="$work/run_$1_$3"
  rm -rf "$dir"
  # shellcheck disable=SC2086
  "$2/largo" train $common $4 "CHECKPOINT.DIR=$dir" > "$dir.log" 2>&1 ||
    { echo "$1 $3 failed: see $dir.log" >&2; tail -5 "$dir.log" >&2; exit 1; }
  "$LARGO_PYTHON" - "$dir/metrics.jsonl" "$3" "$1" >> "$results" <<'PY'
import json, statistics, sys
rates = [e["images_per_sec"] for e in map(json.loads, open(sys.argv[1])) if e["phase"] == "train"]
print(sys.argv[2], sys.argv[3], statistics.median(rates[1:] or rates))
PY
}

for (( round = 0; round < rounds; ++round )); do
  for config in "$@"; do
    name="${config%%=*}"; overrides="${config#*=}"
    if (( round % 2 == 0 )); then
      run A "$build_a" "$name" "$overrides"; run B "$build_b" "$name" "$overrides"
    else
      run B "$build_b" "$name" "$overrides"; run A "$build_a" "$name" "$overrides"
    fi
  done
  echo "  round $((round + 1))/$rounds done; load $(cut -d' ' -f1 /proc/loadavg)"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

"$LARGO_PYTHON" - "$results" <<'PY'
import statistics, sys
from collections import defaultdict
runs = defaultdict(list)
for line in open(sys.argv[1]):
    name, side, rate = line.split()
    runs[(name, side)].append(float(rate))
names = list(dict.fromkeys(name for name, _ in runs))
print(f"\n{'config':12} {'A images/s (range)':>26} {'B images/s (range)':>26} {'B / A':>7}")
for name in names:
    a, b = runs[(name, "A")], runs[(name, "B")]
    cell = lambda r: f"{statistics.median(r):8.1f} ({min(r):.1f}-{max(r):.1f})"
    print(f"{name:12} {cell(a):>26} {cell(b):>26} {statistics.median(b) / statistics.median(a):7.3f}")
PY
rm -rf "$work"
