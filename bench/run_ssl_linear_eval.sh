#!/usr/bin/env bash
# Does self-supervised pretraining learn? SimCLR (or SwAV, Barlow Twins, MoCo, DeepCluster v2,
# DINO) pretrains a ResNet-18 briefly on Fashion-MNIST PNGs (labels unused), then a linear head
# is trained on its frozen trunk and on a randomly initialised frozen trunk, with the same data
# and schedule; both test accuracies are printed. Run from the repository root after the build
# (README); takes minutes on 2 cores. DINO's recipe run in PyTorch, with the same evaluation:
# bench/dino_linear_eval_reference.py.
#   bash bench/run_ssl_linear_eval.sh [N_TRAIN (5000)] [PRETRAIN_EPOCHS (10)] [EVAL_EPOCHS (5)]
#                                     [METHOD: simclr (default) | swav | barlow_twins |
#                                      moco | deepclusterv2 | dino]
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

# 1. Pretraining: the method's example config (configs/examples/<method>_*_folder.yaml) with
# ResNet-18, small views of the 28 x 28 images, float32 (the examples' float16 is slow on a
# CPU), no SyncBatchNorm, one SGD cosine schedule unless said otherwise.
TWO_VIEWS="{name: ImgReplicatePil, num_times: 2}, {name: RandomResizedCrop, size: 24, scale: [0.3, 1.0]}, {name: RandomHorizontalFlip}, {name: ImgPilColorDistortion, strength: 0.5}, {name: ToTensor}, $NORMALIZE"
MULTI_CROP="{name: ImgPilToMultiCrop, total_num_crops: 6, size_crops: [24, 16], num_crops: [2, 4], crop_scales: [[0.3, 1], [0.1, 0.3]]}, {name: RandomHorizontalFlip}, {name: ImgPilColorDistortion, strength: 0.5}, {name: ToTensor}, $NORMALIZE"
PROJECTION="[mlp, {dims: [512, 512], use_relu: True, skip_last_layer_relu_bn: False}], [mlp, {dims: [512, 128]}]"
STEPS_PER_EPOCH=$(( N_TRAIN / 128 ))
cosine() { echo "OPTIMIZER.param_schedulers.lr={name: cosine, start_value: $1, end_value: 0.0, update_interval: step}"; }
case "$METHOD" in
  # SimCLR: two 24 x 24 views, InfoNCE.
  simclr) EXAMPLE=simclr_resnet50_folder
    ARGS=("DATA.TRAIN.TRANSFORMS=[$TWO_VIEWS]" "MODEL.HEAD.PARAMS=[$PROJECTION]" OPTIMIZER.use_larc=False
          OPTIMIZER.weight_decay=0.0001 "$(cosine 0.3)") ;;
  # SwAV: 2 x 24 + 4 x 16 crops, 100 prototypes frozen for the first epoch, no queue.
  swav) EXAMPLE=swav_resnet50_folder
    ARGS=("DATA.TRAIN.TRANSFORMS=[$MULTI_CROP]"
          "MODEL.HEAD.PARAMS=[[swav_head, {dims: [512, 512, 128], use_bn: True, num_clusters: [100]}]]"
          "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0.prototypes0.weight', $STEPS_PER_EPOCH]]"
          OPTIMIZER.use_larc=False OPTIMIZER.weight_decay=0.0001 "$(cosine 0.3)") ;;
  # Barlow Twins: SimCLR's views, a 512 -> 512 -> 512 projection with BatchNorm, VISSL's lars
  # (its example's optimizer) from 0.2 on a cosine.
  barlow_twins) EXAMPLE=barlow_twins_resnet50_folder
    ARGS=("DATA.TRAIN.TRANSFORMS=[$TWO_VIEWS]"
          "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 512], use_relu: True, use_bn: True, use_bias: False, skip_last_layer_relu_bn: False}], [mlp, {dims: [512, 512], use_bias: False}]]"
          LOSS.barlow_twins_loss.embedding_dim=512
          "OPTIMIZER.param_schedulers.lr={name: cosine, start_value: 0.2, end_value: 0.002, update_interval: step}") ;;
  # MoCo v2: SimCLR's views, a queue of 4,096 keys (32 batches), the key encoder's momentum
  # 0.99 (0.999 moves it too little in a few hundred steps), shuffled BatchNorm as the example.
  moco) EXAMPLE=moco_resnet50_folder
    ARGS=("DATA.TRAIN.TRANSFORMS=[$TWO_VIEWS]" "MODEL.HEAD.PARAMS=[$PROJECTION]"
          LOSS.moco_loss.queue_size=4096 LOSS.moco_loss.momentum=0.99 "$(cosine 0.1)") ;;
  # DeepCluster v2: two 24 x 24 crops, three k-means of 100 prototypes over the epoch's memory
  # bank, SGD without LARC (the example's LARC ramps to 4.8, for batches of 4,096).
  deepclusterv2) EXAMPLE=deepclusterv2_resnet50_folder
    ARGS=("DATA.TRAIN.TRANSFORMS=[{name: ImgPilToMultiCrop, total_num_crops: 2, size_crops: [24], num_crops: [2], crop_scales: [[0.3, 1]]}, {name: RandomHorizontalFlip}, {name: ImgPilColorDistortion, strength: 0.5}, {name: ToTensor}, $NORMALIZE]"
          "MODEL.HEAD.PARAMS=[$PROJECTION]" LOSS.deepclusterv2_loss.num_train_samples="$N_TRAIN"
          LOSS.deepclusterv2_loss.BATCHSIZE_PER_REPLICA=128 "LOSS.deepclusterv2_loss.num_clusters=[100, 100, 100]"
          OPTIMIZER.use_larc=False OPTIMIZER.weight_decay=0.0001 "$(cosine 0.3)") ;;
  # DINO on the ResNet-18 (the DINO paper's ResNet variant; the example's ViT-S/16 is for
  # 224 px images): SwAV's crops, a dino_head of 1,024 prototypes with BatchNorm1d whose last
  # layer is frozen for the first epoch, the teacher at 0.04 throughout and its momentum from
  # 0.99, SGD from 0.3 as SimCLR's (the example's AdamW from 0.002 collapsed here, AdamW from
  # 0.0005 did not learn in 10 epochs, SGD from 0.03 not in 3: docs/self_supervised.md).
  dino) EXAMPLE=dino_deits16_folder
    ARGS=("DATA.TRAIN.TRANSFORMS=[$MULTI_CROP]"
          "MODEL.HEAD.PARAMS=[[dino_head, {in_dim: 512, num_clusters: [1024], normalize_last_layer: false, use_bn: true}]]"
          "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0.prototypes0.weight_v', $STEPS_PER_EPOCH], ['module.heads.0.prototypes0.weight_g', $STEPS_PER_EPOCH]]"
          LOSS.dino_loss.teacher_temp_min=0.04 LOSS.dino_loss.teacher_temp_max=0.04
          LOSS.dino_loss.teacher_temp_warmup_iters="$STEPS_PER_EPOCH" LOSS.dino_loss.momentum=0.99
          OPTIMIZER.name=sgd OPTIMIZER.momentum=0.9 OPTIMIZER.nesterov=False "$(cosine 0.3)"
          "OPTIMIZER.param_schedulers.weight_decay={name: constant, value: 0.0001}") ;;
  *) echo "run_ssl_linear_eval.sh: unknown method $METHOD (simclr, swav, barlow_twins, moco, deepclusterv2, dino)"; exit 2 ;;
esac
time ./build/largo train "configs/examples/$EXAMPLE.yaml" "${COMMON[@]}" \
    "DATA.TRAIN.DATA_PATHS=[$WORK/png/train]" DATA.TRAIN.BATCHSIZE_PER_REPLICA=128 \
    MODEL.AMP_PARAMS.USE_AMP=False MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False \
    OPTIMIZER.num_epochs="$PRETRAIN_EPOCHS" CHECKPOINT.DIR="$WORK/pretrain" "${ARGS[@]}" 2>&1 |
    grep -E "iter .*loss|error|checkpoint written" | tail -4

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
