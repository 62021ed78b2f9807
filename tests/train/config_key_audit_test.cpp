// The key audit that cannot rot: every key of configs/defaults.yaml is in exactly one of
//   - kWired: the config mapping reads it (checked here by planting a value of the wrong
//     type in the key and requiring the mapping to fail), and the named test shows what it
//     changes (checked to exist in tests/);
//   - unavailable_keys() (train/unavailable_keys.h): changing it from its default stops the
//     run with "... is not available in this version of Largo; set it to <default>" (checked
//     here for every key);
//   - kNoEffect: it changes nothing a run computes, by design, with the reason.
// Nothing is silently ignored. The table of every key in docs/config.md is generated from
// these lists (LARGO_UPDATE_DOCS=1 rewrites it; otherwise a stale table fails).
#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/train/trainer_config.h>
#include <largo/train/unavailable_keys.h>
#include <largo/train/worker_launch.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "test_paths.h"

namespace largo::train::config_key_audit_test {
namespace {

namespace fs = std::filesystem;

struct WiredKey {
  std::string key;
  std::string what;                // what it does, for docs/config.md
  std::string test;                // Suite.Name of a test that shows it
  std::vector<std::string> with{}; // overrides under which the mapping reads it
};

struct NoEffectKey {
  std::string key;
  std::string reason;
};

const char* kMapping = "TrainerConfigMappingTest.RunKeysReachTheTrainerOptions";
const char* kResNetKeys = "TrainerConfigMappingTest.ResNetNormGroupsAndStrideKeysChangeTheModel";
const char* kEma = "TrainerModelEmaTest.TheCheckpointedAverageIsVisslsUpdateOverTheRunsWeights";
const char* kLinearEval =
    "TrainerLinearEvalTest.TheFrozenTrunkKeepsItsWeightsWhileEachHeadTrainsAndIsScored";
const char* kPipeline = "TrainerPipelineTest.TwoStagesTrainLikeOneProcessAccumulatingTheMicroBatches";
const char* kVisslSchedules = "VisslScheduleBaselineTest.MatchesVisslsFormulas";
const char* kVisslScheduleKeys = "TrainerConfigMappingTest.VisslSchedulesAreReadFromTheConfig";
const char* kSsl = "TrainerConfigMappingTest.SelfSupervisedKeysReachTheTrainerOptions";
const char* kSslRefusals = "TrainerSelfSupervisedTest.WhatDoesNotComposeIsRefusedNamingTheKey";
const char* kVitKeys = "TrainerConfigMappingTest.VitDropPathImageSizeAndHeadMultiplierReachTheModel";

std::vector<WiredKey> wired_keys() {
  std::vector<WiredKey> keys{
      {"LOG_FREQUENCY", "iterations between console and metrics.jsonl lines", kMapping},
      {"TEST_ONLY",
       "evaluate the newest checkpoint (or WEIGHTS_INIT's weights) without training; largo eval",
       "TrainerEvaluationTest.TestOnlyEvaluatesTheNewestCheckpointAndWritesNoCheckpoint"},
      {"TEST_MODEL",
       "evaluate on DATA.TEST during training",
       "TrainerDistributedTest.RankZeroAloneWritesAndEvaluationCoversTheWholeTestSet"},
      {"TEST_EVERY_NUM_EPOCH", "evaluate after every N-th epoch", kMapping},
      {"SEED_VALUE",
       "seeds model init, data order and augmentation",
       "DataLoader.AugmentationDependsOnSeedAndEpoch"},
      {"HOOKS.CHECK_NAN",
       "a non-finite loss or gradient stops the run (or skips the step under loss scaling)",
       "TrainerTest.NonFiniteLossStopsWithoutWritingACheckpoint"},
      {"HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD",
       "write TensorBoard event files",
       "TrainerTest.RunDirectoryHoldsConfigMetricsAndPythonReadableCheckpoint"},
      {"MODEL.CUDA_CACHE.CLEAR_CUDA_CACHE",
       "empty the CUDA caching allocator's cache every CLEAR_FREQ iterations (nothing on the CPU)",
       "TrainerConfigMappingTest.CudaCacheKeysReachTheTrainerOptions"},
      {"MODEL.CUDA_CACHE.CLEAR_FREQ",
       "iterations between emptyings of the CUDA cache",
       "DeviceCacheHookTest.CudaCacheIsEmptiedBeforeEveryNthIterationOnly"},
      {"MODEL.FUSED_KERNELS",
       "Largo extension: resnet's and regnet's BatchNorm + ReLU (+ residual add) and the ViT's "
       "bias + GELU and residual add + LayerNorm through Largo's fused CUDA kernels where they "
       "apply ([performance.md](performance.md#fused-kernels)); on the CPU both ways are ATen's "
       "ops",
       "ResNetFusedNormReluTest.TrainsBitForBitLikeAtensOpsOnTheCpu"},
      {"MODEL.CHANNELS_LAST",
       "Largo extension: `auto`, True or False: convolution weights and batches in the "
       "channels-last layout ([performance.md](performance.md#channels-last)); True is refused "
       "under ZeRO, FSDP or a pipeline",
       "TrainerChannelsLastTest.TrainsLikeNchwAndWritesTheStandardLayout"},
      {"HOOKS.EMA_MODEL.SAVE_EMA_MODEL",
       "keep the weights' moving average and checkpoint it (ema_model)",
       kEma},
      {"HOOKS.EMA_MODEL.ENABLE_EMA_METERS",
       "keep the average and evaluate it beside the model (phase test_ema)",
       "TrainerModelEmaTest.MetersEvaluateTheAverageAndTrainingContinuesUntouched"},
      {"HOOKS.EMA_MODEL.UPDATE_ITER", "update the average after every N-th step", kEma},
      {"HOOKS.EMA_MODEL.WARMUP",
       "fraction of training during which the average is a copy of the model",
       kEma},
      {"HOOKS.EMA_MODEL.DECAY", "average = DECAY x average + (1 - DECAY) x weights", kEma},
      {"HOOKS.EMA_MODEL.EMA_DEVICE",
       "cpu keeps the average on the CPU, gpu beside the model",
       kMapping},
      {"DATA.NUM_DATALOADER_WORKERS",
       "loader threads per process (the batches do not depend on it, but for webdataset's streams: "
       "one per thread)",
       "DataLoader.SameBatchesForAnyNumberOfWorkers"},
      {"DATA.DDP_BUCKET_CAP_MB",
       "DDP gradient bucket size",
       "DistributedDataParallelTest.BucketsCoverEveryParameterOnce"},
      {"DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER",
       "VISSL's stateful sampler order (mid-epoch resume, at another world size too)",
       "TrainerDistributedTest.MidEpochResumeWithStatefulSamplerIsBitExact"},
      {"DATA.TRAIN.WEBDATASET.SHUFFLE_BUFFER",
       "Largo extension: samples each webdataset stream shuffles in (1: tar order)",
       "WebDatasetSampler.TheShuffleBufferIsBoundedAndOneReadsInTarOrder"},
  };
  for (const std::string split : {"TRAIN", "TEST"}) {
    const std::string p = "DATA." + split + ".";
    std::vector<WiredKey> data{
        {p + "DROP_LAST",
         "drop each rank's last short batch",
         "DataLoader.DropLastDropsOnlyTheShortBatch"},
        {p + "DATA_SOURCES",
         "torchvision_dataset, synthetic, disk_folder, disk_filelist or webdataset (Largo: tar "
         "shards)",
         "DatasetFactory.OpensEverySourceWithItsOutputShape"},
        {p + "DATASET_NAMES",
         "MNIST, FashionMNIST, CIFAR10, CIFAR100, STL10 or SVHN",
         "TrainerTest.ShortFashionMnistRunLearns"},
        {p + "DATA_PATHS",
         "the dataset's directory, image folder, .npy list of image paths or shard list",
         "TrainerTest.MissingDatasetIsAClearError"},
        {p + "LABEL_SOURCES",
         "[disk_filelist] with LABEL_PATHS (or [] with LABEL_TYPE sample_index: no labels), or [] / [disk_folder] (class folders); a source overrides LABEL_TYPE, as in VISSL",
         "DataConfig.DiskFilelistWithoutLabelSourcesNeedsSampleIndexLabels"},
        {p + "LABEL_PATHS", "the .npy of a file list's labels", "ImageFilelist.ReadsVisslsNpyPair"},
        {p + "LABEL_TYPE",
         "standard, or sample_index (labels = image indices; self-supervised training only; others "
         "refused)",
         "TrainerSelfSupervisedTest.SampleIndexLabelsTrainAsStandardOnes"},
        {p + "REMOVE_IMG_PATH_PREFIX",
         "a file list's path prefix to replace",
         "DataConfig.DiskFilelistNeedsItsLabelFile"},
        {p + "NEW_IMG_PATH_PREFIX", "what replaces it", "DataConfig.DiskFilelistNeedsItsLabelFile"},
        {p + "COPY_TO_LOCAL_DISK",
         "copy DATA_PATHS / LABEL_PATHS to COPY_DESTINATION_DIR once per machine and read the copy",
         "LocalDataCopy.FirstRankOfAMachineCopiesAndEveryRankReadsTheCopy"},
        {p + "COPY_DESTINATION_DIR",
         "the local directory of the copy (read only with COPY_TO_LOCAL_DISK True)",
         "DataConfig.CopyToLocalDiskNeedsItsDirectoryAndFiles"},
        {p + "SKIP_BAD_SAMPLES",
         "Largo extension: skip and count unreadable images instead of stopping",
         "ImageDataset.ABadFileStopsTheEpochWithItsNameOrIsSkippedAndCounted"},
        {p + "MAX_IMAGE_PIXELS",
         "Largo extension: refuse larger images (PIL's decompression-bomb limit)",
         "ImageDecoder.RefusesDecompressionBombs"},
        {p + "DCT_SCALING",
         "Largo extension: decode JPEGs at 1/2, 1/4 or 1/8 size when the crop allows",
         "ImageDecoder.RegionsEqualTheFullDecodeAtEveryScale"},
        {p + "BATCHSIZE_PER_REPLICA",
         "batch per process",
         "TrainerDistributedTest.GradientAccumulationEqualsTheLargerBatchInOneProcess"},
        {p + "TRANSFORMS",
         "the augmentation pipeline; on the in-memory datasets per batch, or per image when "
         "the list needs it (Resize, ColorJitter, several views ...)",
         "InMemoryImageDataset.EqualsTheSameImagesAsPngFilesThroughImageDataset"},
        {p + "COLLATE_FUNCTION",
         split == "TRAIN" ? "default_collate, or multicrop_collator / simclr_collator for "
                            "multi-view TRANSFORMS (Batch::views)"
                          : "default_collate only (evaluation reads one image per sample)",
         "DataConfig.CollateFunctionMustFitTheViewsTransformsMake"},
        {p + "DATA_LIMIT",
         "use a random subset of N samples",
         "SeededRandperm.MatchesPythonTorchRandperm"},
        {p + "DATA_LIMIT_SAMPLING.SEED",
         "the subset's seed",
         "SeededRandperm.MatchesPythonTorchRandperm"},
        {p + "SYNTHETIC.NUM_SAMPLES",
         "Largo extension: size of the synthetic dataset",
         "SyntheticDataset.SamplesDependOnlyOnSeedAndIndex"},
        {p + "SYNTHETIC.IMAGE_SHAPE",
         "Largo extension: [C, H, W] of synthetic images",
         "SyntheticDataset.ValuesCoverTheirRanges"},
        {p + "SYNTHETIC.NUM_CLASSES",
         "Largo extension: classes of the synthetic dataset",
         "SyntheticDataset.ValuesCoverTheirRanges"},
    };
    keys.insert(keys.end(), data.begin(), data.end());
  }
  const std::string resnet = "MODEL.TRUNK.RESNETS.";
  const std::string vit = "MODEL.TRUNK.VISION_TRANSFORMERS.";
  const std::string amp = "MODEL.AMP_PARAMS.";
  const std::string fsdp = "MODEL.FSDP_CONFIG.";
  const std::vector<std::string> with_fsdp{fsdp + "AUTO_SETUP_FSDP=True"};
  const std::string opt = "OPTIMIZER.";
  std::vector<WiredKey> model{
      {"MODEL.TRUNK.NAME",
       "resnet, resnet_sk, regnet, small_cnn, mlp or vision_transformer; under FSDP also VISSL's "
       "regnet_fsdp and vision_transformer_fsdp",
       "ModelFactory.BuildsEverySupportedTrunk"},
      {"MODEL.TRUNK.REGNET",
       "ClassyVision's RegNet parameters: name (a preset, e.g. regnet_y_400mf) or depth, w_0, "
       "w_a, w_m, group_width, ..., or name: anynet with per-stage depths, widths, "
       "group_widths, bottleneck_multipliers, strides; other entries are refused",
       "TrainerConfigMappingTest.RegNetKeysReachTheModelAndOtherEntriesAreRefused"},
      {resnet + "DEPTH", "18, 34, 50, 101, 152 or 200", "ResNet.ParameterCountsEqualTorchvision"},
      {resnet + "WIDTH_MULTIPLIER",
       "widens the stem and every stage",
       "ResNet.WidthMultiplierWidensStemAndStages"},
      {resnet + "NORM",
       "BatchNorm, GroupNorm or LayerNorm (GroupNorm with one group)",
       kResNetKeys},
      {resnet + "GROUPNORM_GROUPS", "groups of GroupNorm", kResNetKeys},
      {resnet + "GROUPS", "ResNeXt cardinality", kResNetKeys},
      {resnet + "WIDTH_PER_GROUP", "ResNeXt channels per group", kResNetKeys},
      {resnet + "ZERO_INIT_RESIDUAL",
       "zero-init each block's last norm weight",
       "ResNet.ZeroInitResidualZeroesTheLastNormOfEachBlock"},
      {resnet + "LAYER4_STRIDE", "stride of the last stage (1 or 2)", kResNetKeys},
      {resnet + "STEM",
       "Largo extension: imagenet (7x7/2 + pool) or cifar (3x3/1)",
       "ResNet.CifarStemCountDiffersOnlyByTheFirstConv"},
      {"MODEL.TRUNK.RESNETS_SK.DEPTH",
       "152, the one depth VISSL's resnet_sk builds",
       "TrainerConfigMappingTest.ResNetSkKeysReachTheModel"},
      {"MODEL.TRUNK.RESNETS_SK.WIDTH_MULTIPLIER",
       "widens the resnet_sk's stem and stages",
       "TrainerConfigMappingTest.ResNetSkKeysReachTheModel"},
      {"MODEL.TRUNK.RESNETS_SK.SK_RATIO",
       "width of the selective kernels' mixing conv (max(channels * ratio, 32)); 0: none",
       "TrainerConfigMappingTest.ResNetSkKeysReachTheModel"},
      {"MODEL.TRUNK.TRUNK_PARAMS",
       "never read by VISSL: loads where it repeats the trunk's keys in effect, else refused",
       "TrainerConfigMappingTest.TrunkParamsLoadOnlyWhereTheyRepeatTheTrunkKeys"},
      {"MODEL.TRUNK.MLP.HIDDEN_DIMS",
       "Largo extension: hidden widths of the mlp trunk",
       "Mlp.ShapesBlocksAndParameterCount"},
      {"MODEL.TRUNK.SMALL_CNN.DROPOUT",
       "Largo extension: dropout of the small CNN",
       "SmallCnn.CustomChannelsPoolingAndDropout"},
      {vit + "IMAGE_SIZE",
       "224 (VISSL's default): the data's size; any other value must equal it",
       kVitKeys},
      {vit + "PATCH_SIZE", "patch side", "Vit.ParameterCountMatchesClosedForm"},
      {vit + "NUM_LAYERS", "encoder layers", "Vit.ParameterCountMatchesClosedForm"},
      {vit + "NUM_HEADS", "attention heads", "Vit.ParameterCountMatchesClosedForm"},
      {vit + "HIDDEN_DIM", "token width", "Vit.ParameterCountMatchesClosedForm"},
      {vit + "MLP_DIM", "MLP width", "Vit.ParameterCountMatchesClosedForm"},
      {vit + "DROPOUT_RATE",
       "dropout on embeddings, attention output and MLP",
       "Vit.DropoutAndDropPathOnlyInTraining"},
      {vit + "ATTENTION_DROPOUT_RATE",
       "dropout on the attention weights",
       "Vit.DropoutAndDropPathOnlyInTraining"},
      {vit + "CLASSIFIER",
       "token (class token) or gap (mean of the tokens)",
       "Vit.GapClassifierHasNoClassToken"},
      {vit + "USE_CLASS_TOKEN",
       "VISSL's switch (default True; VISSL ignores CLASSIFIER): False drops the class token, as "
       "CLASSIFIER gap",
       "TrainerConfigMappingTest.VitUseClassTokenFalseOrGapDropsTheClassToken"},
      {vit + "DROP_PATH_RATE",
       "stochastic depth, rising linearly to this rate in the last layer",
       kVitKeys},
      {vit + "QKV_BIAS", "biases in the qkv projection", "Vit.ParameterCountMatchesClosedForm"},
      {"MODEL.HEAD.PARAMS",
       "the head: one mlp or eval_mlp (or one head per feature under linear evaluation; "
       "none when largo extract writes the tapped trunk features); a swav_head in a SwAV "
       "run; mlp heads run one after another (SimCLR's projection, or a classifier's layers), "
       "the first of them a swav_head without prototypes in VISSL's SwAV fine-tuning configs; "
       "under FSDP also VISSL's swav_head_fsdp, mlp_fsdp and eval_mlp_fsdp",
       "TrainerConfigMappingTest.SwavHeadWithoutPrototypesIsTheProjectionBeforeAClassifier"},
      {"MODEL.HEAD.BATCHNORM_EPS",
       "eps of the heads' BatchNorm",
       "Heads.MlpHeadWithBnReluSkipsThemAfterTheLastLayer"},
      {"MODEL.HEAD.BATCHNORM_MOMENTUM",
       "momentum of the heads' BatchNorm",
       "Heads.MlpHeadWithBnReluSkipsThemAfterTheLastLayer"},
      {"MODEL.HEAD.PARAMS_MULTIPLIER",
       "scales the head's initial Linear weights and biases",
       kVitKeys},
      {amp + "USE_AMP",
       "mixed precision on",
       "MixedPrecisionTrainingTest.AmpSettingsAreReadAndCheckedFromTheConfig"},
      {amp + "AMP_ARGS.opt_level", "Apex O0-O3", "PrecisionPolicy.ApexOptLevelsFollowApexTable"},
      {amp + "AMP_TYPE",
       "apex or pytorch",
       "MixedPrecisionTrainingTest.AmpSettingsAreReadAndCheckedFromTheConfig"},
      {amp + "DTYPE",
       "Largo extension: float16 or bfloat16",
       "MixedPrecisionTrainingTest.Bfloat16EndsWithinHalfAPointOfFloat32OnFashionMnist"},
      {amp + "GRAD_SCALER.INIT_SCALE",
       "Largo extension: initial loss scale",
       "GradScalerBaseline.UpdateSequencesMatchPyTorchGradScaler"},
      {amp + "GRAD_SCALER.GROWTH_FACTOR",
       "Largo extension: scale growth",
       "GradScalerBaseline.UpdateSequencesMatchPyTorchGradScaler"},
      {amp + "GRAD_SCALER.BACKOFF_FACTOR",
       "Largo extension: scale back-off",
       "GradScalerBaseline.UpdateSequencesMatchPyTorchGradScaler"},
      {amp + "GRAD_SCALER.GROWTH_INTERVAL",
       "Largo extension: clean steps before growing",
       "GradScaler.GrowsAfterGrowthIntervalCleanSteps"},
      {amp + "GRAD_SCALER.HYSTERESIS",
       "Largo extension: overflows tolerated before backing off",
       "GradScalerBaseline.HysteresisAndMinimumScaleFollowDeepSpeedsRule"},
      {amp + "GRAD_SCALER.MIN_LOSS_SCALE",
       "Largo extension: the lowest scale",
       "MixedPrecisionTrainingTest.LossScaleAtItsMinimumStopsTheRun"},
      {"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING",
       "recompute trunk segments in the backward",
       "TrainerTest.ActivationCheckpointingLeavesTheLossesUnchanged"},
      {"MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS",
       "trunk segments",
       "TrainerTest.MoreCheckpointingSplitsThanTrunkBlocksIsAConfigError"},
      {"MODEL.SHARDED_DDP_SETUP.USE_SDP",
       "ZeRO stage 2",
       "TrainerZeroTest.StagesOneAndTwoTrainLikeDdp"},
      {"MODEL.SHARDED_DDP_SETUP.reduce_buffer_size",
       "ZeRO stage 2 reduce bucket (elements)",
       "TrainerZeroTest.StagesOneAndTwoTrainLikeDdp"},
      {fsdp + "AUTO_SETUP_FSDP", "ZeRO stage 3", "TrainerFsdpTest.TrainsLikeDdp"},
      {fsdp + "AUTO_WRAP_THRESHOLD",
       "parameters that make a block its own unit",
       "TrainerFsdpConfigTest.TheSeedsKeysConfigureIt",
       with_fsdp},
      {fsdp + "AMP_TYPE",
       "O1 (float32 compute) or O2 (compute copies)",
       "TrainerFsdpTest.ComputeCopiesComputeLikeApexO2",
       with_fsdp},
      {fsdp + "compute_dtype",
       "float32, or float16/bfloat16 compute copies",
       "TrainerFsdpTest.ComputeCopiesComputeLikeApexO2",
       with_fsdp},
      {fsdp + "fp32_reduce_scatter",
       "reduce-scatter gradients in float32",
       "FullyShardedDataParallelTest.Fp32ReduceScatterSumsTheBFloat16GradientsInFloat32",
       with_fsdp},
      {fsdp + "reshard_after_forward",
       "free gathered parameters after each unit's forward",
       "FullyShardedDataParallelTest.KeepingParametersAfterForwardEqualsDdp",
       with_fsdp},
      {fsdp + "prefetch",
       "Largo extension: prefetch the next unit's all-gather",
       "FullyShardedDataParallelTest.WithoutPrefetchEqualsDdp",
       with_fsdp},
      {fsdp + "offload_optimizer",
       "Largo extension: the optimizer state in host memory, stepped there "
       "([offload.md](offload.md))",
       "TrainerOffloadTest.TrainsBitForBitLikeTheRunWithoutOffload"},
      {"MODEL.GRAD_CLIP.USE_GRAD_CLIP",
       "global gradient-norm clipping",
       "TrainerTest.LarcLambWithClippingResumeIsBitExact"},
      {"MODEL.GRAD_CLIP.NORM_TYPE", "the norm's p", "GradClipping.MatchesTorchClipGradNorm"},
      {"MODEL.GRAD_CLIP.MAX_NORM", "the largest norm", "GradClipping.MatchesTorchClipGradNorm"},
      {"LOSS.name",
       "CrossEntropyLoss or cross_entropy_multiple_output_single_target; swav_loss, "
       "simclr_info_nce_loss, barlow_twins_loss, moco_loss, dino_loss or deepclusterv2_loss "
       "([self_supervised.md](self_supervised.md))",
       "ClassificationLossTest.EqualsVisslsLossAndGradientInFloat64"},
      {"LOSS.CrossEntropyLoss.ignore_index",
       "target value that does not count",
       "ClassificationLossTest.SumReductionAddsTheCountedSamples"},
      {"LOSS.cross_entropy_multiple_output_single_target.ignore_index",
       "target value that does not count",
       "ClassificationLossTest.SumReductionAddsTheCountedSamples",
       {"LOSS.name=cross_entropy_multiple_output_single_target"}},
      {"LOSS.cross_entropy_multiple_output_single_target.temperature",
       "logits divided by it",
       "TrainerModelSetupTest.LossTemperatureReachesTheTrainingStep",
       {"LOSS.name=cross_entropy_multiple_output_single_target"}},
      {"LOSS.cross_entropy_multiple_output_single_target.normalize_output",
       "L2-normalize the logits first",
       "ClassificationLossTest.EqualsVisslsLossAndGradientInFloat64",
       {"LOSS.name=cross_entropy_multiple_output_single_target"}},
      {"LOSS.cross_entropy_multiple_output_single_target.weight",
       "per-class weights (null: all 1)",
       "ClassificationLossTest.EqualsVisslsLossAndGradientInFloat64",
       {"LOSS.name=cross_entropy_multiple_output_single_target"}},
      {"MODEL.TEMP_FROZEN_PARAMS_ITER_MAP",
       "[[parameter, iteration]]: a self-supervised run leaves these parameters untrained until "
       "the iteration (VISSL's module.heads.<i>. names read as head.<i>.)",
       "TrainerSelfSupervisedTest.FrozenPrototypesDoNotMoveUntilTheirIteration"},
      {"LOSS.simclr_info_nce_loss.temperature",
       "SimCLR's softmax temperature",
       kSsl,
       {"LOSS.name=simclr_info_nce_loss"}},
      {"LOSS.simclr_info_nce_loss.buffer_params.embedding_dim",
       "must equal the projection head's output width",
       kSslRefusals,
       {"LOSS.name=simclr_info_nce_loss"}},
      {"LOSS.simclr_info_nce_loss.buffer_params.world_size",
       "inferred (the world size), as VISSL infers it: refused unless at VISSL's default",
       kSslRefusals,
       {"LOSS.name=simclr_info_nce_loss"}},
      {"LOSS.simclr_info_nce_loss.buffer_params.effective_batch_size",
       "inferred, as VISSL infers it: refused unless at VISSL's default",
       kSslRefusals,
       {"LOSS.name=simclr_info_nce_loss"}},
      {"LOSS.barlow_twins_loss.lambda_",
       "Barlow Twins' weight of the off-diagonal terms",
       kSsl,
       {"LOSS.name=barlow_twins_loss"}},
      {"LOSS.barlow_twins_loss.scale_loss",
       "Barlow Twins' factor on the whole loss",
       kSsl,
       {"LOSS.name=barlow_twins_loss"}},
      {"LOSS.barlow_twins_loss.embedding_dim",
       "must equal the projection head's output width",
       kSslRefusals,
       {"LOSS.name=barlow_twins_loss"}},
      {"LOSS.moco_loss.embedding_dim",
       "must equal the projection head's output width",
       kSslRefusals,
       {"LOSS.name=moco_loss"}},
      {"LOSS.moco_loss.queue_size",
       "keys kept as negatives (a multiple of the keys each step writes)",
       "TrainerSelfSupervisedTest.MocoResumesMidEpochBitExactly",
       {"LOSS.name=moco_loss"}},
      {"LOSS.moco_loss.momentum",
       "the momentum encoder's EMA factor, applied before every training forward",
       "MocoModel.TrainsLikeVisslOnOneProcess",
       {"LOSS.name=moco_loss"}},
      {"LOSS.moco_loss.temperature",
       "MoCo's logits divided by it",
       "MocoLoss.MatchesVissl",
       {"LOSS.name=moco_loss"}},
      {"LOSS.moco_loss.shuffle_batch",
       "the momentum encoder's batch shuffled across the ranks (refused with SyncBatchNorm, "
       "where VISSL does not shuffle)",
       "MocoModel.TwoRanksWithShuffledKeysTrainLikeVissl",
       {"LOSS.name=moco_loss"}},
      {"LOSS.dino_loss.momentum",
       "DINO's teacher EMA factor at iteration 0, rising to 1 on a cosine over the run; the "
       "teacher moves after each optimizer step",
       "DinoModel.TheLossIsDinoLossOnTheSplitOutputAndTheTeacherFollowsAfterTheStep",
       {"LOSS.name=dino_loss"}},
      {"LOSS.dino_loss.student_temp",
       "the student's softmax temperature",
       "TrainerConfigMappingTest.DinoKeysReachTheTrainerOptions",
       {"LOSS.name=dino_loss"}},
      {"LOSS.dino_loss.teacher_temp_min",
       "the teacher temperature at iteration 0",
       "TrainerConfigMappingTest.DinoKeysReachTheTrainerOptions",
       {"LOSS.name=dino_loss"}},
      {"LOSS.dino_loss.teacher_temp_max",
       "the teacher temperature after the warm-up",
       "TrainerConfigMappingTest.DinoKeysReachTheTrainerOptions",
       {"LOSS.name=dino_loss"}},
      {"LOSS.dino_loss.teacher_temp_warmup_iters",
       "iterations of the teacher temperature's linear rise",
       "TrainerSelfSupervisedTest.DinoOnMlpAtTwoRanksEqualsOneProcessOverFourSteps",
       {"LOSS.name=dino_loss"}},
      {"LOSS.dino_loss.crops_for_teacher",
       "the crops the teacher sees (the global ones, of one size)",
       "TrainerSelfSupervisedTest.WhatDoesNotComposeIsRefusedNamingTheKey",
       {"LOSS.name=dino_loss"}},
      {"LOSS.dino_loss.ema_center",
       "the center's EMA factor",
       "TrainerConfigMappingTest.DinoKeysReachTheTrainerOptions",
       {"LOSS.name=dino_loss"}},
      {"LOSS.dino_loss.output_dim",
       "inferred (the dino_head's num_clusters), as VISSL infers it: refused unless at VISSL's "
       "default",
       kSslRefusals,
       {"LOSS.name=dino_loss"}},
      {"LOSS.deepclusterv2_loss.temperature",
       "the scores of the normalised embeddings against the centroids are divided by it",
       "TrainerConfigMappingTest.DeepClusterV2KeysReachTheTrainerOptions",
       {"LOSS.name=deepclusterv2_loss"}},
      {"LOSS.deepclusterv2_loss.num_clusters",
       "one k-means head per entry, its clusters; the loss averaged over the heads",
       "TrainerSelfSupervisedTest.DeepClusterV2ResumesMidEpochAndAtAnEpochsEndBitExactly",
       {"LOSS.name=deepclusterv2_loss"}},
      {"LOSS.deepclusterv2_loss.kmeans_iters",
       "k-means iterations at each epoch's start",
       "TrainerConfigMappingTest.DeepClusterV2KeysReachTheTrainerOptions",
       {"LOSS.name=deepclusterv2_loss"}},
      {"LOSS.deepclusterv2_loss.memory_params.crops_for_mb",
       "the crops whose embeddings each rank's memory keeps (head h clusters crop h modulo their "
       "number)",
       "TrainerSelfSupervisedTest.DeepClusterV2ResumesMidEpochAndAtAnEpochsEndBitExactly",
       {"LOSS.name=deepclusterv2_loss"}},
      {"LOSS.deepclusterv2_loss.memory_params.embedding_dim",
       "the memory's width: must equal the projection head's output width",
       kSslRefusals,
       {"LOSS.name=deepclusterv2_loss"}},
      {"LOSS.swav_loss.temperature",
       "temperature of the predicting softmax",
       kSsl,
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.epsilon",
       "Sinkhorn's entropic regularisation",
       kSsl,
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.num_iters", "Sinkhorn iterations", kSsl, {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.crops_for_assign",
       "the crops whose assignments the others predict",
       kSsl,
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.use_double_precision", "Sinkhorn in float64", kSsl, {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.normalize_last_layer",
       "prototypes normalised after every optimizer step",
       kSsl,
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.temp_hard_assignment_iters",
       "hard (one-hot) assignments for the first N loss calls",
       kSsl,
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.queue.queue_length",
       "images kept in the queue over all ranks (0: none), rounded down to a multiple of the "
       "global batch",
       "TrainerSelfSupervisedTest.SwavWithQueueResumesMidEpochBitExactly",
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.queue.start_iter",
       "the first loss call that uses the queue",
       "TrainerSelfSupervisedTest.SwavWithQueueResumesMidEpochBitExactly",
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.embedding_dim",
       "inferred from the swav_head, as VISSL infers it: refused unless at VISSL's default",
       kSslRefusals,
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.num_crops",
       "inferred from the TRANSFORMS, as VISSL infers it: refused unless at VISSL's default "
       "or the TRANSFORMS' total_num_crops",
       kSslRefusals,
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.num_prototypes",
       "inferred from the swav_head, as VISSL infers it: refused unless at VISSL's default "
       "or the head's num_clusters",
       kSslRefusals,
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.output_dir",
       "VISSL's NaN debugging dump (inferred: CHECKPOINT.DIR): refused unless at VISSL's default",
       kSslRefusals,
       {"LOSS.name=swav_loss"}},
      {"LOSS.swav_loss.queue.local_queue_length",
       "inferred (queue_length / world size), as VISSL infers it: refused unless at VISSL's "
       "default",
       kSslRefusals,
       {"LOSS.name=swav_loss"}},
      {"MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON",
       "evaluation mode: the head is not loaded from WEIGHTS_INIT; with a freeze switch, a linear "
       "evaluation",
       kLinearEval},
      {"MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY",
       "train heads on the frozen trunk (no gradients, BatchNorm statistics kept)",
       kLinearEval},
      {"MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_AND_HEAD",
       "freeze the heads too: for TEST_ONLY runs",
       kLinearEval},
      {"MODEL.FEATURE_EVAL_SETTINGS.EVAL_TRUNK_AND_HEAD",
       "load the head from WEIGHTS_INIT too",
       "WeightsInitTest.PrefixesSkippedLayersAndFrozenHeads"},
      {"MODEL.FEATURE_EVAL_SETTINGS.ASSERT_HEAD_LAYER_SHAPE_INIT",
       "a head of another shape in WEIGHTS_INIT's file is an error (else it keeps its init)",
       "WeightsInitTest.AHeadOfAnotherShapeKeepsItsInitUnlessShapesAreAsserted"},
      {"MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY",
       "largo extract writes the trunk's (tapped) features instead of the heads' outputs; refused "
       "by largo train",
       "FeatureExtractionTest.WritesEachSamplesTrunkFeaturesOrHeadOutputsOnce"},
      {"MODEL.FEATURE_EVAL_SETTINGS.SHOULD_FLATTEN_FEATS",
       "flatten each tapped feature after its pooling",
       "LinearEvalTest.FeaturesAreTheTrunksStagesPooled"},
      {"MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP",
       "ResNet, RegNet and ViT features to tap and their pooling, one head each",
       kLinearEval},
      {"MODEL.WEIGHTS_INIT.PARAMS_FILE",
       "initial weights from a file on a fresh start",
       "TrainerModelSetupTest.WeightsInitStartsAFreshRunFromTheFileAndIsNotReadOnResume"},
      {"MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME",
       "the key holding the state dict",
       "WeightsInitTest.TorchvisionStateDictAndVisslCheckpointGiveTorchvisionsLogits"},
      {"MODEL.WEIGHTS_INIT.SKIP_LAYERS",
       "name substrings not loaded",
       "WeightsInitTest.PrefixesSkippedLayersAndFrozenHeads"},
      {"MODEL.WEIGHTS_INIT.REMOVE_PREFIX",
       "prefix removed from the file's names",
       "WeightsInitTest.PrefixesSkippedLayersAndFrozenHeads"},
      {"MODEL.WEIGHTS_INIT.APPEND_PREFIX",
       "prefix added to the file's names",
       "WeightsInitTest.PrefixesSkippedLayersAndFrozenHeads"},
      {"MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN",
       "BatchNorm2d and BatchNorm1d statistics over the ranks",
       "TrainerModelSetupTest.SyncBatchNormSharesTheStatisticsOfTheRanks"},
      {"MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE",
       "pytorch or apex (the same statistics)",
       "SyncBatchNormTest.TwoRanksTrainLikeOneProcessWithBatchNormOnTheGlobalBatch"},
      {"MODEL.SYNC_BN_CONFIG.GROUP_SIZE",
       "-1 a machine's ranks, 0 all, N consecutive ranks",
       "SyncBatchNormTest.GroupsOfConsecutiveRanksSynchronizeWithinTheGroup"},
      {opt + "name",
       "sgd, adam, adamw, rmsprop, lamb, lars or zero; VISSL's sgd_fsdp is sgd",
       "OptimizerFactory.BuildsEveryOptimizerAndWrapsLarc"},
      {opt + "use_zero", "ZeRO stage 1", "TrainerZeroTest.StagesOneAndTwoTrainLikeDdp"},
      {opt + "base_optimizer",
       "the optimizer ZeRO shards",
       "TrainerZeroConfigTest.TheSeedsYamlRunsVerbatim",
       {opt + "use_zero=True"}},
      {opt + "offload_optimizer",
       "Largo extension: with ZeRO-1/2, the optimizer state in host memory, stepped there "
       "([offload.md](offload.md))",
       "TrainerOffloadTest.TrainsBitForBitLikeTheRunWithoutOffload"},
      {opt + "use_larc", "LARC around the optimizer", "OptimizerState.LarcSgdResumeIsBitExact"},
      {opt + "larc_config.clip", "LARC clipping mode", "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "larc_config.eps", "LARC eps", "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "larc_config.trust_coefficient",
       "LARC trust coefficient",
       "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "larc_config.exclude_bias_and_norm",
       "Largo extension: no LARC adaptation for biases and norms",
       "ParamGroups.BiasAndNormNamesForLarc"},
      {opt + "weight_decay", "weight decay", "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "momentum",
       "sgd's, rmsprop's and lars's momentum (refused for the others unless 0.9)",
       "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "nesterov",
       "sgd's Nesterov momentum (refused for the others)",
       "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "dampening",
       "sgd's dampening (refused for the others)",
       "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "num_epochs", "training length", "LrSchedule.ClosedForms"},
      {opt + "betas",
       "Adam / AdamW / LAMB betas (refused for the others)",
       "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "eps",
       "Adam / AdamW / RMSprop / LAMB eps (refused for the others)",
       "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "amsgrad",
       "Adam / AdamW amsgrad (refused for the others)",
       "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "alpha",
       "rmsprop's smoothing constant (VISSL passes it to rmsprop; refused for other "
       "optimizers)",
       "OptimizerBaselineTest.MatchesPyTorch",
       {opt + "name=rmsprop"}},
      {opt + "centered",
       "rmsprop divides by the gradients' estimated deviation (VISSL passes it to rmsprop; "
       "refused for other optimizers)",
       "OptimizerBaselineTest.MatchesPyTorch",
       {opt + "name=rmsprop"}},
      {opt + "eta",
       "lars's trust coefficient (VISSL passes it to lars; refused for other optimizers)",
       "OptimizerBaselineTest.MatchesPyTorch"},
      {opt + "exclude_bias_and_norm",
       "lars leaves the 1-D parameters out of its trust ratio (VISSL passes it to lars; "
       "refused for other optimizers)",
       "ParamGroups.OneDimensionalNamesForLars"},
      {opt + "regularize_bn",
       "weight decay on norm parameters",
       "ParamGroups.RegularizeFlagsAndNameSubstrings"},
      {opt + "regularize_bias",
       "weight decay on biases",
       "ParamGroups.RegularizeFlagsAndNameSubstrings"},
      {opt + "non_regularized_parameters",
       "name substrings without weight decay",
       "ParamGroups.RegularizeFlagsAndNameSubstrings"},
      {opt + "head_optimizer_params.use_different_lr",
       "the head follows param_schedulers.lr_head",
       "ParamGroups.HeadWeightDecayAndEmptyGroupsDropped"},
      {opt + "head_optimizer_params.use_different_wd",
       "the head's own weight decay",
       "ParamGroups.HeadWeightDecayAndEmptyGroupsDropped"},
      {opt + "head_optimizer_params.weight_decay",
       "the head's weight decay",
       "ParamGroups.HeadWeightDecayAndEmptyGroupsDropped"},
  };
  keys.insert(keys.end(), model.begin(), model.end());
  for (const std::string schedule : {"lr", "lr_head"}) {
    const std::string p = opt + "param_schedulers." + schedule + ".";
    std::vector<WiredKey> s{
        {p + "auto_lr_scaling.auto_scale", "scale the values to the global batch", "AutoLrScaling.SimpleSchedules"},
        {p + "auto_lr_scaling.base_value", "the value for base_lr_batch_size", "AutoLrScaling.SimpleSchedules"},
        {p + "auto_lr_scaling.base_lr_batch_size", "the batch base_value is for", "AutoLrScaling.SimpleSchedules"},
        {p + "auto_lr_scaling.scaling_type", "linear or sqrt", "AutoLrScaling.SimpleSchedules"},
        {p + "name", "the schedule", "ScheduleBaselineTest.MatchesTorchLrScheduler"},
        {p + "update_interval", "epoch or step", "LrSchedule.ClosedForms"},
        {p + "values", "step / multistep values", "LrSchedule.StepAndMultistepBoundaries"},
        {p + "milestones", "multistep epochs", "LrSchedule.StepAndMultistepBoundaries"},
        {p + "start_value", "cosine / linear start", "LrSchedule.ClosedForms"},
        {p + "end_value", "cosine / linear end", "LrSchedule.ClosedForms"},
        {p + "value", "constant value", "LrSchedule.ClosedForms"},
        {p + "schedulers", "composite: the sub-schedules", "LrSchedule.CompositeRescaledAndFixed"},
        {p + "lengths", "composite: their fractions", "LrSchedule.CompositeRescaledAndFixed"},
        {p + "interval_scaling", "composite: rescaled or fixed", "LrSchedule.CompositeRescaledAndFixed"},
        {p + "base_value", "polynomial / step_with_fixed_gamma: the first value", kVisslSchedules},
        {p + "power", "polynomial: the exponent of (1 - progress)", kVisslSchedules},
        {p + "num_decays", "step_with_fixed_gamma: how many times the value is multiplied by gamma", kVisslSchedules},
        {p + "gamma", "step_with_fixed_gamma: the factor of each decay", kVisslSchedules},
        {p + "num_epochs", "step_with_fixed_gamma: must equal OPTIMIZER.num_epochs if given (ClassyVision only checks it)", kVisslScheduleKeys},
        {p + "restart_interval_length", "cosine_warm_restart: the fraction of training between restarts", kVisslSchedules},
        {p + "wave_type", "cosine_warm_restart: half (a cosine per interval) or full (a wave of twice its period)", kVisslSchedules},
        {p + "lr_multiplier", "cosine_warm_restart: each restart's peak is the previous one's times this", kVisslSchedules},
        {p + "is_adaptive", "cosine_warm_restart: restart at the value of the single cosine instead", kVisslSchedules},
        {p + "warmup_interval_length", "inverse_sqrt: the progress at which the value is start_value", kVisslSchedules},
    };
    keys.insert(keys.end(), s.begin(), s.end());
  }
  const std::string weight_decay_run = "OptimizerScheduleRunTest.TheScheduleSetsTheWeightDecayOfEachEpoch";
  keys.push_back({opt + "param_schedulers.weight_decay", "a schedule of the decayed groups' weight decay (any lr schedule but auto_lr_scaling)", weight_decay_run});
  keys.push_back({opt + "param_schedulers.weight_decay_head", "a schedule of the head's decayed group's weight decay", weight_decay_run});
  keys.push_back({opt + "construct_single_param_group_only", "one group of every parameter, all decayed (VISSL's FSDP setting)", "OptimizerScheduleRunTest.TheSingleGroupDecaysEveryParameter"});
  std::vector<WiredKey> rest{
      {"METERS.accuracy_list_meter.topk_values", "top-k accuracies reported", kMapping},
      {"DATA.TRAIN.COLLATE_FUNCTION_PARAMS",
       "{create_multidimensional_tensor: True} with multicrop_collator: the crops padded to the "
       "largest and run through a resnet or regnet trunk in one pass, each pooled over its "
       "unpadded part",
       "TrainerSelfSupervisedTest.PaddedCropsOnResNetAtTwoRanksEqualOneProcess"},
      {"TRAINER.TASK_NAME",
       "VISSL's data-parallel engine: self_supervision_task (DDP; ZeRO-1 with OPTIMIZER.use_zero), "
       "self_supervision_sdp_task (ZeRO-2, beside OPTIMIZER.use_zero), self_supervision_fsdp_task "
       "(FSDP, as MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP); any other task is refused",
       "TrainerConfigMappingTest.VisslTaskNamesChooseTheDataParallelEngine"},
      {"TRAINER.GRADIENT_ACCUMULATION_STEPS",
       "Largo extension: micro-batches per step",
       "TrainerDistributedTest.GradientAccumulationEqualsTheLargerBatchInOneProcess"},
      {"MACHINE.DEVICE", "gpu (falls back to cpu) or cpu", kMapping},
      {"MACHINE.NUM_THREADS", "Largo extension: intra-op threads", kMapping},
      {"MACHINE.ALLOW_TF32_MATMUL",
       "Largo extension: TF32 matmuls (Ampere+)",
       "TrainerKernelSwitchesTest.TheRunSetsTf32AndTheAttentionBackend"},
      {"MACHINE.ALLOW_TF32_CUDNN",
       "Largo extension: TF32 convolutions (Ampere+)",
       "TrainerKernelSwitchesTest.TheRunSetsTf32AndTheAttentionBackend"},
      {"MACHINE.ATTENTION_BACKEND",
       "Largo extension: the attention kernel CUDA attention tries first (auto, flash, "
       "efficient, cudnn, math; [performance.md](performance.md#attention-backend))",
       "TrainerKernelSwitchesTest.TheRunSetsTf32AndTheAttentionBackend"},
      {"MACHINE.CUDA_GRAPH",
       "Largo extension: the whole step captured once as a CUDA graph and replayed "
       "([performance.md](performance.md#the-step-as-one-cuda-graph)); refused at start, naming "
       "what stands in its way, unless the run is one process on a GPU without a host read in the "
       "step, with SGD and DATA.TRAIN.DROP_LAST True",
       "TrainerCudaGraphTest.IsRefusedNamingWhatStandsInItsWay"},
      {"MACHINE.SYNC_EVERY_STEP",
       "Largo extension: `auto`, True or False: read the loss and the inf/NaN check to the host "
       "every step, or only when logging, saving and at an epoch's end "
       "([performance.md](performance.md#no-host-sync-in-the-step)); auto is off on a GPU without "
       "loss scaling; False with loss scaling is refused",
       "TrainerSyncEveryStepTest.TrainsBitForBitLikeTheRunThatSyncsEveryStep"},
      {"DISTRIBUTED.BACKEND", "gloo or nccl", "ProcessGroupFailureTest.RejectsUnknownBackend"},
      {"DISTRIBUTED.NUM_NODES", "machines", "WorkerLaunchTest.RunIdHostAndPortIsTheMaster"},
      {"DISTRIBUTED.NUM_PROC_PER_NODE",
       "processes per machine",
       "WorkerLaunchTest.TwoProcessesPerNodeSpawnWithAFreeLocalPort"},
      {"DISTRIBUTED.INIT_METHOD",
       "tcp or env",
       "WorkerLaunchTest.EnvInitMethodReadsMasterAddrAndPort",
       {"DISTRIBUTED.NUM_PROC_PER_NODE=2"}},
      {"DISTRIBUTED.RUN_ID",
       "auto or host:port",
       "WorkerLaunchTest.RunIdHostAndPortIsTheMaster",
       {"DISTRIBUTED.NUM_PROC_PER_NODE=2"}},
      {"DISTRIBUTED.BROADCAST_BUFFERS",
       "DDP broadcasts rank 0's buffers before each forward (a pipeline: replica 0's after each "
       "step)",
       "DistributedDataParallelTest.BroadcastsBuffersFromRankZeroBeforeEachForward"},
      {"DISTRIBUTED.MANUAL_GRADIENT_REDUCTION",
       "DDP reduces after backward (DDP only)",
       "DistributedDataParallelTest.DelayAllreduceAndManualReductionEqualTheOverlappedPath"},
      {"DISTRIBUTED.FIND_UNUSED_PARAMETERS",
       "Largo extension: unused parameters count as zero",
       "DistributedDataParallelTest.UnusedParametersAreNamedOrHandled"},
      {"DISTRIBUTED.DELAY_ALLREDUCE",
       "Largo extension: all buckets after backward",
       "DistributedDataParallelTest.DelayAllreduceAndManualReductionEqualTheOverlappedPath"},
      {"DISTRIBUTED.RENDEZVOUS_TIMEOUT_SECONDS",
       "Largo extension: rendezvous timeout",
       "ProcessGroupFailureTest.UnreachableMasterIsNamed"},
      {"DISTRIBUTED.COLLECTIVE_TIMEOUT_SECONDS",
       "Largo extension: collective timeout",
       "ProcessGroupFailureTest.StalledPeerTimesOutWithAClearError"},
      {"DISTRIBUTED.PIPELINE_SIZE",
       "Largo extension: pipeline ranks; the world is PIPELINE_SIZE x data-parallel replicas",
       kPipeline},
      {"DISTRIBUTED.TENSOR_PARALLEL_SIZE",
       "Largo extension (VISSL has none): tensor-parallel shards per data-parallel replica; the "
       "world is PIPELINE_SIZE x replicas x TENSOR_PARALLEL_SIZE",
       "TrainerTensorParallelTest.TwoShardsTrainLikeOneProcess"},
      {"DISTRIBUTED.SEQUENCE_PARALLEL",
       "Largo extension: the tensor-parallel ViT layers split by tokens too (sequence "
       "parallelism); needs TENSOR_PARALLEL_SIZE > 1",
       "TrainerTensorParallelTest.SequenceParallelTrainsLikeOneProcess"},
      {"MODEL.PIPELINE.SCHEDULE",
       "Largo extension: gpipe, 1f1b, interleaved_1f1b or zb_h1",
       kPipeline},
      {"MODEL.PIPELINE.NUM_MICROBATCHES",
       "Largo extension: micro-batches each step's batch is split into",
       kPipeline},
      {"MODEL.PIPELINE.VIRTUAL_STAGES",
       "Largo extension: stages per pipeline rank (interleaved_1f1b)",
       kPipeline},
      {"MODEL.PIPELINE.BOUNDARIES",
       "Largo extension: the block indices where stages start ([] = balanced)",
       kPipeline},
      {"MODEL.PIPELINE.BALANCE",
       "Largo extension: balance the stages by parameters, measured time or blocks",
       kPipeline},
      {"MODEL.PIPELINE.CHECKPOINT_STAGES",
       "Largo extension: recompute each stage's forward in its backward",
       kPipeline},
      {"CHECKPOINT.DIR", "output folder", kMapping},
      {"CHECKPOINT.AUTO_RESUME",
       "resume from the newest checkpoint",
       "TrainerTest.ResumeIsBitExact"},
      {"CHECKPOINT.CHECKPOINT_FREQUENCY", "save every N-th epoch", kMapping},
      {"CHECKPOINT.CHECKPOINT_ITER_FREQUENCY",
       "also save every N iterations",
       "TrainerTest.ResumeIsBitExact"},
      {"CHECKPOINT.OVERWRITE_EXISTING", "train again over a finished run", kMapping},
  };
  keys.insert(keys.end(), rest.begin(), rest.end());
  return keys;
}

std::vector<NoEffectKey> no_effect_keys() {
  const char* logging = "logging only: Largo does not write this output; training is the same";
  std::vector<NoEffectKey> keys{
      {"VERBOSE", "console verbosity (debug lines); read by the largo program"},
      {"LOSS.deepclusterv2_loss.DROP_LAST", "VISSL overwrites it from DATA.TRAIN.DROP_LAST whatever it is set to (its own configs set it); Largo infers it alike"},
      {"LOSS.deepclusterv2_loss.BATCHSIZE_PER_REPLICA", "VISSL overwrites it from DATA.TRAIN.BATCHSIZE_PER_REPLICA whatever it is set to (its own configs set it); Largo infers it alike"},
      {"LOSS.deepclusterv2_loss.num_crops", "VISSL overwrites it from DATA.TRAIN.TRANSFORMS' crops whatever it is set to (its own configs set it); Largo infers it alike"},
      {"LOSS.deepclusterv2_loss.num_train_samples", "VISSL overwrites it from the training dataset's size whatever it is set to (its own configs set it); Largo infers it alike"},
      {"MULTI_PROCESSING_METHOD", "Largo's loader runs threads, not processes: there is no start method"},
      {"HOOKS.LOG_GPU_STATS", logging},
      {"HOOKS.TENSORBOARD_SETUP.LOG_DIR", "VISSL does not read it either: events go to CHECKPOINT.DIR/tb_logs"},
      {"HOOKS.TENSORBOARD_SETUP.EXPERIMENT_LOG_DIR", "VISSL does not read it either"},
      {"HOOKS.TENSORBOARD_SETUP.FLUSH_EVERY_N_MIN", "logging only: Largo flushes after each evaluation and at the end"},
      {"HOOKS.TENSORBOARD_SETUP.LOG_PARAMS", "logging only: Largo writes scalars, not parameter histograms"},
      {"HOOKS.TENSORBOARD_SETUP.LOG_PARAMS_GRADIENTS", "logging only: Largo writes scalars, not gradient histograms"},
      {"HOOKS.TENSORBOARD_SETUP.LOG_PARAMS_EVERY_N_ITERS", "logging only: no histograms are written"},
      {"HOOKS.PERF_STATS.MONITOR_PERF_STATS", logging},
      {"HOOKS.PERF_STATS.PERF_STAT_FREQUENCY", logging},
      {"HOOKS.PERF_STATS.ROLLING_BTIME_FREQ", logging},
      {"HOOKS.MEMORY_SUMMARY.PRINT_MEMORY_SUMMARY", logging},
      {"HOOKS.MEMORY_SUMMARY.LOG_ITERATION_NUM", logging},
      {"HOOKS.MEMORY_SUMMARY.DUMP_MEMORY_ON_EXCEPTION", logging},
      {"HOOKS.MODEL_COMPLEXITY.COMPUTE_COMPLEXITY", "logging only: largo train always logs the model's FLOPs per sample and achieved FLOP/s"},
      {"HOOKS.MODEL_COMPLEXITY.INPUT_SHAPE", "the input shape of that FLOP count"},
      {"DATA.PIN_MEMORY", "speed only (host-to-GPU copies); the batches are the same"},
      {"DATA.ENABLE_ASYNC_GPU_COPY", "speed only (host-to-GPU copies); the batches are the same"},
      {"DATA.TEST.USE_STATEFUL_DISTRIBUTED_SAMPLER", "the test split is always evaluated whole, each sample once on one rank; the counts do not depend on the order"},
      {"MODEL.FSDP_CONFIG.FORCE_SYNC_CUDA", "CUDA synchronization for memory debugging; the computation is the same"},
      {"MODEL.FSDP_CONFIG.flatten_parameters", "Largo's FSDP units are always flat; the computation is the same (LARC's norms are completed across ranks)"},
      {"MODEL.FSDP_CONFIG.mixed_precision", "derived from MODEL.AMP_PARAMS.USE_AMP, as VISSL's AUTO_SETUP_FSDP does"},
      {"MODEL.FSDP_CONFIG.bucket_cap_mb", "speed only: each unit is reduce-scattered on its own"},
      {"MODEL.FSDP_CONFIG.clear_autocast_cache", "autocast's cache is dropped when each forward's autocast region ends, always"},
      {"MODEL.FSDP_CONFIG.verbose", "logging only: the units are always logged"},
      {"OPTIMIZER.layer_wise_lr_decay.decay", "read only by VISSL's layer_decay parameter group constructor, which is refused"},
      {"METERS.enable_training_meter", "logging only: Largo reports no training-batch accuracy"},
      {"METERS.accuracy_list_meter.num_meters", "one meter per model output, as VISSL fills it in"},
      {"METERS.accuracy_list_meter.meter_names", "logging only: names in the meter lines"},
      {"DISTRIBUTED.NCCL_DEBUG", "logging only: set the NCCL_DEBUG environment variable yourself"},
      {"DISTRIBUTED.NCCL_SOCKET_NTHREADS", "speed only: set the NCCL_SOCKET_NTHREADS environment variable yourself"},
      {"CHECKPOINT.USE_SYMLINK_CHECKPOINT_FOR_RESUME", "Largo always resumes through the checkpoint.torch link to the newest complete checkpoint, what either value finds"},
  };
  for (const std::string split : {"TRAIN", "TEST"}) {
    keys.push_back({"DATA." + split + ".MMAP_MODE", "how .npy file lists are read; Largo reads them whole (they hold paths, not images)"});
    keys.push_back({"DATA." + split + ".DEFAULT_GRAY_IMG_SIZE", "VISSL's gray stand-in for unreadable images; Largo stops naming the file or, with SKIP_BAD_SAMPLES, skips and counts it"});
  }
  return keys;
}

// Every leaf of the defaults tree (maps with children are walked into; empty maps, lists
// and scalars are keys).
void collect_leaves(const YAML::Node& node, const std::string& prefix, std::vector<std::string>& out) {
  if (node.IsMap() && node.size() > 0) {
    for (const auto& entry : node) {
      const std::string name = entry.first.as<std::string>();
      collect_leaves(entry.second, prefix.empty() ? name : prefix + "." + name, out);
    }
    return;
  }
  out.push_back(prefix);
}

std::vector<std::string> default_keys() {
  std::vector<std::string> keys;
  collect_leaves(Config::defaults().root(), "", keys);
  return keys;
}

// "Suite.Name" of every TEST / TEST_F / TEST_P under tests/.
std::set<std::string> test_names() {
  std::set<std::string> names;
  const std::regex pattern(R"(TEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\))");
  for (const auto& entry : fs::recursive_directory_iterator(largo::test_paths::data_dir())) {
    if (entry.path().extension() != ".cpp") {
      continue;
    }
    std::ifstream file(entry.path());
    std::stringstream text;
    text << file.rdbuf();
    const std::string content = text.str();
    for (std::sregex_iterator it(content.begin(), content.end(), pattern), end; it != end; ++it) {
      names.insert((*it)[1].str() + "." + (*it)[2].str());
    }
  }
  return names;
}

// Reads the config the way a run does: the trainer's options and the launch plan.
void map_config(const Config& config) {
  trainer_options_from_config(config);
  validate_launch_config(config);
}

// A value of the wrong type for `key`'s default, which no reader accepts: a reader that
// reaches it throws, a key nothing reads leaves the mapping unaffected.
YAML::Node wrong_type_for(const YAML::Node& default_value) {
  if (default_value.IsMap()) {
    return YAML::Load("__largo_audit__");
  }
  if (default_value.IsSequence()) {
    return YAML::Load("[{__largo_audit__: 1}]");
  }
  return YAML::Load("{__largo_audit__: 1}");
}

TEST(ConfigKeyAudit, EveryDefaultKeyIsInExactlyOneList) {
  std::map<std::string, std::vector<std::string>> lists_of;
  for (const auto& entry : wired_keys()) {
    lists_of[entry.key].push_back("wired");
  }
  for (const auto& entry : unavailable_keys()) {
    lists_of[entry.key].push_back("refused");
  }
  for (const auto& entry : no_effect_keys()) {
    lists_of[entry.key].push_back("no effect");
  }
  std::set<std::string> defaults;
  std::vector<std::string> silently_ignored;
  for (const auto& key : default_keys()) {
    defaults.insert(key);
    auto it = lists_of.find(key);
    if (it == lists_of.end()) {
      silently_ignored.push_back(key);
    } else {
      EXPECT_EQ(it->second.size(), 1u) << key << " is in several lists";
    }
  }
  EXPECT_TRUE(silently_ignored.empty())
      << "keys in no list (silently ignored): " << fmt::format("{}", fmt::join(silently_ignored, ", "));
  for (const auto& [key, lists] : lists_of) {
    EXPECT_EQ(defaults.count(key), 1u) << key << " is listed but is not a key of configs/defaults.yaml";
  }
}

TEST(ConfigKeyAudit, WiredKeysAreReadByTheMappingAndNameATestThatExists) {
  const std::set<std::string> tests = test_names();
  const Config defaults = Config::defaults();
  for (const auto& entry : wired_keys()) {
    SCOPED_TRACE(entry.key);
    EXPECT_EQ(tests.count(entry.test), 1u) << "no test named " << entry.test;
    Config config = Config::load({}, entry.with);
    ASSERT_NO_THROW(map_config(config));
    // Plant a value of the wrong type (bypassing the config's own type check): the mapping
    // must fail, because it reads the key.
    YAML::Node node = config.node(entry.key);
    node = wrong_type_for(defaults.node(entry.key));
    EXPECT_ANY_THROW(map_config(config)) << entry.key << " is not read by the config mapping";
  }
}

// The value a refused key is set to in the check: one its type admits that is not the default.
std::string changed_value(const YAML::Node& value) {
  if (value.IsMap()) {
    return "{a: 1}";
  }
  if (value.IsSequence()) {
    return value.size() == 0 ? "[x]" : "[]";
  }
  if (value.IsNull()) {
    return "[1.0]";
  }
  if (yaml_scalar_is_bool(value)) {
    return yaml_to_bool(value, "") ? "False" : "True";
  }
  if (yaml_scalar_is_number(value)) {
    return fmt::format("{}", yaml_to_double(value, "") + 2);
  }
  return "\"not_the_default\"";
}

TEST(ConfigKeyAudit, RefusedKeysStopTheRunWhenChangedAndNameTheDefault) {
  const Config defaults = Config::defaults();
  for (const auto& entry : unavailable_keys()) {
    SCOPED_TRACE(entry.key);
    const YAML::Node default_value = defaults.node(entry.key);
    Config config = Config::load({}, {entry.key + "=" + changed_value(default_value)});
    try {
      map_config(config);
      ADD_FAILURE() << entry.key << " changed was accepted";
    } catch (const ConfigError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("config key " + entry.key + " = "), std::string::npos) << message;
      EXPECT_NE(message.find("is not available in this version of Largo"), std::string::npos) << message;
      EXPECT_NE(message.find("set it to " + config_value_text(default_value)), std::string::npos)
          << message;
    }
    for (const auto& accepted : entry.also_accepted) {
      EXPECT_NO_THROW(map_config(Config::load({}, {entry.key + "=" + accepted}))) << accepted;
    }
  }
}

TEST(ConfigKeyAudit, NoEffectKeysSayWhy) {
  for (const auto& entry : no_effect_keys()) {
    EXPECT_GT(entry.reason.size(), 10u) << entry.key;
  }
}

// docs/config.md's table of every key, generated from the lists above.
std::string key_table() {
  std::map<std::string, std::string> rows;
  const Config defaults = Config::defaults();
  for (const auto& entry : wired_keys()) {
    rows[entry.key] = fmt::format("{} | {} (test `{}`)", "used", entry.what, entry.test);
  }
  for (const auto& entry : unavailable_keys()) {
    std::string accepted;
    for (const auto& value : entry.also_accepted) {
      accepted += fmt::format(" or `{}`", value);
    }
    rows[entry.key] = fmt::format("refused{} | {}: keep `{}`{}", entry.not_built_yet ? " (not wired yet)" : "",
                                  entry.what, config_value_text(defaults.node(entry.key)), accepted);
  }
  for (const auto& entry : no_effect_keys()) {
    rows[entry.key] = fmt::format("no effect | {}", entry.reason);
  }
  std::string table = "| key | status | what it does, or why |\n|---|---|---|\n";
  for (const auto& key : default_keys()) {
    table += fmt::format("| `{}` | {} |\n", key, rows.count(key) ? rows[key] : "**unlisted** |");
  }
  return table;
}

TEST(ConfigKeyAudit, DocsListEveryKeyAsTheAuditDoes) {
  const fs::path docs =
      fs::path(largo::test_paths::data_dir()).parent_path() / "docs" / "config.md";
  std::ifstream file(docs);
  ASSERT_TRUE(file.good()) << docs;
  std::stringstream text;
  text << file.rdbuf();
  std::string content = text.str();
  const std::string begin = "<!-- key-audit: begin -->\n";
  const std::string end = "<!-- key-audit: end -->";
  const size_t first = content.find(begin);
  const size_t last = content.find(end);
  ASSERT_TRUE(first != std::string::npos && last != std::string::npos && first < last)
      << docs << " has no " << begin << " ... " << end << " section";
  const std::string table = key_table();
  const std::string current = content.substr(first + begin.size(), last - first - begin.size());
  if (current == table) {
    return;
  }
  if (std::getenv("LARGO_UPDATE_DOCS") != nullptr) {
    content.replace(first + begin.size(), current.size(), table);
    std::ofstream(docs) << content;
    return;
  }
  ADD_FAILURE() << docs << "'s key table is stale: run LARGO_UPDATE_DOCS=1 "
                << "build/tests/largo_train_tests --gtest_filter=ConfigKeyAudit.*";
}

} // namespace
} // namespace largo::train::config_key_audit_test
