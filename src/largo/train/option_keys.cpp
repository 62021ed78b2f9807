#include <largo/train/option_keys.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace largo::train {
namespace {

// Option name -> YAML key. Where an option's value is named in a message (the modes of
// ParallelOptions::data_parallelism), the option and its value -> the key that sets it.
const std::map<std::string, std::string>& option_keys() {
  static const std::map<std::string, std::string> keys = {
      {"ActivationCheckpointingOptions",
       "MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING"},
      {"ActivationCheckpointingOptions::num_splits",
       "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS"},
      {"ActivationCheckpointingOptions::boundaries", "MODEL.TRUNK.REGNET.stage_checkpoints"},
      {"AdamOptions::betas", "OPTIMIZER.betas"},
      {"AdamOptions::eps", "OPTIMIZER.eps"},
      {"AdamWOptions::betas", "OPTIMIZER.betas"},
      {"AdamWOptions::eps", "OPTIMIZER.eps"},
      {"AutoLrScaling::base_lr_batch_size",
       "OPTIMIZER.param_schedulers.lr.auto_lr_scaling.base_lr_batch_size"},
      {"AutoLrScaling::scaling_type", "OPTIMIZER.param_schedulers.lr.auto_lr_scaling.scaling_type"},
      {"BarlowTwinsLossOptions::lambda", "LOSS.barlow_twins_loss.lambda_"},
      {"BarlowTwinsLossOptions::scale_loss", "LOSS.barlow_twins_loss.scale_loss"},
      {"DataSourceOptions::label_path", "LABEL_PATHS, with LABEL_SOURCES: [disk_filelist]"},
      {"DataSourceOptions::local_copy_dir", "COPY_DESTINATION_DIR"},
      {"leave DataSourceOptions::local_copy_dir empty", "set COPY_TO_LOCAL_DISK False"},
      {"DataSourceOptions::path", "DATA_PATHS"},
      {"DataSourceOptions::path (test split)", "DATA.TEST.DATA_PATHS"},
      {"DataSourceOptions::path (train split)", "DATA.TRAIN.DATA_PATHS"},
      {"DataSourceOptions::source", "DATA_SOURCES"},
      {"DataSourceOptions::transforms", "TRANSFORMS"},
      {"DataSplitOptions (test split)", "DATA.TEST (the test split)"},
      {"DataSplitOptions (train split)", "DATA.TRAIN (the train split)"},
      {"DistributedDataParallelOptions::bucket_cap_bytes", "DATA.DDP_BUCKET_CAP_MB"},
      {"DistributedDataParallelOptions::find_unused_parameters",
       "DISTRIBUTED.FIND_UNUSED_PARAMETERS"},
      {"DistributedDataParallelOptions::manual_reduction", "DISTRIBUTED.MANUAL_GRADIENT_REDUCTION"},
      {"FeatureEvalOptions::eval_mode_on", "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON"},
      {"FeatureEvalOptions::freeze_trunk_and_head",
       "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_AND_HEAD"},
      {"FeatureEvalOptions::freeze_trunk_only", "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY"},
      {"FeatureEvalOptions::heads", "MODEL.HEAD.PARAMS"},
      {"FeatureEvalOptions::taps", "MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"},
      {"FullyShardedDataParallelOptions::compute_dtype", "MODEL.FSDP_CONFIG.compute_dtype"},
      {"FullyShardedDataParallelOptions::fp32_reduce_scatter",
       "MODEL.FSDP_CONFIG.fp32_reduce_scatter"},
      {"GradScalerOptions::backoff_factor", "MODEL.AMP_PARAMS.GRAD_SCALER.BACKOFF_FACTOR"},
      {"GradScalerOptions::growth_factor", "MODEL.AMP_PARAMS.GRAD_SCALER.GROWTH_FACTOR"},
      {"GradScalerOptions::growth_interval", "MODEL.AMP_PARAMS.GRAD_SCALER.GROWTH_INTERVAL"},
      {"GradScalerOptions::hysteresis", "MODEL.AMP_PARAMS.GRAD_SCALER.HYSTERESIS"},
      {"GradScalerOptions::init_scale", "MODEL.AMP_PARAMS.GRAD_SCALER.INIT_SCALE"},
      {"GradScalerOptions::max_loss_scale", "MODEL.AMP_PARAMS.AMP_ARGS.max_loss_scale"},
      {"DeepClusterV2LossOptions::temperature", "LOSS.deepclusterv2_loss.temperature"},
      {"DeepClusterV2MemoryOptions::crops_for_mb",
       "LOSS.deepclusterv2_loss.memory_params.crops_for_mb"},
      {"DeepClusterV2MemoryOptions::embedding_dim",
       "LOSS.deepclusterv2_loss.memory_params.embedding_dim"},
      {"DeepClusterV2MemoryOptions::kmeans_iters", "LOSS.deepclusterv2_loss.kmeans_iters"},
      {"DeepClusterV2MemoryOptions::num_clusters", "LOSS.deepclusterv2_loss.num_clusters"},
      {"DinoHeadOptions::bottleneck_dim", "MODEL.HEAD.PARAMS dino_head bottleneck_dim"},
      {"DinoHeadOptions::hidden_dim", "MODEL.HEAD.PARAMS dino_head hidden_dim"},
      {"DinoHeadOptions::in_dim", "MODEL.HEAD.PARAMS dino_head in_dim"},
      {"DinoHeadOptions::num_clusters", "MODEL.HEAD.PARAMS dino_head num_clusters"},
      {"DinoHeadOptions::num_layers", "MODEL.HEAD.PARAMS dino_head num_layers"},
      {"DinoLossOptions::center_momentum", "LOSS.dino_loss.ema_center"},
      {"DinoLossOptions::crops_for_teacher", "LOSS.dino_loss.crops_for_teacher"},
      {"DinoLossOptions::output_dim", "MODEL.HEAD.PARAMS dino_head num_clusters"},
      {"DinoLossOptions::student_temp", "LOSS.dino_loss.student_temp"},
      {"DinoLossOptions::teacher_temp_max", "LOSS.dino_loss.teacher_temp_max"},
      {"DinoLossOptions::teacher_temp_min", "LOSS.dino_loss.teacher_temp_min"},
      {"DinoLossOptions::teacher_temp_warmup_iters", "LOSS.dino_loss.teacher_temp_warmup_iters"},
      {"DinoModelOptions::crops_for_teacher", "LOSS.dino_loss.crops_for_teacher"},
      {"GradScalerOptions::min_loss_scale", "MODEL.AMP_PARAMS.GRAD_SCALER.MIN_LOSS_SCALE"},
      {"LAMBOptions::betas", "OPTIMIZER.betas"},
      {"LAMBOptions::eps", "OPTIMIZER.eps"},
      {"LARCOptions::eps", "OPTIMIZER.larc_config.eps"},
      {"LARCOptions::trust_coefficient", "OPTIMIZER.larc_config.trust_coefficient"},
      {"LARSOptions::eta", "OPTIMIZER.eta"},
      {"LARSOptions::momentum", "OPTIMIZER.momentum"},
      {"MlpHeadSpec::dims", "MODEL.HEAD.PARAMS dims"},
      {"MlpOptions::dropout", "MODEL.TRUNK.MLP.DROPOUT"},
      {"MlpOptions::hidden_dims", "MODEL.TRUNK.MLP.HIDDEN_DIMS"},
      {"ModelEmaOptions::decay", "HOOKS.EMA_MODEL.DECAY"},
      {"ModelEmaOptions::update_iter", "HOOKS.EMA_MODEL.UPDATE_ITER"},
      {"ModelEmaOptions::warmup", "HOOKS.EMA_MODEL.WARMUP"},
      {"MocoLossOptions::temperature", "LOSS.moco_loss.temperature"},
      {"MocoModelOptions::momentum", "LOSS.moco_loss.momentum"},
      {"MocoModelOptions::shuffle_batch", "LOSS.moco_loss.shuffle_batch"},
      {"MocoQueueOptions::embedding_dim", "LOSS.moco_loss.embedding_dim"},
      {"MocoQueueOptions::size", "LOSS.moco_loss.queue_size"},
      {"ModelOptions::head_chain", "MODEL.HEAD.PARAMS"},
      {"ModelOptions::head_channel_bn", "MODEL.HEAD.PARAMS eval_mlp in_channels"},
      {"ModelOptions::head_dims", "MODEL.HEAD.PARAMS dims"},
      {"ModelOptions::trunk_name", "MODEL.TRUNK.NAME"},
      {"NormOptions::fuse_relu", "MODEL.FUSED_KERNELS"},
      {"NormOptions::groupnorm_groups", "MODEL.TRUNK.RESNETS.GROUPNORM_GROUPS"},
      {"NormOptions::type", "MODEL.TRUNK.RESNETS.NORM"},
      {"OptimizerSpec::name", "OPTIMIZER.name"},
      {"OptimizerOptions::head_weight_decay_schedule",
       "OPTIMIZER.param_schedulers.weight_decay_head"},
      {"OptimizerOptions::weight_decay_schedule", "OPTIMIZER.param_schedulers.weight_decay"},
      {"ParallelOptions::data_parallelism = FSDP (ZeRO-3)",
       "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP = True (FSDP, ZeRO-3)"},
      {"ParallelOptions::data_parallelism = ZeRO-1", "OPTIMIZER.use_zero = True (ZeRO-1)"},
      {"ParallelOptions::data_parallelism = ZeRO-2",
       "MODEL.SHARDED_DDP_SETUP.USE_SDP = True (ZeRO-2)"},
      {"ParallelOptions::offload_optimizer",
       "OPTIMIZER.offload_optimizer (ZeRO-1/2) or MODEL.FSDP_CONFIG.offload_optimizer (FSDP)"},
      {"ParallelOptions::pipeline.size", "DISTRIBUTED.PIPELINE_SIZE"},
      {"ParallelOptions::precision", "MODEL.AMP_PARAMS"},
      {"ParallelOptions::sequence_parallel", "DISTRIBUTED.SEQUENCE_PARALLEL"},
      {"ParallelOptions::tensor_parallel_size", "DISTRIBUTED.TENSOR_PARALLEL_SIZE"},
      {"ParamGroup::lr", "OPTIMIZER.param_schedulers.lr"},
      {"ParamGroup::weight_decay", "OPTIMIZER.weight_decay"},
      {"ParamGroupOptions::rule", "OPTIMIZER.param_group_constructor"},
      {"PipelineParallelOptions::balance", "MODEL.PIPELINE.BALANCE"},
      {"PipelineParallelOptions::boundaries", "MODEL.PIPELINE.BOUNDARIES"},
      {"PipelineParallelOptions::checkpoint_stages", "MODEL.PIPELINE.CHECKPOINT_STAGES"},
      {"PipelineParallelOptions::num_microbatches", "MODEL.PIPELINE.NUM_MICROBATCHES"},
      {"PipelineParallelOptions::schedule", "MODEL.PIPELINE.SCHEDULE"},
      {"PipelineParallelOptions::virtual_stages", "MODEL.PIPELINE.VIRTUAL_STAGES"},
      {"PrecisionPolicyOptions::amp_type", "MODEL.AMP_PARAMS.AMP_TYPE"},
      {"PrecisionPolicyOptions::dtype", "MODEL.AMP_PARAMS.DTYPE"},
      {"PrecisionPolicyOptions::loss_scale", "MODEL.AMP_PARAMS.AMP_ARGS.loss_scale"},
      {"PrecisionPolicyOptions::opt_level", "MODEL.AMP_PARAMS.AMP_ARGS.opt_level"},
      {"ProcessGroupOptions::backend", "DISTRIBUTED.BACKEND"},
      {"RegNetOptions::", "MODEL.TRUNK.REGNET."},
      {"RegNetOptions::fuse_relu", "MODEL.FUSED_KERNELS"},
      {"ResNetOptions::depth", "MODEL.TRUNK.RESNETS.DEPTH"},
      {"ResNetOptions::groups", "MODEL.TRUNK.RESNETS.GROUPS"},
      {"ResNetOptions::layer4_stride", "MODEL.TRUNK.RESNETS.LAYER4_STRIDE"},
      {"ResNetOptions::stem", "MODEL.TRUNK.RESNETS.STEM"},
      {"ResNetOptions::width_multiplier", "MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER"},
      {"ResNetOptions::width_per_group", "MODEL.TRUNK.RESNETS.WIDTH_PER_GROUP"},
      {"ResNetSkOptions::depth", "MODEL.TRUNK.RESNETS_SK.DEPTH"},
      {"ResNetSkOptions::sk_ratio", "MODEL.TRUNK.RESNETS_SK.SK_RATIO"},
      {"ResNetSkOptions::width_multiplier", "MODEL.TRUNK.RESNETS_SK.WIDTH_MULTIPLIER"},
      {"RMSpropOptions::alpha", "OPTIMIZER.alpha"},
      {"RMSpropOptions::eps", "OPTIMIZER.eps"},
      {"RMSpropOptions::momentum", "OPTIMIZER.momentum"},
      {"SGDOptions::momentum", "OPTIMIZER.momentum"},
      {"SGDOptions::nesterov", "OPTIMIZER.nesterov"},
      {"ScheduleOptions.", "OPTIMIZER.param_schedulers.lr."},
      {"ScheduleOptions::num_epochs", "OPTIMIZER.num_epochs"},
      {"ShardedDataParallelOptions::find_unused_parameters", "DISTRIBUTED.FIND_UNUSED_PARAMETERS"},
      {"ShardedDataParallelOptions::reduce_buffer_bytes",
       "MODEL.SHARDED_DDP_SETUP.reduce_buffer_size"},
      {"ShardedOptimizerOptions::make_base_optimizer", "OPTIMIZER.base_optimizer"},
      {"SimclrInfoNceOptions::temperature", "LOSS.simclr_info_nce_loss.temperature"},
      {"SmallCnnOptions::channels", "MODEL.TRUNK.SMALL_CNN.CHANNELS"},
      {"SmallCnnOptions::dropout", "MODEL.TRUNK.SMALL_CNN.DROPOUT"},
      {"SmallCnnOptions::pooled_size", "MODEL.TRUNK.SMALL_CNN.POOLED_SIZE"},
      {"SwavHeadOptions::activation", "MODEL.HEAD.PARAMS swav_head activation_name"},
      {"SwavHeadOptions::dims", "MODEL.HEAD.PARAMS swav_head dims"},
      {"SwavHeadOptions::num_clusters", "MODEL.HEAD.PARAMS swav_head num_clusters"},
      {"SwavLossOptions::crops_for_assign", "LOSS.swav_loss.crops_for_assign"},
      {"SwavLossOptions::epsilon", "LOSS.swav_loss.epsilon"},
      {"SwavLossOptions::num_crops", "LOSS.swav_loss.num_crops"},
      {"SwavLossOptions::num_iters", "LOSS.swav_loss.num_iters"},
      {"SwavLossOptions::temperature", "LOSS.swav_loss.temperature"},
      {"SwavQueueOptions::crops_for_assign", "LOSS.swav_loss.crops_for_assign"},
      {"SwavQueueOptions::embedding_dim", "LOSS.swav_loss.embedding_dim"},
      {"SwavQueueOptions::length", "LOSS.swav_loss.queue.queue_length"},
      {"SwavQueueOptions::start_iter", "LOSS.swav_loss.queue.start_iter"},
      {"SyncBatchNorm::group_size", "MODEL.SYNC_BN_CONFIG.GROUP_SIZE"},
      {"TensorParallelPlanOptions::sequence_parallel", "DISTRIBUTED.SEQUENCE_PARALLEL"},
      {"TrainerOptions::channels_last", "MODEL.CHANNELS_LAST"},
      {"TrainerOptions::cuda_graph", "MACHINE.CUDA_GRAPH"},
      {"TrainerOptions::sync_every_step", "MACHINE.SYNC_EVERY_STEP"},
      {"VitOptions::attention_dropout", "MODEL.TRUNK.VISION_TRANSFORMERS.ATTENTION_DROPOUT_RATE"},
      {"VitOptions::classifier", "MODEL.TRUNK.VISION_TRANSFORMERS.CLASSIFIER"},
      {"VitOptions::drop_path_rate", "MODEL.TRUNK.VISION_TRANSFORMERS.DROP_PATH_RATE"},
      {"VitOptions::dropout", "MODEL.TRUNK.VISION_TRANSFORMERS.DROPOUT_RATE"},
      {"VitOptions::fused_kernels", "MODEL.FUSED_KERNELS"},
      {"TrainerOptions::attention_backend", "MACHINE.ATTENTION_BACKEND"},
      {"VitOptions::hidden_dim", "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM"},
      {"VitOptions::image_size", "MODEL.TRUNK.VISION_TRANSFORMERS.IMAGE_SIZE"},
      {"VitOptions::mlp_dim", "MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM"},
      {"VitOptions::num_heads", "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS"},
      {"VitOptions::num_layers", "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS"},
      {"VitOptions::patch_size", "MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE"},
      {"VitOptions::use_class_token", "MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN"},
      {"WebDatasetSamplerOptions::batch_size", "DATA.TRAIN.BATCHSIZE_PER_REPLICA"},
      {"WebDatasetSamplerOptions::shuffle_buffer", "DATA.TRAIN.WEBDATASET.SHUFFLE_BUFFER"},
      {"WebDatasetSamplerOptions::streams_per_replica", "DATA.NUM_DATALOADER_WORKERS"},
      {"WrapPolicy::min_trainable_parameters", "MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD"},
      {"a new run that loads only the checkpoint's weights",
       "a new run (another CHECKPOINT.DIR) with MODEL.WEIGHTS_INIT.PARAMS_FILE set to the "
       "checkpoint"},
      {"clip_grad_norm's max_norm", "MODEL.GRAD_CLIP.MAX_NORM"},
      {"clip_grad_norm's norm_type", "MODEL.GRAD_CLIP.NORM_TYPE"},
      {"the batch size per replica and the number of nodes and processes per node",
       "DATA.TRAIN.BATCHSIZE_PER_REPLICA and DISTRIBUTED.NUM_NODES / NUM_PROC_PER_NODE"},
      {"the parameter groups' options (ParamGroupOptions)",
       "the OPTIMIZER.regularize_* / head settings"},
  };
  return keys;
}

} // namespace

std::string yaml_key_for(const std::string& option) {
  auto found = option_keys().find(option);
  // Not a table entry itself: a field under an entry's prefix ("RegNetOptions::w_0"), an
  // indexed one ("FeatureEvalOptions::heads[1].dims"), or the option's own name.
  return found != option_keys().end() ? found->second : with_yaml_keys(option);
}

std::string with_yaml_keys(std::string text) {
  // Longest names first, so that an option is not taken for a prefix of a longer one.
  std::vector<std::pair<std::string, std::string>> names(
      option_keys().begin(), option_keys().end());
  std::sort(names.begin(), names.end(), [](const auto& a, const auto& b) {
    return a.first.size() > b.first.size();
  });
  for (const auto& [option, key] : names) {
    for (size_t at = text.find(option); at != std::string::npos;
         at = text.find(option, at + key.size())) {
      text.replace(at, option.size(), key);
    }
  }
  return text;
}

namespace {

// `error` (of class E, caught as `caught`) again, its message in YAML keys.
template <typename E>
[[noreturn]] void rethrow_translated(const E& caught, std::exception_ptr error) {
  std::string text = with_yaml_keys(caught.what());
  if (text == caught.what()) {
    std::rethrow_exception(error); // nothing to translate: the very object, whatever its class
  }
  throw E(text);
}

} // namespace

void rethrow_in_yaml_keys(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const OptionError& option) {
    const bool library_option = option.option().find("::") != std::string::npos;
    if (library_option && yaml_key_for(option.option()) == option.option()) {
      std::rethrow_exception(error); // no key sets it: a library user's option, as it was
    }
    throw ConfigError(
        "config key " + yaml_key_for(option.option()) + " = " + option.value() + ": expected " +
        with_yaml_keys(option.expected()));
  } catch (const ConfigError& caught) {
    rethrow_translated(caught, error);
  } catch (const DataError& caught) {
    rethrow_translated(caught, error);
  } catch (const CheckpointError& caught) {
    rethrow_translated(caught, error);
  } catch (const CommError& caught) {
    rethrow_translated(caught, error);
  } catch (const WorkerError& caught) {
    rethrow_translated(caught, error);
  } catch (const ResourceError& caught) {
    rethrow_translated(caught, error);
  } catch (const TrainingError& caught) {
    rethrow_translated(caught, error);
  } catch (const Error& caught) {
    rethrow_translated(caught, error);
  }
}

} // namespace largo::train
