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
      {"FullyShardedDataParallelOptions::compute_dtype", "MODEL.FSDP_CONFIG.compute_dtype"},
      {"FullyShardedDataParallelOptions::fp32_reduce_scatter",
       "MODEL.FSDP_CONFIG.fp32_reduce_scatter"},
      {"GradScalerOptions::backoff_factor", "MODEL.AMP_PARAMS.GRAD_SCALER.BACKOFF_FACTOR"},
      {"GradScalerOptions::growth_factor", "MODEL.AMP_PARAMS.GRAD_SCALER.GROWTH_FACTOR"},
      {"GradScalerOptions::growth_interval", "MODEL.AMP_PARAMS.GRAD_SCALER.GROWTH_INTERVAL"},
      {"GradScalerOptions::hysteresis", "MODEL.AMP_PARAMS.GRAD_SCALER.HYSTERESIS"},
      {"GradScalerOptions::init_scale", "MODEL.AMP_PARAMS.GRAD_SCALER.INIT_SCALE"},
      {"GradScalerOptions::max_loss_scale", "MODEL.AMP_PARAMS.AMP_ARGS.max_loss_scale"},
      {"GradScalerOptions::min_loss_scale", "MODEL.AMP_PARAMS.GRAD_SCALER.MIN_LOSS_SCALE"},
      {"ParallelOptions::data_parallelism = FSDP (ZeRO-3)",
       "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP = True (FSDP, ZeRO-3)"},
      {"ParallelOptions::data_parallelism = ZeRO-2",
       "MODEL.SHARDED_DDP_SETUP.USE_SDP = True (ZeRO-2)"},
      {"ParallelOptions::data_parallelism = ZeRO-1", "OPTIMIZER.use_zero = True (ZeRO-1)"},
      {"ParallelOptions::offload_optimizer",
       "OPTIMIZER.offload_optimizer (ZeRO-1/2) or MODEL.FSDP_CONFIG.offload_optimizer (FSDP)"},
      {"ParallelOptions::pipeline.size", "DISTRIBUTED.PIPELINE_SIZE"},
      {"ParallelOptions::precision", "MODEL.AMP_PARAMS"},
      {"ParallelOptions::sequence_parallel", "DISTRIBUTED.SEQUENCE_PARALLEL"},
      {"ParallelOptions::tensor_parallel_size", "DISTRIBUTED.TENSOR_PARALLEL_SIZE"},
      {"PipelineParallelOptions::balance", "MODEL.PIPELINE.BALANCE"},
      {"PipelineParallelOptions::checkpoint_stages", "MODEL.PIPELINE.CHECKPOINT_STAGES"},
      {"PipelineParallelOptions::schedule", "MODEL.PIPELINE.SCHEDULE"},
      {"PrecisionPolicyOptions::dtype", "MODEL.AMP_PARAMS.DTYPE"},
      {"ProcessGroupOptions::backend", "DISTRIBUTED.BACKEND"},
      {"TensorParallelPlanOptions::sequence_parallel", "DISTRIBUTED.SEQUENCE_PARALLEL"},
      {"WebDatasetSamplerOptions::batch_size", "DATA.TRAIN.BATCHSIZE_PER_REPLICA"},
      {"WebDatasetSamplerOptions::shuffle_buffer", "DATA.TRAIN.WEBDATASET.SHUFFLE_BUFFER"},
      {"WebDatasetSamplerOptions::streams_per_replica", "DATA.NUM_DATALOADER_WORKERS"},
      {"WrapPolicy::min_trainable_parameters", "MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD"},
  };
  return keys;
}

} // namespace

std::string yaml_key_for(const std::string& option) {
  auto found = option_keys().find(option);
  return found != option_keys().end() ? found->second : option;
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

} // namespace largo::train
