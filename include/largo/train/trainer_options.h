// Typed options of the Trainer. The `largo` program fills them from the YAML config
// (train/trainer_config.h); library users can fill them directly.
#pragma once

#include <largo/checkpoint/weights_init.h>
#include <largo/data/dataset_factory.h>
#include <largo/models/attention_backend.h>
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
  // OPTIMIZER.name (sgd | adamw | lamb | lars), its hyperparameters, use_larc and
  // larc_config.
  optim::OptimizerSpec spec = [] {
    optim::OptimizerSpec sgd_with_momentum; // VISSL's default, momentum 0.9
    sgd_with_momentum.sgd.momentum = 0.9;
    return sgd_with_momentum;
  }();
  // OPTIMIZER.larc_config.exclude_bias_and_norm: the trainer fills
  // spec.larc.excluded_from_adaptation with the model's norm-layer and bias parameters.
  bool larc_exclude_bias_and_norm = false;
  // OPTIMIZER.exclude_bias_and_norm (lars): the trainer fills
  // spec.lars.excluded_from_adaptation with the model's 1-D parameters, as VISSL decides it
  // (p.ndim == 1) but from the whole parameters, before any sharding.
  bool lars_exclude_bias_and_norm = false;
  double weight_decay = 1e-4;
  int64_t num_epochs = 90;
  optim::ParamGroupOptions param_groups;
  optim::ScheduleOptions lr;
  optim::AutoLrScaling lr_scaling;
  // The head follows lr_head when use_different_lr, else the same schedule as the trunk.
  bool head_use_different_lr = false;
  optim::ScheduleOptions lr_head;
  optim::AutoLrScaling lr_head_scaling;
  // Schedules of the weight decay (unset: constant). weight_decay_schedule sets the groups
  // that take OPTIMIZER.weight_decay, head_weight_decay_schedule the head's decayed group
  // (optim::decay_source); the groups without decay keep 0.
  std::optional<optim::ScheduleOptions> weight_decay_schedule;
  std::optional<optim::ScheduleOptions> head_weight_decay_schedule;
};

struct CheckpointOptions {
  std::filesystem::path dir = ".";
  bool auto_resume = true;
  int64_t frequency_epochs = 1;      // save every N epochs (and always at the end)
  int64_t frequency_iterations = -1; // also every N iterations; -1 = off
  bool overwrite_existing = false;   // train again even if a final checkpoint exists
};

// How this process joins the world (DISTRIBUTED.*). The world itself (rank, world size,
// master) comes from the launcher's environment (comm/world_info.h); how the ranks train
// together is TrainerOptions::parallel.
struct DistributedOptions {
  std::string backend = "gloo"; // gloo | nccl
  int64_t rendezvous_timeout_seconds = 300;
  int64_t collective_timeout_seconds = 1800;
  // DISTRIBUTED.RUN_ID's port (INIT_METHOD tcp, RUN_ID host:port): the master port under a
  // launcher that sets no MASTER_PORT (srun, mpirun).
  std::optional<int> run_id_master_port;
};

// VISSL's FSDP units: the trunk's blocks with at least `auto_wrap_threshold` trainable
// parameter elements (MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD); the head stays in the root.
parallel::WrapPolicy trunk_block_units(int64_t auto_wrap_threshold);

// The library's parallel options (parallel/parallelize.h) as the Trainer starts from them:
// FSDP units are trunk_block_units(0) and its compute copies keep BatchNorm in float32
// (Apex's keep_batchnorm_fp32). Both are defined in run_plan.cpp.
parallel::ParallelOptions trainer_parallel_defaults();

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
  // The convolutions' weights and the training batches in the channels-last layout
  // (models/channels_last_module.h; MODEL.CHANNELS_LAST). kAuto: on for the convolutional
  // trunks (resnet, resnet_sk, regnet) on a CUDA device, except where ZeRO or FSDP keeps the
  // parameters in flat buffers (which hold them contiguous) or a pipeline runs: kOn is
  // refused there. Checkpoints are written in the standard layout either way.
  enum class AutoSwitch { kAuto, kOn, kOff };
  using ChannelsLast = AutoSwitch;
  ChannelsLast channels_last = ChannelsLast::kAuto;
  // Read the loss and the inf/NaN decision to the host in every step (MACHINE.SYNC_EVERY_STEP;
  // train_step.h). kOff: the host reads them when it logs (LOG_FREQUENCY), checkpoints
  // mid-epoch, at an epoch's end or when the run stops, and check_nan stops the run at that
  // read, naming the first bad iteration. kAuto: off on a CUDA device without loss scaling,
  // on otherwise (on the CPU a read costs nothing); kOff with loss scaling (float16) is
  // refused.
  AutoSwitch sync_every_step = AutoSwitch::kAuto;
  // The whole step as one CUDA graph, captured after a warm-up and replayed
  // (train/cuda_graph_step.h; MACHINE.CUDA_GRAPH). Refused at start, naming what stands in its
  // way, unless the run is one process on a CUDA device without a host read in the step, with
  // SGD and fixed batch shapes (RunPlan, resolve_cuda_graph).
  bool cuda_graph = false;
  int64_t num_threads = 0;    // intra-op threads; 0 = every core
  // The scaled-dot-product-attention kernel CUDA attention tries first, set process-wide when
  // the run starts (models/attention_backend.h; MACHINE.ATTENTION_BACKEND).
  models::AttentionBackend attention_backend = models::AttentionBackend::kAuto;

  DistributedOptions distributed;
  // How the ranks train together (docs/parallelism.md): the data-parallel mode (DDP, ZeRO-1/2,
  // FSDP) and its options, the pipeline, tensor parallelism, activation checkpointing. The
  // Trainer builds its model with parallel::parallelize(..., parallel), having set the
  // run's own parts:
  // - precision, grad_scaler and check_finite from `amp`, `grad_scaler` and `check_nan` (a
  //   precision or check_finite set here is refused: set those instead);
  // - the activation checkpointing probe's input shape, when empty, from the data (the cut
  //   of a Sequential, e.g. sequential "trunk" with num_splits, VISSL's
  //   MODEL.ACTIVATION_CHECKPOINTING), and its report at the training batch size.
  parallel::ParallelOptions parallel = trainer_parallel_defaults();
  // Micro-batches of BATCHSIZE_PER_REPLICA whose gradients are summed into one optimizer
  // step (TRAINER.GRADIENT_ACCUMULATION_STEPS); the loss of each is divided by their count.
  int64_t gradient_accumulation_steps = 1;

  CheckpointOptions checkpoint;
  bool use_tensorboard = false;
  // The CUDA caching allocator's cache emptied before every this-many-th iteration
  // (device_cache_hook.h; VISSL's MODEL.CUDA_CACHE); 0: never. Nothing to empty on the CPU.
  int64_t empty_device_cache_every = 0;

  // Whether DATA.TEST is opened: a self-supervised run that does not evaluate (TEST_MODEL
  // False, as VISSL's pretraining configs) has no test split to read.
  bool reads_test_split() const {
    return test_model || !self_supervised.enabled();
  }

  // Testing aid: return as if the process were killed after this many iterations
  // of this run (no checkpoint is written at that point); -1 = never.
  int64_t stop_after_iterations = -1;
  // Testing aid: keep the dataset indices of the training samples this run's steps read, by
  // epoch, in TrainSummary::samples_read (a resumed run reads each sample of an epoch once).
  bool record_samples_read = false;
};

} // namespace largo::train
