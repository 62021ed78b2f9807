#include "pipeline_estimate.h"

#include <largo/core/error.h>
#include <largo/core/memory_tracker.h>
#include <largo/parallel/parallelize.h>
#include <largo/precision/autocast.h>

#include <torch/torch.h>

#include <algorithm>
#include <memory>

namespace largo::app {
namespace {

// A micro-batch of zeros shaped like the training samples.
at::Tensor zeros_batch(const train::RunPlan& plan, int64_t rows) {
  std::vector<int64_t> shape = plan.model_data().sample_shape;
  shape.insert(shape.begin(), rows);
  return at::zeros(shape);
}

// The trainer's cut (the same function, timed on the trainer's sample).
std::vector<int64_t> cut_as_the_trainer(
    const train::RunPlan& plan,
    const std::vector<parallel::PipelineBlock>& blocks,
    int num_stages) {
  const parallel::PipelineParallelOptions& options = plan.parallel.pipeline.stages;
  return parallel::cut_into_stages(
      blocks, num_stages, options.boundaries(), options.balance(), [&] {
        return parallel::measure_block_seconds(
            blocks, at::zeros(train::pipeline_timing_sample_shape(plan)));
      });
}

// The parameters of `stages`' blocks, picked from `sizes` by their full-model names.
std::vector<parallel::ParameterSize> stage_parameters(
    const std::vector<parallel::ParameterSize>& sizes,
    const std::vector<parallel::PipelineBlock>& blocks,
    const std::vector<int64_t>& boundaries,
    const std::vector<int>& stages) {
  std::vector<std::string> prefixes;
  for (const int stage : stages) {
    for (int64_t b = boundaries[stage]; b < boundaries[stage + 1]; ++b) {
      prefixes.push_back(blocks[static_cast<size_t>(b)].name + ".");
    }
  }
  std::vector<parallel::ParameterSize> picked;
  for (const auto& size : sizes) {
    const bool in_stage = std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) {
      return size.name.compare(0, p.size(), p) == 0;
    });
    if (in_stage) {
      picked.push_back(size);
    }
  }
  return picked;
}

// Bytes of each stage's input for one micro-batch (what a checkpointed stage keeps).
std::vector<int64_t> stage_input_bytes(
    const std::vector<parallel::PipelineBlock>& blocks,
    const std::vector<int64_t>& boundaries,
    at::Tensor input) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> bytes;
  for (size_t stage = 0; stage + 1 < boundaries.size(); ++stage) {
    bytes.push_back(static_cast<int64_t>(input.nbytes()));
    parallel::PipelineStage module(std::vector<parallel::PipelineBlock>(
        blocks.begin() + boundaries[stage], blocks.begin() + boundaries[stage + 1]));
    input = module->forward(input);
  }
  return bytes;
}

// The trainer runs O1 / AMP pytorch forwards under autocast; on the CPU only bfloat16 can be
// (precision/autocast.h), so a float16 run is measured in float32, an upper bound.
std::unique_ptr<precision::AutocastGuard>
autocast_like_the_trainer(const train::RunPlan& plan, std::string& note) {
  if (!plan.precision.autocast) {
    note = "float32";
    return nullptr;
  }
  if (plan.precision.low_precision != at::kBFloat16) {
    note = "in float32: float16 autocast does not run on the CPU, so an upper bound";
    return nullptr;
  }
  note = "under bfloat16 autocast, as the trainer runs";
  return std::make_unique<precision::AutocastGuard>(c10::DeviceType::CPU, at::kBFloat16);
}

// Measured activations, and with checkpointed stages their inputs, per rank.
void add_activations(
    const train::RunPlan& plan,
    const std::vector<parallel::PipelineBlock>& blocks,
    PipelineEstimate& estimate) {
  const parallel::PipelineParallelOptions& options = plan.parallel.pipeline.stages;
  const at::Tensor sample = zeros_batch(plan, estimate.microbatch_rows);
  const auto guard = autocast_like_the_trainer(plan, estimate.autocast_note);
  const auto measured = parallel::estimate_pipeline_memory(
      blocks, estimate.boundaries, options.schedule(), estimate.shape, sample);
  const auto inputs = options.checkpoint_stages()
                          ? stage_input_bytes(blocks, estimate.boundaries, sample)
                          : std::vector<int64_t>();
  for (auto& rank : estimate.ranks) {
    const parallel::PipelineRankMemory& memory = measured[static_cast<size_t>(rank.rank)];
    TORCH_INTERNAL_ASSERT(
        memory.stages == rank.stages && memory.parameter_count == rank.parameter_count,
        "pipeline_memory.h and the estimate disagree on rank ",
        rank.rank,
        "'s stages");
    rank.activations = memory;
    rank.peak_activation_bytes = memory.peak_activation_bytes;
    if (options.checkpoint_stages()) {
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

PipelineEstimate estimate_pipeline(
    const train::RunPlan& plan,
    models::TrunkHeadModelImpl& model,
    const std::vector<parallel::ParameterSize>& sizes,
    parallel::MemoryEstimateOptions state_options) {
  const parallel::PipelineOptions& pipeline = plan.parallel.pipeline;
  const parallel::PipelineParallelOptions& options = pipeline.stages;
  // The schedule's shape and its options were checked when the run was resolved
  // (train/pipeline_plan.h).
  PipelineEstimate estimate;
  estimate.shape = {pipeline.size, options.num_microbatches(), options.virtual_stages()};
  estimate.num_replicas =
      parallel::data_shard(0, parallel::mesh_dimensions(plan.parallel, plan.world.world_size))
          .count;
  const int64_t microbatches = options.num_microbatches();
  estimate.microbatch_rows = (plan.batch_per_rank + microbatches - 1) / microbatches;

  const std::vector<parallel::PipelineBlock> blocks = parallel::pipeline_blocks(model);
  for (const auto& block : blocks) {
    estimate.block_names.push_back(block.name);
  }
  estimate.boundaries = cut_as_the_trainer(plan, blocks, estimate.shape.num_stages());

  // Every stage's replicas run DDP, or ZeRO-1 over them: stage 0 or 1 of the ZeRO accounting
  // over the rank's own parameters, sharded over the replicas.
  state_options.world_size = estimate.num_replicas;
  state_options.stage = parallel::zero_stage(plan.parallel.data_parallelism);
  state_options.rank = 0;
  for (int rank = 0; rank < estimate.shape.num_ranks; ++rank) {
    PipelineRankEstimate entry;
    entry.rank = rank;
    for (int v = 0; v < estimate.shape.virtual_stages; ++v) {
      entry.stages.push_back(v * estimate.shape.num_ranks + rank); // rank_of_stage's inverse
    }
    const auto own = stage_parameters(sizes, blocks, estimate.boundaries, entry.stages);
    for (const auto& size : own) {
      entry.parameter_count += size.numel;
    }
    entry.state = parallel::estimate_model_state_bytes(own, state_options);
    estimate.ranks.push_back(std::move(entry));
  }
  if (MemoryTracker::supported(torch::Device(torch::kCPU))) {
    add_activations(plan, blocks, estimate);
  }
  return estimate;
}

} // namespace largo::app
