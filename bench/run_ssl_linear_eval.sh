#!/usr/bin/env bash
# Does self-supervised pretraining learn? SimCLR (or SwAV, or Barlow Twins) pretrains a ResNet-18 briefly on
# Fashion-MNIST PNGs (labels unused), then a linear head is trained on its frozen trunk and on
# a randomly initialised frozen trunk, with the same data and schedule; both test accuracies
# are printed. Run from the repository root after the build (README); takes minutes on 2 cores.
#   bash bench/run_ssl_linear_eval.sh [N_TRAIN (5000)] [PRETRAIN_EPOCHS (10)] [EVAL_EPOCHS (5)]
#                                     [METHOD: simclr (default) | swav | barlow_twins]
set -euo pipefail
N_TRAIN=${1:-5000}
PRETRAIN_EPOCHS=${2:-10}
EVAL_EPOCHS=${3:-5}
METHOD=${4:-simclr}
source scripts/torch_env.sh
WORK=${LARGO_SSL_EVAL_DIR:-/tmp/largo_ssl_linear_eval}
IDX=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
rm -rf "$WORK" && mkdir -p "$WORK"
"$LARGO_PYTHON" bench/fashion_mnist_png_folder.py "$IDX" "$WORK/png" "$N_TRAIN" 2000

NORMALIZE="{name: Normalize, mean: [0.286, 0.286, 0.286], std: [0.353, 0.353, 0.353]}"
COMMON=(MACHINE.DEVICE=cpu DATA.NUM_DATALOADER_WORKERS=2 LOG_FREQUENCY=20
        MODEL.TRUNK.NAME=resnet MODEL.TRUNK.RESNETS.DEPTH=18 SEED_VALUE=0)

# 1. Pretraining. SimCLR: two 24x24 views per image. SwAV: 2 x 24 + 4 x 16 crops, 100
# prototypes frozen for the first epoch, no queue, float32 (the example's Apex O1 float16 is
# slow on a CPU). Barlow Twins: SimCLR's views, a projection of 512 -> 512 -> 512 with
# BatchNorm, VISSL's lars (its example's optimizer) from 0.2 on a cosine, float32.
if [ "$METHOD" = barlow_twins ]; then
  time ./build/largo train configs/examples/barlow_twins_resnet50_folder.yaml "${COMMON[@]}" \
      "DATA.TRAIN.DATA_PATHS=[$WORK/png/train]" DATA.TRAIN.BATCHSIZE_PER_REPLICA=128 \
      "DATA.TRAIN.TRANSFORMS=[{name: ImgReplicatePil, num_times: 2}, {name: RandomResizedCrop, size: 24, scale: [0.3, 1.0]}, {name: RandomHorizontalFlip}, {name: ImgPilColorDistortion, strength: 0.5}, {name: ToTensor}, $NORMALIZE]" \
      "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 512], use_relu: True, use_bn: True, use_bias: False, skip_last_layer_relu_bn: False}], [mlp, {dims: [512, 512], use_bias: False}]]" \
      LOSS.barlow_twins_loss.embedding_dim=512 \
      MODEL.AMP_PARAMS.USE_AMP=False MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False \
      OPTIMIZER.num_epochs="$PRETRAIN_EPOCHS" \
      "OPTIMIZER.param_schedulers.lr={name: cosine, start_value: 0.2, end_value: 0.002, update_interval: step}" \
      CHECKPOINT.DIR="$WORK/pretrain" 2>&1 | grep -E "iter .*loss|error|checkpoint written" | tail -4
elif [ "$METHOD" = swav ]; then
  time ./build/largo train configs/examples/swav_resnet50_folder.yaml "${COMMON[@]}" \
      "DATA.TRAIN.DATA_PATHS=[$WORK/png/train]" DATA.TRAIN.BATCHSIZE_PER_REPLICA=128 \
      "DATA.TRAIN.TRANSFORMS=[{name: ImgPilToMultiCrop, total_num_crops: 6, size_crops: [24, 16], num_crops: [2, 4], crop_scales: [[0.3, 1], [0.1, 0.3]]}, {name: RandomHorizontalFlip}, {name: ImgPilColorDistortion, strength: 0.5}, {name: ToTensor}, $NORMALIZE]" \
      "MODEL.HEAD.PARAMS=[[swav_head, {dims: [512, 512, 128], use_bn: True, num_clusters: [100]}]]" \
      "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0.prototypes0.weight', $(( N_TRAIN / 128 ))]]" \
      MODEL.AMP_PARAMS.USE_AMP=False MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False \
      OPTIMIZER.use_larc=False OPTIMIZER.num_epochs="$PRETRAIN_EPOCHS" OPTIMIZER.weight_decay=0.0001 \
      "OPTIMIZER.param_schedulers.lr={name: cosine, start_value: 0.3, end_value: 0.0, update_interval: step}" \
      CHECKPOINT.DIR="$WORK/pretrain" 2>&1 | grep -E "iter .*loss|error|checkpoint written" | tail -4
else
time ./build/largo train configs/examples/simclr_resnet50_folder.yaml "${COMMON[@]}" \
    "DATA.TRAIN.DATA_PATHS=[$WORK/png/train]" DATA.TRAIN.BATCHSIZE_PER_REPLICA=128 \
    "DATA.TRAIN.TRANSFORMS=[{name: ImgReplicatePil, num_times: 2}, {name: RandomResizedCrop, size: 24, scale: [0.3, 1.0]}, {name: RandomHorizontalFlip}, {name: ImgPilColorDistortion, strength: 0.5}, {name: ToTensor}, $NORMALIZE]" \
    "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 512], use_relu: True, skip_last_layer_relu_bn: False}], [mlp, {dims: [512, 128]}]]" \
    MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False OPTIMIZER.use_larc=False \
    OPTIMIZER.num_epochs="$PRETRAIN_EPOCHS" OPTIMIZER.weight_decay=0.0001 \
    "OPTIMIZER.param_schedulers.lr={name: cosine, start_value: 0.3, end_value: 0.0, update_interval: step}" \
    CHECKPOINT.DIR="$WORK/pretrain" 2>&1 | grep -E "iter .*loss|error|checkpoint written" | tail -4
fi

# 2. Linear evaluation of the frozen trunk: pretrained, then random.
linear_eval() {
  ./build/largo train configs/default_job.yaml "${COMMON[@]}" \
      DATA.TRAIN.DATA_SOURCES=[disk_folder] "DATA.TRAIN.DATA_PATHS=[$WORK/png/train]" \
      DATA.TEST.DATA_SOURCES=[disk_folder] "DATA.TEST.DATA_PATHS=[$WORK/png/test]" \
      DATA.TRAIN.LABEL_SOURCES=[disk_folder] DATA.TEST.LABEL_SOURCES=[disk_folder] \
      "DATA.TRAIN.TRANSFORMS=[{name: CenterCrop, size: 24}, {name: ToTensor}, $NORMALIZE]" \
      "DATA.TEST.TRANSFORMS=[{name: CenterCrop, size: 24}, {name: ToTensor}, $NORMALIZE]" \
      DATA.TRAIN.BATCHSIZE_PER_REPLICA=128 DATA.TEST.BATCHSIZE_PER_REPLICA=256 \
      MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True \
      "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 10]}]]" OPTIMIZER.num_epochs="$EVAL_EPOCHS" \
      "OPTIMIZER.param_schedulers.lr={name: cosine, start_value: 0.1, end_value: 0.0, update_interval: step}" \
      "$@" 2>&1 | grep -E "final test accuracy|error" | tail -2
}
echo "linear evaluation, $METHOD-pretrained trunk:"
linear_eval MODEL.WEIGHTS_INIT.PARAMS_FILE="$WORK/pretrain/checkpoint.torch" CHECKPOINT.DIR="$WORK/eval_pretrained"
echo "linear evaluation, randomly initialised trunk:"
linear_eval CHECKPOINT.DIR="$WORK/eval_random"
