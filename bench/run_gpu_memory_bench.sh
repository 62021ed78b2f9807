#!/usr/bin/env bash
# Model-state memory per rank against `largo estimate`, on one GPU: `largo train` of
# ResNet-50 (synthetic 224x224 images, batch 32 per rank, 4 steps, O1 bfloat16, AdamW) with
# two processes sharing the GPU over Gloo with CUDA tensors (LOCAL_RANK modulo the GPUs picks
# the device), in DDP, ZeRO-1, ZeRO-2 and FSDP. After its first step the trainer logs, per
# rank, the model state it holds (parameters, gradients, optimizer state, summed from the
# tensors) beside parallel::estimate_memory's figure, and on a GPU the CUDA allocator's bytes
# allocated at that moment (torch.cuda.memory_allocated(): the model state as the allocator
# sees it, plus whatever else is live) and its peak; `largo estimate` prints the estimate for
# the same config. The last table puts the estimate's total beside the allocator's bytes.
#
# Usage: bench/run_gpu_memory_bench.sh BUILD_DIR WORK_DIR
#   LARGO_MEMORY_BENCH_DEVICE=cpu tries the script without a GPU (an MLP trunk instead).
set -euo pipefail
build="${1:?usage: run_gpu_memory_bench.sh BUILD_DIR WORK_DIR}"
work="${2:?usage: run_gpu_memory_bench.sh BUILD_DIR WORK_DIR}"
device="${LARGO_MEMORY_BENCH_DEVICE:-gpu}"
trunk='{NAME: resnet, RESNETS: {DEPTH: 50}}' shape='[3, 224, 224]' head=2048 batch=32
if [ "$device" = cpu ]; then trunk='{NAME: mlp, MLP: {HIDDEN_DIMS: [256]}}' shape='[3, 32, 32]' head=256 batch=8; fi
mkdir -p "$work"
cat > "$work/memory.yaml" <<YAML
config:
  LOG_FREQUENCY: 2
  TEST_MODEL: False
  DATA:
    TRAIN:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {NUM_SAMPLES: $(( batch * 2 * 4 )), IMAGE_SHAPE: $shape, NUM_CLASSES: 1000}
      BATCHSIZE_PER_REPLICA: $batch
      TRANSFORMS: [{name: ToTensor}]
    TEST:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {NUM_SAMPLES: $(( batch * 2 )), IMAGE_SHAPE: $shape, NUM_CLASSES: 1000}
      BATCHSIZE_PER_REPLICA: $batch
      TRANSFORMS: [{name: ToTensor}]
  MODEL:
    TRUNK: $trunk
    HEAD: {PARAMS: [[mlp, {dims: [$head, 1000]}]]}
    AMP_PARAMS: {USE_AMP: True, DTYPE: bfloat16, AMP_ARGS: {opt_level: O1}}
  OPTIMIZER:
    name: adamw
    weight_decay: 0.05
    num_epochs: 1
    param_schedulers: {lr: {name: constant, value: 0.001}}
  DISTRIBUTED: {BACKEND: gloo, NUM_NODES: 1, NUM_PROC_PER_NODE: 2}
  MACHINE: {DEVICE: $device}
YAML
zero=(config.OPTIMIZER.name=zero "config.OPTIMIZER.base_optimizer={name: adamw, weight_decay: 0.05}")
for stage in ddp zero1 zero2 fsdp; do
  case "$stage" in
    ddp) overrides=() ;;
    zero1) overrides=("${zero[@]}") ;;
    zero2) overrides=("${zero[@]}" config.MODEL.SHARDED_DDP_SETUP.USE_SDP=True) ;;
    fsdp) overrides=(config.MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True) ;;
  esac
  echo "== $stage"
  "$build/largo" estimate "$work/memory.yaml" "${overrides[@]}" 2>&1 | grep -iE "stage|total|param|grad|optim" | head -12 || true
  rm -rf "$work/run_$stage"
  "$build/largo" train "$work/memory.yaml" "${overrides[@]}" "config.CHECKPOINT.DIR=$work/run_$stage" \
    > "$work/train_$stage.log" 2>&1 || { tail -30 "$work/train_$stage.log"; exit 1; }
  grep -E "model state on rank|train epoch" "$work/train_$stage.log" | sed 's/^.* info //' || true
done
# PyTorch's allocator on the same workload after one step: its offset beyond the model state
# is what the CUDA libraries keep (workspaces), to read Largo's offset against.
if [ "$device" = gpu ]; then
  "${LARGO_PYTHON:-python3}" "$(dirname "$0")/cuda_model_state_reference.py" || true
fi
# Estimate (model state: parameters + gradients + optimizer state) against the allocator.
python3 - "$work" <<'PY'
import re, sys
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
def mib(value, unit): return float(value) * units[unit] / 2**20
print("mode   rank  estimate MiB  allocator now MiB  allocator - estimate MiB  estimate/allocator  allocator peak MiB")
for stage in ["ddp", "zero1", "zero2", "fsdp"]:
    for line in open(f"{sys.argv[1]}/train_{stage}.log"):
        if "model state on rank" not in line: continue
        rank = re.search(r"on rank (\d+)", line).group(1)
        pairs = re.findall(r"([\d.]+) / ([\d.]+) MiB", line)
        estimate = sum(float(e) for _, e in pairs)
        now = re.search(r"CUDA allocator: ([\d.]+) (\w+) allocated now, ([\d.]+) (\w+) at the peak", line)
        if not now:
            print(f"{stage:6} {rank:>4}  {estimate:12.2f}  (no CUDA allocator figure: not on a GPU)")
            continue
        allocated, peak = mib(now.group(1), now.group(2)), mib(now.group(3), now.group(4))
        print(f"{stage:6} {rank:>4}  {estimate:12.2f}  {allocated:17.2f}  {allocated - estimate:23.2f}  {estimate / allocated:18.3f}  {peak:18.2f}")
PY
