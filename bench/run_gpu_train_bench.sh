#!/usr/bin/env bash
# Training throughput on one GPU, Largo against PyTorch eager and torch.compile, side by side
# in one run: ResNet-50 (bfloat16 autocast, channels-last, batch 256) and ViT-B/16 (bfloat16
# autocast, batch 128), synthetic data already on the GPU, SGD with Nesterov momentum
# (bench/precision_bench.cpp against bench/precision_reference.py, precision o1_bf16).
# Model FLOP utilisation = training FLOPs per image (counted by torch.utils.flop_counter on
# PyTorch's model, the same count for every column) x images/s / the GPU's measured bf16
# matrix peak (bench/cuda_matmul_peak.py). Largo's own analytic count is printed beside it as
# a cross-check. Peak memory is the CUDA allocator's peak over the timed steps.
#
# Usage: bench/run_gpu_train_bench.sh [BUILD_DIR] [RESULTS_JSONL]
#   LARGO_BENCH_WARMUP / LARGO_BENCH_STEPS: warm-up and timed steps per run (default 5, 20;
#   torch.compile gets at least 3 warm-up steps, in which it compiles).
#   LARGO_GPU_BENCH_MODELS: which of "resnet50 vit_b16" to run (default both).
#   LARGO_GPU_BENCH_ROUNDS: how many times Largo and eager run, alternately (default 1); the
#   table shows each side's median images/s and, with more than one round, the range.
#   LARGO_GPU_BENCH_UNCHECKED=1: each round also runs Largo with --no-finite-check (no inf/NaN
#   check of the gradients before the step: what PyTorch's loop does), a row of its own.
#   LARGO_GPU_BENCH_COMPILE=0 leaves torch.compile out (its warm-up compiles for 40-60 s).
#   LARGO_GPU_BENCH_PROFILE=DIR: the Largo and eager runs also profile 3 steps after their
#   timed ones (Kineto, which does not touch the timing) into DIR/MODEL_{largo,pytorch}.json.gz,
#   and bench/kernel_profile_table.py prints where each side's GPU time goes (DIR/MODEL_table.md).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-build}"
results="${2:-$build/bench/gpu_train_results.jsonl}"
bin="$build/bench/precision_bench"
python="${LARGO_PYTHON:-python3}"
warmup="${LARGO_BENCH_WARMUP:-5}" steps="${LARGO_BENCH_STEPS:-20}"
compile_warmup=$(( warmup < 3 ? 3 : warmup ))
[ -x "$bin" ] || { echo "no $bin: build the target precision_bench first" >&2; exit 1; }
: > "$results"

"$python" "$here/cuda_matmul_peak.py" | tee -a "$results"
for model in ${LARGO_GPU_BENCH_MODELS:-resnet50 vit_b16}; do
  case "$model" in
    resnet50) flags=(--batch 256 --channels-last) ;;
    vit_b16) flags=(--batch 128) ;;
    *) echo "unknown model $model" >&2; exit 64 ;;
  esac
  common=(--precision o1_bf16 --device cuda --threads 16 --steps "$steps" "${flags[@]}")
  largo_profile=() pytorch_profile=()
  if [ -n "${LARGO_GPU_BENCH_PROFILE:-}" ]; then
    mkdir -p "$LARGO_GPU_BENCH_PROFILE"
    largo_profile=(--profile "$LARGO_GPU_BENCH_PROFILE/${model}_largo.json" --profile-steps 3)
    pytorch_profile=(--profile "$LARGO_GPU_BENCH_PROFILE/${model}_pytorch.json" --profile-steps 3)
  fi
  for round in $(seq "${LARGO_GPU_BENCH_ROUNDS:-1}"); do
    echo "run_gpu_train_bench: $model largo, round $round" >&2
    "$bin" "$model" "${common[@]}" --warmup "$warmup" "${largo_profile[@]}" | tee -a "$results"
    if [ "${LARGO_GPU_BENCH_UNCHECKED:-0}" = 1 ]; then
      echo "run_gpu_train_bench: $model largo without the finite check, round $round" >&2
      "$bin" "$model" "${common[@]}" --warmup "$warmup" --no-finite-check | tee -a "$results"
    fi
    echo "run_gpu_train_bench: $model pytorch eager, round $round" >&2
    "$python" "$here/precision_reference.py" "$model" "${common[@]}" --warmup "$warmup" \
      "${pytorch_profile[@]}" | tee -a "$results"
    largo_profile=() pytorch_profile=() # the first round's profile only
  done
  if [ -n "${LARGO_GPU_BENCH_PROFILE:-}" ]; then
    echo "run_gpu_train_bench: $model, where the GPU time goes (3 profiled steps each)"
    "$python" "$here/kernel_profile_table.py" "$LARGO_GPU_BENCH_PROFILE/${model}_largo.json" \
      "$LARGO_GPU_BENCH_PROFILE/${model}_pytorch.json" --steps 3 --top 20 \
      --json "$LARGO_GPU_BENCH_PROFILE/${model}_summary.json" |
      tee "$LARGO_GPU_BENCH_PROFILE/${model}_table.md" || echo "kernel_profile_table failed" >&2
    gzip -f "$LARGO_GPU_BENCH_PROFILE/${model}_largo.json" "$LARGO_GPU_BENCH_PROFILE/${model}_pytorch.json"
  fi
  if [ "${LARGO_GPU_BENCH_COMPILE:-1}" != 0 ]; then
    echo "run_gpu_train_bench: $model pytorch torch.compile" >&2
    "$python" "$here/precision_reference.py" "$model" "${common[@]}" --warmup "$compile_warmup" \
      --compile | tee -a "$results"
  fi
done

"$python" - "$results" <<'PY'
import json, statistics, sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
peak = next(r for r in rows if "bf16_tflops" in r)
print(f"\n{peak['device']}: measured bf16 matrix peak {peak['bf16_tflops']:.0f} TFLOP/s "
      f"({peak['matmul']}, median of 20)")
print(f"{'model':9} {'side':16} {'batch':>5} {'img/s':>8} {'vs eager':>8} {'MFU':>6} "
      f"{'peak GiB':>8}  notes")
def side_of(r):
    if r["impl"] == "largo":
        return "largo" if r.get("finite_check", True) else "largo unchecked"
    return "pytorch compile" if r.get("compiled") else "pytorch eager"
for model in dict.fromkeys(r["model"] for r in rows if "model" in r):
    runs = [r for r in rows if r.get("model") == model]
    eager_runs = [r for r in runs if side_of(r) == "pytorch eager"]
    flops = eager_runs[0]["training_flops_per_image"]
    eager = statistics.median(r["images_per_sec"] for r in eager_runs)
    for side in dict.fromkeys(side_of(r) for r in runs):
        mine = [r for r in runs if side_of(r) == side]
        rates = [r["images_per_sec"] for r in mine]
        rate = statistics.median(rates)
        mfu = flops * rate / (peak["bf16_tflops"] * 1e12)
        notes = []
        if len(rates) > 1:
            notes.append(f"median of {len(rates)} rounds, {min(rates):.0f}-{max(rates):.0f}")
        if side.startswith("largo"):
            notes.append(f"analytic FLOPs/img {mine[0]['training_flops_per_image'] / 1e9:.1f} G "
                         f"vs counted {flops / 1e9:.1f} G")
        if side == "pytorch compile":
            notes.append(f"warm-up incl. compile {mine[0]['warmup_seconds']:.0f} s")
        peak_gib = max(r["cuda_peak_allocated_bytes"] for r in mine) / 2**30
        print(f"{model:9} {side:16} {mine[0]['batch']:>5} {rate:>8.0f} {rate / eager:>7.3f}x "
              f"{100 * mfu:>5.1f}% {peak_gib:>8.1f}  {'; '.join(notes)}")
PY
