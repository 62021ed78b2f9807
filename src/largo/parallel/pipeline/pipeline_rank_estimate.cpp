#include <largo/parallel/pipeline/pipeline_rank_estimate.h>

#include <largo/core/memory_tracker.h>
#include <largo/precision/autocast.h>

#include <torch/torch.h>

#include <algorithm>
#include <memory>

namespace largo::parallel {
namespace {

// `rows` samples of zeros shaped like the training samples.
at::Tensor zeros_batch(const PipelineEstimateOptions& options, int64_t rows) {
  std::vector<int64_t> shape = options.sample_shape;
  shape.insert(shape.begin(), rows);
  return at::zeros(shape);
}

bool starts_with(const std::string& name, const std::string& prefix) {
  return name.compare(0, prefix.size(), prefix) == 0;
}

// The elements each block holds, summed from `sizes` by the blocks' full-model names: what
// block_parameter_counts gives on the blocks the trainer cuts (with tensor parallelism the
// split ones, whose shards `sizes` are, while `blocks` here are unsplit).
std::vector<double> held_parameter_counts(
    const std::vector<PipelineBlock>& blocks, const std::vector<ParameterSize>& sizes) {
  std::vector<double> counts;
  for (const auto& block : blocks) {
    int64_t count = 0;
    for (const auto& size : sizes) {
      count += starts_with(size.name, block.name + ".") ? size.numel : 0;
    }
    counts.push_back(static_cast<double>(count));
  }
  return counts;
}

// The trainer's cut (the same functions; balanced by the parameters the trainer's blocks
// hold, or timed on a micro-batch of the trainer's timing sample: batch / M rows, at least
// one).
std::vector<int64_t> cut_as_the_trainer(
    const std::vector<PipelineBlock>& blocks,
    const std::vector<ParameterSize>& sizes,
    const PipelineEstimateOptions& options,
    int num_stages) {
  const PipelineParallelOptions& stages = options.stages;
  if (stages.boundaries().empty() && stages.balance() == StageBalance::kParameters) {
    return balanced_stage_boundaries(held_parameter_counts(blocks, sizes), num_stages);
  }
  const int64_t timing_rows =
      std::max<int64_t>(options.batch_per_replica / stages.num_microbatches(), 1);
  return cut_into_stages(blocks, num_stages, stages.boundaries(), stages.balance(), [&] {
    return measure_block_seconds(blocks, zeros_batch(options, timing_rows));
  });
}

// The parameters of `stages`' blocks, picked from `sizes` by their full-model names.
std::vector<ParameterSize> stage_parameters(
    const std::vector<ParameterSize>& sizes,
    const std::vector<PipelineBlock>& blocks,
    const std::vector<int64_t>& boundaries,
    const std::vector<int>& stages) {
  std::vector<std::string> prefixes;
  for (const int stage : stages) {
    for (int64_t b = boundaries[stage]; b < boundaries[stage + 1]; ++b) {
      prefixes.push_back(blocks[static_cast<size_t>(b)].name + ".");
    }
  }
  std::vector<ParameterSize> picked;
  for (const auto& size : sizes) {
    const bool in_stage = std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) {
      return starts_with(size.name, p);
    });
    if (in_stage) {
      picked.push_back(size);
    }
  }
  return picked;
}

// Bytes of each stage's input for one micro-batch (what a checkpointed stage keeps).
std::vector<int64_t> stage_input_bytes(
    const std::vector<PipelineBlock>& blocks,
    const std::vector<int64_t>& boundaries,
    at::Tensor input) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> bytes;
  for (size_t stage = 0; stage + 1 < boundaries.size(); ++stage) {
    bytes.push_back(static_cast<int64_t>(input.nbytes()));
    PipelineStage module(std::vector<PipelineBlock>(
        blocks.begin() + boundaries[stage], blocks.begin() + boundaries[stage + 1]));
    input = module->forward(input);
  }
  return bytes;
}

// The trainer runs O1 / AMP pytorch forwards under autocast; on the CPU only bfloat16 can be
// (precision/autocast.h), so a float16 run is measured in float32, an upper bound.
std::unique_ptr<precision::AutocastGuard>
autocast_like_the_trainer(const precision::PrecisionPolicy& policy, std::string& note) {
  if (!policy.autocast) {
    note = "float32";
    return nullptr;
  }
  if (policy.low_precision != at::kBFloat16) {
    note = "in float32: float16 autocast does not run on the CPU, so an upper bound";
    return nullptr;
  }
  note = "under bfloat16 autocast, as the trainer runs";
  return std::make_unique<precision::AutocastGuard>(c10::DeviceType::CPU, at::kBFloat16);
}

// Measured activations, and with checkpointed stages their inputs, per rank.
void add_activations(
    const std::vector<PipelineBlock>& blocks,
    const PipelineEstimateOptions& options,
    PipelineEstimate& estimate) {
  const PipelineParallelOptions& stages = options.stages;
  const at::Tensor sample = zeros_batch(options, estimate.microbatch_rows);
  const auto guard = autocast_like_the_trainer(options.precision, estimate.autocast_note);
  const auto measured = estimate_pipeline_memory(
      blocks, estimate.boundaries, stages.schedule(), estimate.shape, sample);
  const auto inputs = stages.checkpoint_stages()
                          ? stage_input_bytes(blocks, estimate.boundaries, sample)
                          : std::vector<int64_t>();
  for (auto& rank : estimate.ranks) {
    const PipelineRankMemory& memory = measured[static_cast<size_t>(rank.rank)];
    TORCH_INTERNAL_ASSERT(
        memory.stages == rank.stages && memory.parameter_count == rank.parameter_count,
        "pipeline_memory.h and the estimate disagree on rank ",
        rank.rank,
        "'s stages");
    rank.activations = memory;
    rank.peak_activation_bytes = memory.peak_activation_bytes;
    if (stages.checkpoint_stages()) {
      for (const int stage : rank.stages) {
        rank.stage_input_bytes =
            std::max(rank.stage_input_bytes, inputs[static_cast<size_t>(stage)]);
      }
      rank.peak_activation_bytes = memory.peak_stages_in_flight * rank.stage_input_bytes +
                                   memory.activation_bytes_per_microbatch;
    }
  }
}

} // namespace

PipelineEstimate estimate_pipeline_ranks(
    const std::vector<PipelineBlock>& blocks,
    const std::vector<ParameterSize>& sizes,
    const PipelineEstimateOptions& options) {
  const PipelineParallelOptions& stages = options.stages;
  PipelineEstimate estimate;
  estimate.shape = {options.pipeline_size, stages.num_microbatches(), stages.virtual_stages()};
  estimate.num_replicas = options.num_replicas;
  const int64_t microbatches = stages.num_microbatches();
  estimate.microbatch_rows = (options.batch_per_replica + microbatches - 1) / microbatches;
  for (const auto& block : blocks) {
    estimate.block_names.push_back(block.name);
  }
  estimate.boundaries = cut_as_the_trainer(blocks, sizes, options, estimate.shape.num_stages());

  // Every stage's replicas run DDP, or ZeRO-1 over them: stage 0 or 1 of the ZeRO accounting
  // over the rank's own parameters, sharded over the replicas.
  MemoryEstimateOptions state_options = options.state;
  state_options.world_size = estimate.num_replicas;
  state_options.stage = options.zero_stage;
  state_options.rank = 0;
  for (int rank = 0; rank < estimate.shape.num_ranks; ++rank) {
    PipelineRankEstimate entry;
    entry.rank = rank;
    entry.stages = estimate.shape.stages_of_rank(rank);
    const auto own = stage_parameters(sizes, blocks, estimate.boundaries, entry.stages);
    for (const auto& size : own) {
      entry.parameter_count += size.numel;
    }
    entry.state = estimate_model_state_bytes(own, state_options);
    estimate.ranks.push_back(std::move(entry));
  }
  if (options.tensor_parallel_size > 1) {
    estimate.activations_not_measured =
        "tensor parallelism splits the blocks, and a split block runs only with its "
        "tensor-parallel process group; the unsplit blocks' activations are not a shard's";
  } else if (!MemoryTracker::supported(torch::Device(torch::kCPU))) {
    estimate.activations_not_measured = "this build cannot measure CPU memory";
  } else {
    add_activations(blocks, options, estimate);
  }
  return estimate;
}

} // namespace largo::parallel
