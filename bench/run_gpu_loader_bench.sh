#!/usr/bin/env bash
# The image pipeline feeding ResNet-50 on one GPU, end to end through `largo train`: an
# ImageNet-like JPEG folder (bench/make_image_folder.py), RandomResizedCrop 224 + flip +
# Normalize on the loader's threads, ResNet-50 in bfloat16 autocast (O1), batch 256, SGD:
# configs/examples/imagenet_resnet50.yaml's training side, one epoch of the folder. The trainer's log
# line says, per LOG_FREQUENCY steps, the training img/s and the fraction of the step time
# the GPU loop spent waiting for a batch ("waited N%"); the first window holds cuDNN's set-up.
#
# Usage: bench/run_gpu_loader_bench.sh BUILD_DIR WORK_DIR [IMAGES] [WORKERS]
#   IMAGES (default 7680 = 30 steps of 256) are written once to WORK_DIR/jpeg; WORKERS (default
#   the number of cores) is DATA.NUM_DATALOADER_WORKERS. LARGO_LOADER_BENCH_DEVICE=cpu and a
#   small IMAGES try the script on a machine without a GPU (batch 16, ResNet-18).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:?usage: run_gpu_loader_bench.sh BUILD_DIR WORK_DIR [IMAGES] [WORKERS]}"
work="${2:?usage: run_gpu_loader_bench.sh BUILD_DIR WORK_DIR [IMAGES] [WORKERS]}"
images="${3:-7680}" workers="${4:-$(nproc)}"
python="${LARGO_PYTHON:-python3}"
device="${LARGO_LOADER_BENCH_DEVICE:-gpu}"
mkdir -p "$work"
# make_image_folder.py writes ~40 JPEGs/s on one core: at most 512 distinct ones, the rest hard
# links to them under other names (each is still read and decoded as its own sample; the
# folder is in the page cache either way).
unique=$(( images < 512 ? images : 512 ))
if [ ! -f "$work/jpeg/.complete_$images" ]; then
  rm -rf "$work/jpeg" "$work/unique"
  began=$(date +%s)
  "$python" "$here/make_image_folder.py" "$work/unique" "$unique" --classes 10
  "$python" - "$work/unique" "$work/jpeg" "$images" <<'PY'
import os, sys

unique, out, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
originals = sorted(os.path.join(d, f) for d in os.listdir(unique)
                   for f in os.listdir(os.path.join(unique, d)) if f.lower().endswith((".jpg", ".jpeg")))
for i in range(count):
    original = originals[i % len(originals)]
    os.makedirs(os.path.join(out, os.path.dirname(original)), exist_ok=True)
    os.link(os.path.join(unique, original), os.path.join(out, os.path.dirname(original), f"copy{i}.JPEG"))
PY
  touch "$work/jpeg/.complete_$images"
  echo "run_gpu_loader_bench: $images JPEGs ($unique distinct) written in $(( $(date +%s) - began )) s" >&2
fi
batch=256 depth=50
if [ "$device" = cpu ]; then batch=16 depth=18; fi
rm -rf "$work/run"
# configs/examples/imagenet_resnet50.yaml's training side for one epoch of the folder.
cat > "$work/resnet_folder.yaml" <<YAML
config:
  LOG_FREQUENCY: 5
  TEST_MODEL: False
  DATA:
    NUM_DATALOADER_WORKERS: $workers
    TRAIN:
      DATA_SOURCES: [disk_folder]
      LABEL_SOURCES: [disk_folder]
      DATASET_NAMES: [jpeg_folder]
      DATA_PATHS: ["$work/jpeg"]
      BATCHSIZE_PER_REPLICA: $batch
      TRANSFORMS:
        - {name: RandomResizedCrop, size: 224}
        - {name: RandomHorizontalFlip}
        - {name: ToTensor}
        - {name: Normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
    TEST: # not evaluated (TEST_MODEL False), but a supervised run checks its shape
      DATA_SOURCES: [disk_folder]
      LABEL_SOURCES: [disk_folder]
      DATASET_NAMES: [jpeg_folder]
      DATA_PATHS: ["$work/jpeg"]
      BATCHSIZE_PER_REPLICA: $batch
      TRANSFORMS:
        - {name: Resize, size: 256}
        - {name: CenterCrop, size: 224}
        - {name: ToTensor}
        - {name: Normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
  MODEL:
    TRUNK: {NAME: resnet, RESNETS: {DEPTH: $depth}}
    HEAD: {PARAMS: [[mlp, {dims: [$(( depth == 50 ? 2048 : 512 )), 10]}]]}
    AMP_PARAMS: {USE_AMP: True, DTYPE: bfloat16, AMP_ARGS: {opt_level: O1}}
  OPTIMIZER:
    name: sgd
    momentum: 0.9
    weight_decay: 0.0001
    num_epochs: 1
    param_schedulers: {lr: {name: constant, value: 0.1}}
  MACHINE: {DEVICE: $device}
  CHECKPOINT: {DIR: "$work/run"}
YAML
"$build/largo" train "$work/resnet_folder.yaml" 2>&1 | tee "$work/train.log"
# The log lines' windows, the first (set-up) one apart.
"$python" - "$work/train.log" <<'PY'
import re, sys

windows = [(float(m.group(1)), float(m.group(2)), float(m.group(3))) for m in (
    re.search(r" ([0-9.]+) img/s.*\(data: ([0-9.]+) img/s, waited ([0-9.]+)%", line)
    for line in open(sys.argv[1])) if m]
if not windows:
    sys.exit("run_gpu_loader_bench: no training log line with the loader's figures")
print("window  train img/s  loader img/s  GPU loop waited")
for i, (train, loader, waited) in enumerate(windows):
    print(f"{i:6} {train:12.0f} {loader:13.0f} {waited:15.0f}%{'  (set-up)' if i == 0 else ''}")
steady = windows[1:] or windows
print(f"steady windows: mean wait {sum(w[2] for w in steady) / len(steady):.1f}% "
      f"at {sum(w[0] for w in steady) / len(steady):.0f} img/s")
PY
