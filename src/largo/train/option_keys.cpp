#include <largo/train/option_keys.h>

#include <map>

namespace largo::train {

std::string yaml_key_for(const std::string& option) {
  static const std::map<std::string, std::string> keys = {
      {"ActivationCheckpointingOptions::num_splits",
       "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS"},
      {"FullyShardedDataParallelOptions::compute_dtype", "MODEL.FSDP_CONFIG.compute_dtype"},
      {"FullyShardedDataParallelOptions::fp32_reduce_scatter",
       "MODEL.FSDP_CONFIG.fp32_reduce_scatter"},
      {"PipelineParallelOptions::balance", "MODEL.PIPELINE.BALANCE"},
      {"PipelineParallelOptions::checkpoint_stages", "MODEL.PIPELINE.CHECKPOINT_STAGES"},
      {"WrapPolicy::min_trainable_parameters", "MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD"},
      {"ParallelOptions::precision", "MODEL.AMP_PARAMS"},
      {"ParallelOptions::pipeline.size", "DISTRIBUTED.PIPELINE_SIZE"},
      {"ParallelOptions::tensor_parallel_size", "DISTRIBUTED.TENSOR_PARALLEL_SIZE"},
      {"ProcessGroupOptions::backend", "DISTRIBUTED.BACKEND"},
  };
  auto found = keys.find(option);
  return found != keys.end() ? found->second : option;
}

} // namespace largo::train
