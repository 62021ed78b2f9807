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
  echo "run_gpu_train_bench: $model largo" >&2
  "$bin" "$model" "${common[@]}" --warmup "$warmup" "${largo_profile[@]}" | tee -a "$results"
  echo "run_gpu_train_bench: $model pytorch eager" >&2
  "$python" "$here/precision_reference.py" "$model" "${common[@]}" --warmup "$warmup" \
    "${pytorch_profile[@]}" | tee -a "$results"
  if [ -n "${LARGO_GPU_BENCH_PROFILE:-}" ]; then
    echo "run_gpu_train_bench: $model, where the GPU time goes (3 profiled steps each)"
    "$python" "$here/kernel_profile_table.py" "$LARGO_GPU_BENCH_PROFILE/${model}_largo.json" \
      "$LARGO_GPU_BENCH_PROFILE/${model}_pytorch.json" --steps 3 --top 20 \
      --json "$LARGO_GPU_BENCH_PROFILE/${model}_summary.json" |
      tee "$LARGO_GPU_BENCH_PROFILE/${model}_table.md" || echo "kernel_profile_table failed" >&2
    gzip -f "$LARGO_GPU_BENCH_PROFILE/${model}_largo.json" "$LARGO_GPU_BENCH_PROFILE/${model}_pytorch.json"
  fi
  echo "run_gpu_train_bench: $model pytorch torch.compile" >&2
  "$python" "$here/precision_reference.py" "$model" "${common[@]}" --warmup "$compile_warmup" \
    --compile | tee -a "$results"
done

"$python" - "$results" <<'PY'
import json, sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
peak = next(r for r in rows if "bf16_tflops" in r)
print(f"\n{peak['device']}: measured bf16 matrix peak {peak['bf16_tflops']:.0f} TFLOP/s "
      f"({peak['matmul']}, median of 20)")
print(f"{'model':9} {'side':16} {'batch':>5} {'img/s':>8} {'vs eager':>8} {'MFU':>6} "
      f"{'peak GiB':>8}  notes")
for model in dict.fromkeys(r["model"] for r in rows if "model" in r):
    runs = [r for r in rows if r.get("model") == model]
    eager = next(r for r in runs if r["impl"] == "pytorch" and not r.get("compiled"))
    flops = eager["training_flops_per_image"]
    for r in runs:
        side = "largo" if r["impl"] == "largo" else (
            "pytorch compile" if r.get("compiled") else "pytorch eager")
        mfu = flops * r["images_per_sec"] / (peak["bf16_tflops"] * 1e12)
        notes = []
        if r["impl"] == "largo":
            notes.append(f"analytic FLOPs/img {r['training_flops_per_image'] / 1e9:.1f} G vs "
                         f"counted {flops / 1e9:.1f} G")
        if r.get("compiled"):
            notes.append(f"warm-up incl. compile {r['warmup_seconds']:.0f} s")
        print(f"{model:9} {side:16} {r['batch']:>5} {r['images_per_sec']:>8.0f} "
              f"{r['images_per_sec'] / eager['images_per_sec']:>7.3f}x {100 * mfu:>5.1f}% "
              f"{r['cuda_peak_allocated_bytes'] / 2**30:>8.1f}  {'; '.join(notes)}")
PY
