// The parallel layer's keys (parallel_config.h).
#include "parallel_config.h"

#include "config_checks.h"
#include "regnet_config.h"

#include <largo/parallel/data_parallel/fully_sharded_data_parallel.h>
#include <largo/train/worker_launch.h>

#include <fmt/format.h>

namespace largo::train {
namespace {

// MODEL.FSDP_CONFIG's precision keys. As VISSL does, they follow MODEL.AMP_PARAMS: AMP on
// selects AMP_TYPE pytorch and mixed_precision, computing in float32 under autocast with
// FSDP's AMP_TYPE O1, or in compute copies of MODEL.AMP_PARAMS.DTYPE (float16 unless set) with
// O2; AMP off turns mixed_precision off and computes in float32 (FSDP's AMP_TYPE then changes
// nothing). An explicit compute_dtype float16 or bfloat16 with O1 asks for compute copies too
// (a Largo extension), and is the dtype the loss scaler then plans for; without AMP it is an
// error.
void fsdp_precision_from(const Config& config, TrainerOptions& options) {
  const std::string prefix = "MODEL.FSDP_CONFIG.";
  const std::string amp_type = config.get_string(prefix + "AMP_TYPE");
  require(
      amp_type == "01" || amp_type == "O1" || amp_type == "O2",
      prefix + "AMP_TYPE",
      amp_type,
      "O1 (float32 compute; VISSL's default \"01\" reads the same) or O2 (compute copies in "
      "MODEL.AMP_PARAMS.DTYPE)");
  std::string compute_dtype = config.get_string(prefix + "compute_dtype");
  require(
      compute_dtype == "float32" || compute_dtype == "float16" || compute_dtype == "bfloat16",
      prefix + "compute_dtype",
      compute_dtype,
      "float32, float16 or bfloat16");
  auto& fsdp = options.parallel.fsdp;
  fsdp.fp32_reduce_scatter = config.get_bool(prefix + "fp32_reduce_scatter");
  const bool mixed_precision = options.amp.use_amp; // VISSL's FSDP_CONFIG.mixed_precision
  if (fsdp.fp32_reduce_scatter && !mixed_precision) {
    throw ConfigError(
        "MODEL.FSDP_CONFIG.fp32_reduce_scatter needs mixed_precision (AUTO_SETUP_FSDP turns "
        "mixed_precision on with MODEL.AMP_PARAMS.USE_AMP): turn AMP on, or set "
        "fp32_reduce_scatter to False");
  }
  if (compute_dtype != "float32" && !mixed_precision) {
    throw ConfigError(fmt::format(
        "MODEL.FSDP_CONFIG.compute_dtype {} needs mixed_precision (AUTO_SETUP_FSDP turns it on "
        "with MODEL.AMP_PARAMS.USE_AMP): turn AMP on, or set compute_dtype float32",
        compute_dtype));
  }
  if (!mixed_precision) {
    return;
  }
  options.amp.amp_type = "pytorch"; // VISSL forces it for FSDP; apex's O2/O3 casts do not apply
  if (amp_type == "O2") {
    compute_dtype = options.amp.dtype; // VISSL: O2 computes with float16 copies
  } else if (compute_dtype != "float32") {
    options.amp.dtype = compute_dtype;
  }
  if (compute_dtype != "float32") { // else float32 units, the forward under autocast
    fsdp.compute_dtype = compute_dtype == "bfloat16" ? at::kBFloat16 : at::kHalf;
  }
}

// DISTRIBUTED.PIPELINE_SIZE and MODEL.PIPELINE (docs/pipeline.md).
parallel::PipelineOptions pipeline_options_from(const Config& config) {
  parallel::PipelineOptions pipeline;
  pipeline.size = static_cast<int>(positive_int(config, "DISTRIBUTED.PIPELINE_SIZE"));
  const std::string key = "MODEL.PIPELINE.";
  parallel::PipelineParallelOptions& stages = pipeline.stages;
  const std::string schedule = config.get_string(key + "SCHEDULE");
  try {
    stages.schedule(parallel::parse_pipeline_schedule(schedule));
  } catch (const ConfigError&) {
    throw config_error(key + "SCHEDULE", schedule, "gpipe, 1f1b, interleaved_1f1b or zb_h1");
  }
  stages.num_microbatches(static_cast<int>(positive_int(config, key + "NUM_MICROBATCHES")));
  stages.virtual_stages(static_cast<int>(positive_int(config, key + "VIRTUAL_STAGES")));
  stages.boundaries(config.get_int_list(key + "BOUNDARIES"));
  stages.balance(parallel::parse_stage_balance(config.get_string(key + "BALANCE")));
  stages.checkpoint_stages(config.get_bool(key + "CHECKPOINT_STAGES"));
  return pipeline;
}

} // namespace

VisslTask vissl_task(const Config& config) {
  const std::string task = config.get_string("TRAINER.TASK_NAME");
  if (task == "self_supervision_sdp_task") {
    return VisslTask::kShardedDdp;
  }
  if (task == "self_supervision_fsdp_task") {
    return VisslTask::kFsdp;
  }
  require(
      task == "self_supervision_task",
      "TRAINER.TASK_NAME",
      task,
      "one of VISSL's three tasks: self_supervision_task (DDP, or ZeRO-1 with "
      "OPTIMIZER.use_zero), self_supervision_sdp_task (ZeRO-2, beside OPTIMIZER.use_zero) or "
      "self_supervision_fsdp_task (FSDP)");
  return VisslTask::kDdp;
}

bool fsdp_requested(const Config& config) {
  return config.get_bool("MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP") ||
         vissl_task(config) == VisslTask::kFsdp;
}

// MODEL.FSDP_CONFIG (ZeRO stage 3, docs/fsdp.md): AUTO_SETUP_FSDP or VISSL's FSDP task turns
// it on, after the ZeRO keys were read (the two exclude each other).
void fsdp_options_from(const Config& config, TrainerOptions& options) {
  const std::string prefix = "MODEL.FSDP_CONFIG.";
  const bool offload = config.get_bool(prefix + "offload_optimizer");
  if (!fsdp_requested(config)) {
    require(
        !offload,
        prefix + "offload_optimizer",
        "True",
        "False without FSDP (MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP or TRAINER.TASK_NAME "
        "self_supervision_fsdp_task); ZeRO-1/2's is OPTIMIZER.offload_optimizer");
    return;
  }
  const bool zero_on = options.parallel.data_parallelism != parallel::DataParallelism::kDdp;
  options.parallel.data_parallelism = parallel::DataParallelism::kFsdp;
  auto& fsdp = options.parallel.fsdp;
  const int64_t auto_wrap_threshold = config.get_int(prefix + "AUTO_WRAP_THRESHOLD");
  require(
      auto_wrap_threshold >= 0,
      prefix + "AUTO_WRAP_THRESHOLD",
      std::to_string(auto_wrap_threshold),
      "an integer >= 0 (0 wraps every trunk block that has parameters)");
  fsdp.wrap_policy = trunk_block_units(auto_wrap_threshold);
  fsdp.reshard_after_forward = config.get_bool(prefix + "reshard_after_forward");
  fsdp.prefetch = config.get_bool(prefix + "prefetch");
  options.parallel.offload_optimizer = offload;
  fsdp_precision_from(config, options);
  if (zero_on) {
    throw ConfigError(
        "FSDP (ZeRO stage 3: MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP or TRAINER.TASK_NAME "
        "self_supervision_fsdp_task) and ZeRO stage 1/2 (OPTIMIZER.use_zero, OPTIMIZER.name zero "
        "or MODEL.SHARDED_DDP_SETUP.USE_SDP) are both on; stage 3 already shards the optimizer "
        "state and the gradients: turn the other off");
  }
  // flatten_parameters: units are always flat here (with LARC too: its per-parameter norms
  // are completed across ranks). bucket_cap_mb: each unit is reduce-scattered on its own.
  // clear_autocast_cache: autocast's cache is dropped when each forward's autocast region
  // ends. verbose: the units are always logged. Read so that a wrong type is reported.
  config.get_bool(prefix + "flatten_parameters");
  require(
      config.get_int(prefix + "bucket_cap_mb") >= 0,
      prefix + "bucket_cap_mb",
      "(given)",
      "an integer >= 0");
  config.get_bool(prefix + "clear_autocast_cache");
  config.get_bool(prefix + "verbose");
}

// DISTRIBUTED's pipeline and tensor-parallel sizes, and MODEL.ACTIVATION_CHECKPOINTING.
void model_parallel_options_from(const Config& config, TrainerOptions& options) {
  options.parallel.pipeline = pipeline_options_from(config);
  options.parallel.tensor_parallel_size =
      static_cast<int>(positive_int(config, "DISTRIBUTED.TENSOR_PARALLEL_SIZE"));
  options.parallel.sequence_parallel = config.get_bool("DISTRIBUTED.SEQUENCE_PARALLEL");
  // The trunk cut into NUM_ACTIVATION_CHECKPOINTING_SPLITS segments of balanced measured
  // activation bytes, every one but the last checkpointed (parallel/parallelize.h).
  const std::string checkpointing = "MODEL.ACTIVATION_CHECKPOINTING.";
  const int64_t num_splits =
      positive_int(config, checkpointing + "NUM_ACTIVATION_CHECKPOINTING_SPLITS");
  // VISSL's RegNet checkpoint groups, where given, cut the trunk instead (checked either way;
  // without checkpointing VISSL's groups change nothing either).
  const std::vector<int64_t> groups =
      options.model.trunk_name == "regnet"
          ? regnet_checkpoint_boundaries(config, options.model.regnet)
          : std::vector<int64_t>{};
  if (config.get_bool(checkpointing + "USE_ACTIVATION_CHECKPOINTING")) {
    auto& cut = options.parallel.activation_checkpointing;
    cut.sequential = "trunk";
    cut.num_splits = groups.empty() ? num_splits : static_cast<int64_t>(groups.size()) - 1;
    cut.boundaries = groups;
  }
}

void distributed_options_from(const Config& config, TrainerOptions& options) {
  // NUM_NODES / NUM_PROC_PER_NODE / INIT_METHOD / RUN_ID decide how the
  // workers start (train/worker_launch.h); a worker learns its rank from the environment.
  auto& distributed = options.distributed;
  distributed.backend = config.get_string("DISTRIBUTED.BACKEND");
  require(
      distributed.backend == "gloo" || distributed.backend == "nccl",
      "DISTRIBUTED.BACKEND",
      distributed.backend,
      "gloo (CPU) or nccl (CUDA)");
  parallel::ParallelOptions& modes = options.parallel;
  const bool broadcast_buffers = config.get_bool("DISTRIBUTED.BROADCAST_BUFFERS");
  modes.ddp.broadcast_buffers = broadcast_buffers;
  modes.zero.broadcast_buffers = broadcast_buffers;
  modes.fsdp.broadcast_buffers = broadcast_buffers;
  const bool find_unused_parameters = config.get_bool("DISTRIBUTED.FIND_UNUSED_PARAMETERS");
  modes.ddp.find_unused_parameters = find_unused_parameters;
  modes.zero.find_unused_parameters = find_unused_parameters;
  modes.ddp.manual_reduction = config.get_bool("DISTRIBUTED.MANUAL_GRADIENT_REDUCTION");
  modes.ddp.delay_allreduce = config.get_bool("DISTRIBUTED.DELAY_ALLREDUCE");
  modes.ddp.bucket_cap_bytes = positive_int(config, "DATA.DDP_BUCKET_CAP_MB") * 1024 * 1024;
  distributed.rendezvous_timeout_seconds =
      positive_int(config, "DISTRIBUTED.RENDEZVOUS_TIMEOUT_SECONDS");
  distributed.collective_timeout_seconds =
      positive_int(config, "DISTRIBUTED.COLLECTIVE_TIMEOUT_SECONDS");
  if (auto fallback = run_id_master_port(config)) {
    distributed.run_id_master_port = fallback->port;
  }
  positive_int(config, "DISTRIBUTED.NUM_NODES");
  positive_int(config, "DISTRIBUTED.NUM_PROC_PER_NODE");
  options.gradient_accumulation_steps = positive_int(config, "TRAINER.GRADIENT_ACCUMULATION_STEPS");
  // Manual reduction is DistributedDataParallel's; ZeRO stage 2 and FSDP reduce (and scatter)
  // gradients from their own hooks, so the switch would change nothing there.
  if (modes.ddp.manual_reduction && parallel::zero_stage(modes.data_parallelism) >= 2) {
    const bool fsdp = modes.data_parallelism == parallel::DataParallelism::kFsdp;
    throw config_error(
        "DISTRIBUTED.MANUAL_GRADIENT_REDUCTION",
        "True",
        fmt::format(
            "False with {}: it applies to DistributedDataParallel, and {} "
            "reduces gradients in its own hooks",
            fsdp ? "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP" : "MODEL.SHARDED_DDP_SETUP.USE_SDP",
            fsdp ? "FSDP" : "ZeRO stage 2"));
  }
}

} // namespace largo::train
