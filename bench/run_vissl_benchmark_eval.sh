#!/usr/bin/env bash
# VISSL's benchmark suite as its users run it: the ImageNet linear evaluation of a RegNet
# (regnet8Gf) and of a ViT (deit_tiny), each composed on the command line from VISSL's own
# base config and model fragment, the data named by DATASET_NAMES (imagenet1k_folder) and
# found through a dataset catalog that points it at small Fashion-MNIST PNG folders (made
# here, nothing committed). The trunks are randomly initialised (VISSL's fragments name a
# pretrained file no one here has): the run shows the composed configs train their heads on
# the taps VISSL names and report top-1 on the held-out folder, not what a pretraining is worth
# (bench/run_ssl_linear_eval.sh measures that). Run from the repository root after the build.
#   bash bench/run_vissl_benchmark_eval.sh VISSL_CONFIGS [N_TRAIN (2000)] [EPOCHS (3)]
# VISSL_CONFIGS is the configs/ folder of a VISSL checkout (the one that holds config/).
#
# What is overridden, and why:
#   MACHINE.DEVICE, DISTRIBUTED.NUM_PROC_PER_NODE  one CPU process instead of 8 GPUs
#   MODEL.WEIGHTS_INIT.PARAMS_FILE                 empty: a random trunk (see above)
#   OPTIMIZER.num_epochs, the lr milestones/values EPOCHS epochs with VISSL's two first lr
#                                                  steps (its 28 epochs are for ImageNet)
#   the RegNet's TRANSFORMS                        64 px crops in place of 224 (the taps pool
#                                                  to a fixed size, so the heads are VISSL's;
#                                                  a 2-core machine runs it in minutes)
set -euo pipefail
VISSL_CONFIGS=${1:?usage: bench/run_vissl_benchmark_eval.sh VISSL_CONFIGS [N_TRAIN] [EPOCHS]}
N_TRAIN=${2:-2000}
EPOCHS=${3:-3}
source scripts/torch_env.sh
WORK=${LARGO_VISSL_EVAL_DIR:-/tmp/largo_vissl_benchmark_eval}
IDX=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
rm -rf "$WORK" && mkdir -p "$WORK"
"$LARGO_PYTHON" bench/fashion_mnist_png_folder.py "$IDX" "$WORK/png" "$N_TRAIN" 1000
# VISSL's catalog format: each split is [data path, label path]; folders carry their labels.
cat > "$WORK/dataset_catalog.json" <<EOF
{"imagenet1k_folder": {"train": ["$WORK/png/train", "<unused>"],
                       "val": ["$WORK/png/test", "<unused>"]}}
EOF
export LARGO_CONFIG_ROOT="$VISSL_CONFIGS" VISSL_DATASET_CATALOG_PATH="$WORK/dataset_catalog.json"

BENCH=benchmark/linear_image_classification/imagenet1k
NORMALIZE="{name: Normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}"
COMMON=(MACHINE.DEVICE=cpu DISTRIBUTED.NUM_PROC_PER_NODE=1 MODEL.WEIGHTS_INIT.PARAMS_FILE=
        OPTIMIZER.num_epochs="$EPOCHS" "OPTIMIZER.param_schedulers.lr.milestones=[$((EPOCHS - 1))]"
        "OPTIMIZER.param_schedulers.lr.values=[0.01, 0.001]" LOG_FREQUENCY=20)
SMALL_CROPS=("DATA.TRAIN.TRANSFORMS=[{name: RandomResizedCrop, size: 64}, {name: RandomHorizontalFlip}, {name: ToTensor}, $NORMALIZE]"
             "DATA.TEST.TRANSFORMS=[{name: Resize, size: 73}, {name: CenterCrop, size: 64}, {name: ToTensor}, $NORMALIZE]")

evaluate() {  # model fragment, then any further overrides
  local model=$1
  shift
  echo "== largo train config=$BENCH/eval_resnet_8gpu_transfer_in1k_linear +config/$BENCH/models=$model"
  ./build/largo train "config=$BENCH/eval_resnet_8gpu_transfer_in1k_linear" \
      "+config/$BENCH/models=$model" "${COMMON[@]}" CHECKPOINT.DIR="$WORK/$model" "$@" \
      > "$WORK/$model.log" 2>&1 || { tail -5 "$WORK/$model.log"; return 1; }
  grep -E "through the dataset catalog|linear evaluation with|test epoch|final test" "$WORK/$model.log" |
      sed 's/^[0-9-]* [0-9:]* info //'
}

time evaluate regnet8Gf "${SMALL_CROPS[@]}"
time evaluate deit_tiny
