#include "estimate_command.h"

#include "pipeline_estimate.h"

#include <largo/core/byte_format.h>
#include <largo/core/error.h>
#include <largo/models/model_factory.h>
#include <largo/optim/param_groups.h>
#include <largo/parallel/fully_sharded_data_parallel.h>
#include <largo/parallel/memory_estimate.h>
#include <largo/train/run_plan.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

namespace largo::app {
namespace {

// What the precision policy makes of the parameters: Apex O2 keeps low-precision
// parameters with float32 master weights in the optimizer, O3 low-precision parameters only;
// O1 and PyTorch AMP keep float32 parameters (they cast per op, which is activation memory).
struct Precision {
  at::ScalarType parameter_dtype = at::kFloat;
  std::optional<at::ScalarType> master_weights_dtype;
  std::string description = "float32 parameters";
};

Precision precision_of(const precision::PrecisionPolicy& policy) {
  Precision precision;
  if (!policy.cast_model) {
    return precision;
  }
  precision.parameter_dtype = policy.low_precision;
  const std::string name = policy.low_precision == at::kBFloat16 ? "bfloat16" : "float16";
  if (policy.master_weights) {
    precision.master_weights_dtype = at::kFloat;
    precision.description = name + " parameters, float32 master weights (Apex O2)";
  } else {
    precision.description = name + " parameters (Apex O3)";
  }
  return precision;
}

// 25557032 -> "25,557,032"
std::string with_commas(int64_t value) {
  const std::string digits = std::to_string(value);
  std::string text;
  for (size_t i = 0; i < digits.size(); ++i) {
    const size_t left = digits.size() - i; // digits from here to the end
    if (i > 0 && digits[i - 1] != '-' && left % 3 == 0) {
      text.push_back(',');
    }
    text.push_back(digits[i]);
  }
  return text;
}

std::string describe_optimizer(const optim::OptimizerSpec& spec) {
  std::string text = spec.name;
  if (spec.name == "sgd") {
    text += spec.sgd.momentum != 0.0 ? fmt::format(" (momentum {})", spec.sgd.momentum) : " (no momentum)";
  } else if (spec.name == "adamw" && spec.adamw.amsgrad) {
    text += " (amsgrad)";
  }
  return spec.use_larc ? text + " with LARC" : text;
}

// Stage 3 holds more than its shards during a step: the units it gathers, in the
// parameters' dtype or as compute copies (the BatchNorm parameters then a float32 unit).
void print_fsdp_units(const train::RunPlan& plan, const models::RunModel& run_model) {
  const parallel::FullyShardedDataParallelOptions& fsdp_options = plan.parallel.fsdp;
  int64_t kept_bytes = 0, largest_bytes = 0, num_block_units = 0;
  std::string largest_name = "none";
  std::string kept_names; // "root", or "root and float32"
  for (const auto& unit : parallel::plan_fsdp_units(run_model.model.ptr(), fsdp_options)) {
    const int64_t bytes = unit.numel * static_cast<int64_t>(c10::elementSize(unit.gathered_dtype));
    if (unit.position < 0) {
      kept_bytes += bytes;
      kept_names += (kept_names.empty() ? "" : " and ") + unit.name;
      continue;
    }
    ++num_block_units;
    if (bytes > largest_bytes) {
      largest_bytes = bytes;
      largest_name = unit.name;
    }
  }
  const std::string copies = fsdp_options.compute_dtype
      ? fmt::format(", as {} compute copies", c10::toString(*fsdp_options.compute_dtype))
      : std::string();
  std::printf("\nstage 3 also gathers during a step (transient, per rank): the %s unit%s "
              "(%s) throughout, plus one block unit at a time, two with prefetch; %lld block "
              "units with AUTO_WRAP_THRESHOLD %lld, the largest %s (%s)%s\n",
              kept_names.empty() ? "no kept" : kept_names.c_str(),
              kept_names.find(" and ") != std::string::npos ? "s" : "",
              format_bytes(kept_bytes).c_str(),
              static_cast<long long>(num_block_units),
              static_cast<long long>(plan.options.fsdp.auto_wrap_threshold), largest_name.c_str(),
              format_bytes(largest_bytes).c_str(), copies.c_str());
}

// The ZeRO 0-3 table at the configured world size, the configured stage marked, and what
// stage 3 gathers during a step.
void print_zero_table(const Config& config, const train::RunPlan& plan,
                      const models::RunModel& run_model,
                      const std::vector<parallel::ParameterSize>& sizes,
                      parallel::MemoryEstimateOptions estimate) {
  const int stage = parallel::zero_stage(plan.parallel.data_parallelism);
  std::printf("per-rank model state of rank 0 (the largest); activations and communication "
              "buffers not included\n\n");
  const std::array<const char*, 4> stage_names{
      "0 DDP", "1 ZeRO-1 (optimizer state)", "2 ZeRO-2 (+ gradients)",
      "3 ZeRO-3 (+ parameters; FSDP)"};
  std::printf("  %-46s %12s %12s %16s %12s %14s\n", "stage", "parameters", "gradients",
              "optimizer state", "total", "ZeRO formula");
  for (int s = 0; s <= 3; ++s) {
    estimate.stage = s;
    const auto bytes = parallel::estimate_model_state_bytes(sizes, estimate);
    const auto formula = parallel::zero_formula_bytes(sizes, estimate);
    std::printf("%c %-46s %12s %12s %16s %12s %14s\n", s == stage ? '*' : ' ', stage_names[s],
                format_bytes(bytes.parameters).c_str(), format_bytes(bytes.gradients).c_str(),
                format_bytes(bytes.optimizer_state).c_str(), format_bytes(bytes.total()).c_str(),
                format_bytes(formula.total()).c_str());
  }
  print_fsdp_units(plan, run_model);
  std::printf("\n* the configured stage (OPTIMIZER.name: %s, MODEL.SHARDED_DDP_SETUP.USE_SDP: %s, "
              "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP: %s)\n",
              config.get_string("OPTIMIZER.name").c_str(),
              config.get_bool("MODEL.SHARDED_DDP_SETUP.USE_SDP") ? "True" : "False",
              config.get_bool("MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP") ? "True" : "False");
}

// "0 = trunk.0..trunk.2, 1 = head.0..head.1"
std::string describe_stages(const PipelineEstimate& estimate) {
  std::vector<std::string> stages;
  const auto& names = estimate.block_names;
  for (size_t s = 0; s + 1 < estimate.boundaries.size(); ++s) {
    const std::string& first = names[static_cast<size_t>(estimate.boundaries[s])];
    const std::string& last = names[static_cast<size_t>(estimate.boundaries[s + 1] - 1)];
    stages.push_back(fmt::format("{} = {}", s, first == last ? first : first + ".." + last));
  }
  return fmt::format("{}", fmt::join(stages, ", "));
}

// What the table is about: the mesh, the schedule, the cut, and why no ZeRO table.
void print_pipeline_header(const train::RunPlan& plan, const PipelineEstimate& estimate) {
  const parallel::PipelineParallelOptions& options = plan.parallel.pipeline.stages;
  const std::string virtual_stages = estimate.shape.virtual_stages > 1
      ? fmt::format(", {} stages per rank", estimate.shape.virtual_stages)
      : std::string();
  std::printf("pipeline: DISTRIBUTED.PIPELINE_SIZE %d x %d data-parallel replica%s; schedule %s, "
              "%d micro-batches of up to %lld rows (batch %lld per replica)%s\n",
              estimate.shape.num_ranks, estimate.num_replicas,
              estimate.num_replicas == 1 ? "" : "s",
              parallel::to_string(options.schedule()).c_str(), estimate.shape.num_microbatches,
              static_cast<long long>(estimate.microbatch_rows),
              static_cast<long long>(plan.batch_per_rank), virtual_stages.c_str());
  const std::string cut = options.boundaries().empty()
      ? "balanced by " + parallel::to_string(options.balance())
      : std::string("from MODEL.PIPELINE.BOUNDARIES");
  std::printf("stages %s, boundaries [%s]: %s\n", cut.c_str(),
              fmt::format("{}", fmt::join(estimate.boundaries, ", ")).c_str(),
              describe_stages(estimate).c_str());
  std::printf("each stage's replicas run %s (ZeRO-2 and FSDP do not compose with a pipeline), "
              "so the ZeRO table is replaced by this one, per pipeline rank\n",
              plan.parallel.data_parallelism == parallel::DataParallelism::kZero1
                  ? "ZeRO-1 (optimizer state sharded over them)"
                  : "DDP");
}

// How the activation columns were obtained, so that nobody reads more into them.
void print_activation_note(bool checkpoint_stages, const PipelineEstimate& estimate) {
  const bool measured = !estimate.ranks.empty() && estimate.ranks.front().activations;
  if (!measured) {
    std::printf("activations: not measured (this build cannot measure CPU memory)\n");
  } else if (checkpoint_stages) {
    std::printf("activations: measured on a micro-batch of zeros, %s; MODEL.PIPELINE."
                "CHECKPOINT_STAGES keeps only each stage's input per micro-batch in flight, so "
                "peak = in flight x the largest stage input + one micro-batch's activations of "
                "a stage (its recomputation); estimated, and unlike the figure without "
                "checkpointing it counts the stage inputs (received messages)\n",
                estimate.autocast_note.c_str());
  } else {
    std::printf("activations: measured on a micro-batch of zeros, %s; peak = activations per "
                "micro-batch x stage passes in flight (simulated schedule); a backward's "
                "transient buffers and received messages not included\n",
                estimate.autocast_note.c_str());
  }
}

// One row per pipeline rank: its stages' model state and its peak activations.
void print_pipeline_rows(bool checkpoint_stages, const PipelineEstimate& estimate) {
  std::printf("\n  %-4s %-7s %12s %12s %12s %16s %12s %16s %9s %16s\n", "rank", "stages",
              "parameters", "param bytes", "gradients", "optimizer state", "total",
              checkpoint_stages ? "stage input" : "act/micro-batch", "in flight",
              "peak activations");
  for (const auto& rank : estimate.ranks) {
    const auto& measured = rank.activations;
    const std::string per_microbatch = !measured ? "not measured"
        : checkpoint_stages ? format_bytes(rank.stage_input_bytes)
                            : format_bytes(measured->activation_bytes_per_microbatch);
    std::printf("  %-4d %-7s %12s %12s %12s %16s %12s %16s %9s %16s\n", rank.rank,
                fmt::format("{}", fmt::join(rank.stages, ",")).c_str(),
                with_commas(rank.parameter_count).c_str(),
                format_bytes(rank.state.parameters).c_str(),
                format_bytes(rank.state.gradients).c_str(),
                format_bytes(rank.state.optimizer_state).c_str(),
                format_bytes(rank.state.total()).c_str(), per_microbatch.c_str(),
                measured ? std::to_string(measured->peak_stages_in_flight).c_str() : "-",
                measured ? format_bytes(rank.peak_activation_bytes).c_str() : "not measured");
  }
}
} // namespace

int run_estimate_command(const Config& config) {
  const train::RunPlan plan = train::resolve_run(config); // what `largo train` would build
  if (plan.parallel.tensor_parallel_size > 1) {           // refused rather than sized as if unsplit
    throw ConfigError(fmt::format(
        "DISTRIBUTED.TENSOR_PARALLEL_SIZE = {}: largo estimate does not size tensor-parallel "
        "runs yet (it would print the unsplit model's memory); "
        "bench/run_tensor_parallel_bench.sh measures the split, and docs/tensor_parallel.md "
        "gives ViT-S/16's figures. Estimate the run with TENSOR_PARALLEL_SIZE 1 for the "
        "unsplit model's",
        plan.parallel.tensor_parallel_size));
  }
  const Precision precision = precision_of(plan.precision);
  const int64_t world_size = plan.world.world_size;

  // A linear evaluation trains only its heads: the frozen trunk is counted as frozen.
  const models::RunModel run_model = models::build_run_model(plan.model);
  const std::shared_ptr<torch::nn::Module> trained = run_model.module();
  optim::ParamGroupOptions group_options = plan.options.optimizer.param_groups;
  if (run_model.linear_eval) {
    group_options.head_prefix = run_model.linear_eval->head_prefix();
  }
  if (precision.parameter_dtype != at::kFloat) {
    trained->to(precision.parameter_dtype);
  }
  const auto groups = optim::build_param_groups(*trained, group_options);
  const std::vector<parallel::ParameterSize> sizes = parallel::parameter_sizes(*trained, groups);
  int64_t trained_numel = 0, frozen_numel = 0;
  for (const auto& size : sizes) {
    (size.trained ? trained_numel : frozen_numel) += size.numel;
  }

  parallel::MemoryEstimateOptions estimate;
  estimate.optimizer = plan.options.optimizer.spec;
  estimate.master_weights_dtype = precision.master_weights_dtype;
  estimate.world_size = static_cast<int>(world_size);
  estimate.rank = 0; // the padding sits in the last shard: rank 0 holds the most

  std::printf("model %s: %s parameters (%s trained, %s frozen), %s\n", plan.model.trunk_name.c_str(),
              with_commas(trained_numel + frozen_numel).c_str(),
              with_commas(trained_numel).c_str(), with_commas(frozen_numel).c_str(),
              precision.description.c_str());
  std::printf("optimizer %s; world size %lld (DISTRIBUTED.NUM_NODES %lld x NUM_PROC_PER_NODE %lld)\n",
              describe_optimizer(estimate.optimizer).c_str(), static_cast<long long>(world_size),
              static_cast<long long>(config.get_int("DISTRIBUTED.NUM_NODES")),
              static_cast<long long>(config.get_int("DISTRIBUTED.NUM_PROC_PER_NODE")));
  if (plan.parallel.pipeline.enabled()) {
    // A pipeline runs linear evaluations nowhere (refused), so the model is the TrunkHeadModel.
    const PipelineEstimate pipeline =
        estimate_pipeline(plan, *run_model.model.ptr(), sizes, estimate);
    const bool checkpoint_stages = plan.parallel.pipeline.stages.checkpoint_stages();
    print_pipeline_header(plan, pipeline);
    print_activation_note(checkpoint_stages, pipeline);
    print_pipeline_rows(checkpoint_stages, pipeline);
  } else {
    print_zero_table(config, plan, run_model, sizes, estimate);
  }
  return 0;
}

} // namespace largo::app
