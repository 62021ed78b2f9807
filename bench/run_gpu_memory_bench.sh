#!/usr/bin/env bash
# Model-state memory per rank against `largo estimate`, on one GPU: `largo train` of
# ResNet-50 (synthetic 224x224 images, batch 32 per rank, 4 steps, O1 bfloat16, AdamW) with
# two processes sharing the GPU over Gloo with CUDA tensors (LOCAL_RANK modulo the GPUs picks
# the device), in DDP, ZeRO-1, ZeRO-2 and FSDP. After its first step the trainer logs, per
# rank, the model state it holds (parameters, gradients, optimizer state, summed from the
# tensors, not the CUDA allocator's view) beside parallel::estimate_memory's figure;
# `largo estimate` prints the estimate for the same config.
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
