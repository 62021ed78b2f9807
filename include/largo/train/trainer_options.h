// Typed options of the Trainer. The `largo` program fills them from the YAML config
// (train/trainer_config.h); library users can fill them directly.
#pragma once

#include <largo/checkpoint/weights_init.h>
#include <largo/data/dataset_factory.h>
#include <largo/models/model_factory.h>
#include <largo/optim/lr_schedule.h>
#include <largo/optim/model_ema.h>
#include <largo/optim/optimizer_factory.h>
#include <largo/optim/param_groups.h>
#include <largo/parallel/parallelize.h>
#include <largo/precision/grad_scaler.h>
#include <largo/precision/precision_policy.h>
#include <largo/precision/tf32.h>
#include <largo/train/classification_loss.h>
#include <largo/train/self_supervised_loss.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace largo::train {

// The loader-wide keys (DATA.*).
struct DataLoadingOptions {
  int64_t num_workers = 2;    // DATA.NUM_DATALOADER_WORKERS (>= 0)
  bool pin_memory = true;     // DATA.PIN_MEMORY
  bool async_gpu_copy = true; // DATA.ENABLE_ASYNC_GPU_COPY
};

struct OptimizerOptions {
  // OPTIMIZER.name (sgd | adamw | lamb), its hyperparameters, use_larc and larc_config.
  optim::OptimizerSpec spec = [] {
    optim::OptimizerSpec sgd_with_momentum; // VISSL's default, momentum 0.9
    sgd_with_momentum.sgd.momentum = 0.9;
    return sgd_with_momentum;
  }();
  // OPTIMIZER.larc_config.exclude_bias_and_norm: the trainer fills
  // spec.larc.excluded_from_adaptation with the model's norm-layer and bias parameters.
  bool larc_exclude_bias_and_norm = false;
  double weight_decay = 1e-4;
  int64_t num_epochs = 90;
  optim::ParamGroupOptions param_groups;
  optim::ScheduleOptions lr;
  optim::AutoLrScaling lr_scaling;
  // The head follows lr_head when use_different_lr, else the same schedule as the trunk.
  bool head_use_different_lr = false;
  optim::ScheduleOptions lr_head;
  optim::AutoLrScaling lr_head_scaling;
};

struct CheckpointOptions {
  std::filesystem::path dir = ".";
  bool auto_resume = true;
  int64_t frequency_epochs = 1;      // save every N epochs (and always at the end)
  int64_t frequency_iterations = -1; // also every N iterations; -1 = off
  bool overwrite_existing = false;   // train again even if a final checkpoint exists
};

// MODEL.ACTIVATION_CHECKPOINTING: the trunk's blocks are cut into num_splits segments of
// balanced measured activation bytes and every segment but the last is checkpointed
// (parallel/checkpointed_trunk.h).
struct ActivationCheckpointingOptions {
  bool enabled = false;   // USE_ACTIVATION_CHECKPOINTING
  int64_t num_splits = 2; // NUM_ACTIVATION_CHECKPOINTING_SPLITS
};

// Data parallelism (DISTRIBUTED.*, DATA.DDP_BUCKET_CAP_MB). The world itself (rank, world
// size, master) comes from the launcher's environment (comm/world_info.h).
struct DistributedOptions {
  std::string backend = "gloo"; // gloo | nccl
  bool broadcast_buffers = true;
  bool manual_gradient_reduction = false;
  bool find_unused_parameters = false;
  bool delay_allreduce = false;
  int64_t bucket_cap_mb = 25;
  int64_t rendezvous_timeout_seconds = 300;
  int64_t collective_timeout_seconds = 1800;
};

// ZeRO (docs/zero.md): stage 1 shards the optimizer state (OPTIMIZER.name: zero with
// OPTIMIZER.base_optimizer, or OPTIMIZER.use_zero); stage 2 also shards the gradients
// (MODEL.SHARDED_DDP_SETUP.USE_SDP, which implies stage 1).
struct ZeroOptions {
  bool shard_optimizer_state = false;
  bool shard_gradients = false;
  // MODEL.SHARDED_DDP_SETUP.reduce_buffer_size, in elements (-1 there: FairScale's 2^23).
  int64_t reduce_buffer_elements = int64_t{1} << 23;
};

// ZeRO stage 3 (MODEL.FSDP_CONFIG, docs/fsdp.md): parameters, gradients and optimizer state
// sharded (parallel/fully_sharded_data_parallel.h).
struct FsdpOptions {
  bool enabled = false;              // AUTO_SETUP_FSDP
  int64_t auto_wrap_threshold = 0;   // AUTO_WRAP_THRESHOLD
  bool reshard_after_forward = true; // reshard_after_forward
  bool prefetch = true;              // Largo extension: prefetch the next unit's all-gather
  // mixed_precision (MODEL.AMP_PARAMS.USE_AMP) with compute_dtype float32: float32 units, the
  // forward under autocast; with float16 or bfloat16: compute copies of float32 shards
  // (FullyShardedDataParallelOptions::compute_dtype). fp32_reduce_scatter needs it.
  bool mixed_precision = false;
  bool fp32_reduce_scatter = false;
  std::string compute_dtype = "float32"; // float32 | float16 | bfloat16

  // The dtype of FSDP's compute copies, or nullopt for float32 units (autocast, if AMP is on).
  std::optional<at::ScalarType> compute_copies() const {
    if (!enabled || !mixed_precision || compute_dtype == "float32") {
      return std::nullopt;
    }
    return compute_dtype == "bfloat16" ? at::kBFloat16 : at::kHalf;
  }
};

// MODEL.SYNC_BN_CONFIG: the model's BatchNorm2d layers replaced by parallel::SyncBatchNorm
// (statistics over the ranks of a group) before it is wrapped for data parallelism.
struct SyncBatchNormSettings {
  bool convert = false;    // CONVERT_BN_TO_SYNC_BN (SYNC_BN_TYPE pytorch and apex alike)
  int64_t group_size = -1; // GROUP_SIZE: -1 the ranks of a machine, 0 all, N > 0 N
};

// HOOKS.EMA_MODEL: VISSL's exponential moving average of the weights (optim/model_ema.h),
// kept when it is saved or evaluated.
struct ModelEmaSettings {
  bool save = false;              // SAVE_EMA_MODEL: checkpoint the average ("ema_model")
  bool meters = false;            // ENABLE_EMA_METERS: evaluate the average beside the model
  optim::ModelEmaOptions average; // DECAY, UPDATE_ITER, WARMUP, EMA_DEVICE (cpu: device kCPU)
  bool enabled() const {
    return save || meters;
  }
};

struct TrainerOptions {
  // DATA.TRAIN and DATA.TEST (data/dataset_factory.h: source, sampling, batching).
  data::DataSplitOptions train;
  data::DataSplitOptions test;
  DataLoadingOptions loading;

  // in_channels, image_size and num_classes are taken from the training data when 0.
  models::ModelOptions model;
  ActivationCheckpointingOptions activation_checkpointing;
  OptimizerOptions optimizer;
  SyncBatchNormSettings sync_batch_norm;
  ModelEmaSettings model_ema;
  // MODEL.WEIGHTS_INIT: the model's initial weights from a file (empty params_file: none);
  // applied on a fresh start only, a resumed run continues from its checkpoint.
  checkpoint::WeightsInitOptions weights_init;

  ClassificationLossOptions loss; // LOSS.name and LOSS.<name>
  // LOSS.name swav_loss / simclr_info_nce_loss: self-supervised pretraining on several views
  // of each image (DATA.TRAIN's multi-crop TRANSFORMS), in place of `loss`.
  SelfSupervisedLossOptions self_supervised;
  bool use_grad_clip = false;
  double grad_clip_max_norm = 1.0;
  double grad_clip_norm_type = 2.0;

  int64_t log_frequency = 10; // iterations between console/metrics lines
  bool test_model = true;
  bool test_only = false;
  int64_t test_every_num_epoch = 1;
  std::vector<int64_t> topk_values{1, 5};
  // HOOKS.CHECK_NAN: an inf/NaN loss or gradient stops training, writing no checkpoint (with
  // loss scaling the step is skipped instead; every rank decides alike).
  bool check_nan = true;

  // Mixed precision (MODEL.AMP_PARAMS), its loss scaler (MODEL.AMP_PARAMS.GRAD_SCALER) and
  // TF32 (MACHINE.ALLOW_TF32_*); see docs/mixed_precision.md.
  precision::PrecisionPolicyOptions amp;
  precision::GradScalerOptions grad_scaler;
  precision::Tf32Options tf32;

  uint64_t seed = 0;
  std::string device = "cpu"; // cpu | gpu
  int64_t num_threads = 0;    // intra-op threads; 0 = every core

  DistributedOptions distributed;
  ZeroOptions zero;
  FsdpOptions fsdp;
  // Pipeline parallelism (docs/pipeline.md): DISTRIBUTED.PIPELINE_SIZE and MODEL.PIPELINE.*.
  parallel::PipelineOptions pipeline;
  // Tensor parallelism (docs/tensor_parallel.md): DISTRIBUTED.TENSOR_PARALLEL_SIZE shards per
  // data-parallel replica; 1: off.
  int tensor_parallel_size = 1;
  // DISTRIBUTED.SEQUENCE_PARALLEL: the tensor-parallel ViT layers split by tokens too.
  bool sequence_parallel = false;
  // Micro-batches of BATCHSIZE_PER_REPLICA whose gradients are summed into one optimizer
  // step (TRAINER.GRADIENT_ACCUMULATION_STEPS); the loss of each is divided by their count.
  int64_t gradient_accumulation_steps = 1;

  CheckpointOptions checkpoint;
  bool use_tensorboard = false;

  // Whether DATA.TEST is opened: a self-supervised run that does not evaluate (TEST_MODEL
  // False, as VISSL's pretraining configs) has no test split to read.
  bool reads_test_split() const {
    return test_model || !self_supervised.enabled();
  }

  // Testing aid: return as if the process were killed after this many iterations
  // of this run (no checkpoint is written at that point); -1 = never.
  int64_t stop_after_iterations = -1;
};

} // namespace largo::train
