#include "pipeline_plan.h"

#include <largo/core/error.h>
#include <largo/parallel/parallelize.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace largo::train {
namespace {

const char* kSizeKey = "DISTRIBUTED.PIPELINE_SIZE";

// MODEL.PIPELINE's keys that differ from their defaults.
std::vector<std::string> changed_stage_keys(const parallel::PipelineParallelOptions& stages) {
  const parallel::PipelineParallelOptions defaults;
  std::vector<std::string> changed;
  auto note = [&](bool differs, const char* key) {
    if (differs) {
      changed.push_back(std::string("MODEL.PIPELINE.") + key);
    }
  };
  note(stages.schedule() != defaults.schedule(), "SCHEDULE");
  note(stages.num_microbatches() != defaults.num_microbatches(), "NUM_MICROBATCHES");
  note(stages.virtual_stages() != defaults.virtual_stages(), "VIRTUAL_STAGES");
  note(!stages.boundaries().empty(), "BOUNDARIES");
  note(stages.balance() != defaults.balance(), "BALANCE");
  note(stages.checkpoint_stages() != defaults.checkpoint_stages(), "CHECKPOINT_STAGES");
  return changed;
}

// What else the run switches on that a pipeline does not compose with: the key and why. The
// trainer's own features only; the library's modes, precision and checkpointing are checked
// by parallel::check_parallel_options (resolve_run).
std::vector<std::pair<std::string, std::string>> conflicts(const RunPlan& plan) {
  const TrainerOptions& o = plan.options;
  std::vector<std::pair<std::string, std::string>> found;
  if (o.sync_batch_norm.convert) {
    found.emplace_back(
        "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN",
        "a pipeline normalises each micro-batch on its own (docs/pipeline.md)");
  }
  if (o.model_ema.enabled()) {
    found.emplace_back("HOOKS.EMA_MODEL", "the average of a model cut into stages is not built");
  }
  if (plan.model.feature_eval.enabled()) {
    found.emplace_back(
        "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON",
        "a linear evaluation trains heads only; it needs no pipeline");
  }
  return found;
}

// The schedule's shape and the boundaries' count (their end, the model's block count, is
// checked when the model is cut). The stage recomputation a schedule allows is the library's
// rule (parallel::check_pipeline_parallel_options, through check_parallel_options).
void check_schedule(const parallel::PipelineOptions& pipeline) {
  const parallel::PipelineParallelOptions& stages = pipeline.stages;
  try {
    parallel::check_pipeline_shape(
        stages.schedule(),
        parallel::PipelineShape{pipeline.size, stages.num_microbatches(), stages.virtual_stages()});
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("MODEL.PIPELINE: {}", e.what()));
  }
  const std::vector<int64_t>& boundaries = stages.boundaries();
  const size_t expected = static_cast<size_t>(pipeline.size * stages.virtual_stages()) + 1;
  bool increasing = true;
  for (size_t i = 1; i < boundaries.size(); ++i) {
    increasing = increasing && boundaries[i] > boundaries[i - 1];
  }
  if (!boundaries.empty() &&
      (boundaries.size() != expected || boundaries.front() != 0 || !increasing)) {
    throw ConfigError(fmt::format(
        "MODEL.PIPELINE.BOUNDARIES = [{}]: expected {} strictly increasing block indices from "
        "0 to the model's number of blocks (PIPELINE_SIZE x VIRTUAL_STAGES + 1), or [] to "
        "balance the stages",
        fmt::join(boundaries, ", "),
        expected));
  }
}

} // namespace

void check_pipeline_keys(const RunPlan& plan) {
  const parallel::PipelineOptions& pipeline = plan.options.parallel.pipeline;
  if (!pipeline.enabled()) {
    const auto changed = changed_stage_keys(pipeline.stages);
    if (!changed.empty()) {
      throw ConfigError(fmt::format(
          "{} is set, but {} is 1, so there is no pipeline for it to change: set {} > 1 or "
          "leave MODEL.PIPELINE at its defaults",
          fmt::join(changed, ", "),
          kSizeKey,
          kSizeKey));
    }
    return;
  }
  check_schedule(pipeline);
  for (const auto& [key, why] : conflicts(plan)) {
    throw ConfigError(fmt::format(
        "{} = {} (a pipeline) with {}: not available, {}", kSizeKey, pipeline.size, key, why));
  }
  const int microbatches = pipeline.stages.num_microbatches();
  if (plan.options.train.batch_size < microbatches) {
    throw ConfigError(fmt::format(
        "DATA.TRAIN.BATCHSIZE_PER_REPLICA = {} cannot be split into MODEL.PIPELINE."
        "NUM_MICROBATCHES = {} micro-batches: use a batch of at least {} or fewer micro-batches",
        plan.options.train.batch_size,
        microbatches,
        microbatches));
  }
}

std::vector<int64_t> pipeline_timing_sample_shape(const RunPlan& plan) {
  const int64_t microbatches = plan.parallel.pipeline.stages.num_microbatches();
  std::vector<int64_t> shape = plan.model_data().sample_shape;
  shape.insert(shape.begin(), std::max<int64_t>(plan.batch_per_rank / microbatches, 1));
  return shape;
}

int data_replicas(const RunPlan& plan) {
  // Any rank's shard count: ranks differ in their shard, not in how many there are.
  return parallel::data_shard(0, parallel::mesh_dimensions(plan.parallel, plan.world.world_size))
      .count;
}

} // namespace largo::train
