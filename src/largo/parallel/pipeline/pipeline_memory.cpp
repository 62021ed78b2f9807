#include <largo/parallel/pipeline/pipeline_memory.h>

#include <largo/core/memory_tracker.h>
#include <largo/parallel/pipeline/pipeline_simulation.h>

#include <torch/torch.h>

#include <algorithm>

namespace largo::parallel {

namespace {

// Bytes a stage's forward leaves alive (saved for backward, and its output) on `input`.
int64_t
stage_activation_bytes(PipelineStage& stage, const at::Tensor& input, MemoryTracker& memory) {
  at::Tensor x = input.detach().requires_grad_(input.is_floating_point());
  memory.start_window();
  at::Tensor output = stage->forward(x);
  const int64_t bytes = memory.window_current_bytes();
  return bytes;
}

} // namespace

std::vector<PipelineRankMemory> estimate_pipeline_memory(
    const std::vector<PipelineBlock>& blocks,
    const std::vector<int64_t>& boundaries,
    PipelineScheduleKind kind,
    const PipelineShape& shape,
    const at::Tensor& sample) {
  check_pipeline_shape(kind, shape);
  check_stage_boundaries(boundaries, static_cast<int64_t>(blocks.size()), shape.num_stages());
  MemoryTracker memory(torch::kCPU);
  std::vector<int64_t> activation_bytes;
  std::vector<int64_t> parameter_counts;
  at::Tensor input = sample;
  for (int stage = 0; stage < shape.num_stages(); ++stage) {
    PipelineStage module(std::vector<PipelineBlock>(
        blocks.begin() + boundaries[stage], blocks.begin() + boundaries[stage + 1]));
    activation_bytes.push_back(stage_activation_bytes(module, input, memory));
    int64_t count = 0;
    for (const auto& parameter : module->parameters()) {
      count += parameter.numel();
    }
    parameter_counts.push_back(count);
    torch::NoGradGuard no_grad;
    input = module->forward(input); // the next stage's sample
  }
  const auto simulation = simulate_schedule(pipeline_schedule(kind, shape), shape);
  std::vector<PipelineRankMemory> ranks;
  for (int rank = 0; rank < shape.num_ranks; ++rank) {
    PipelineRankMemory entry;
    entry.rank = rank;
    entry.stages = shape.stages_of_rank(rank);
    for (const int stage : entry.stages) {
      entry.parameter_count += parameter_counts[static_cast<size_t>(stage)];
      entry.activation_bytes_per_microbatch = std::max(
          entry.activation_bytes_per_microbatch, activation_bytes[static_cast<size_t>(stage)]);
    }
    entry.peak_stages_in_flight = simulation.peak_in_flight[static_cast<size_t>(rank)];
    entry.peak_activation_bytes =
        entry.activation_bytes_per_microbatch * entry.peak_stages_in_flight;
    ranks.push_back(entry);
  }
  return ranks;
}

} // namespace largo::parallel
