#include "estimate_command.h"

#include <largo/core/aliased_cpu_allocation.h>
#include <largo/core/byte_format.h>
#include <largo/models/model_factory.h>
#include <largo/parallel/estimate/mesh_memory_estimate.h>
#include <largo/train/method_state_estimate.h>
#include <largo/train/run_plan.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace largo::app {
namespace {

// The parameters' dtype as the estimate found it (O2: with float32 master weights).
std::string describe_precision(const parallel::MeshMemoryEstimate& estimate) {
  if (estimate.parameter_dtype == at::kFloat) {
    return "float32 parameters";
  }
  const std::string name = estimate.parameter_dtype == at::kBFloat16 ? "bfloat16" : "float16";
  return estimate.master_weights_dtype ? name + " parameters, float32 master weights (Apex O2)"
                                       : name + " parameters (Apex O3)";
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
  } else if (
      (spec.name == "adamw" && spec.adamw.amsgrad) || (spec.name == "adam" && spec.adam.amsgrad)) {
    text += " (amsgrad)";
  }
  return spec.use_larc ? text + " with LARC" : text;
}

// Stage 3 holds more than its shards during a step: the units it gathers, in the
// parameters' dtype or as compute copies (the BatchNorm parameters then a float32 unit).
void print_fsdp_gathers(
    const Config& config, const train::RunPlan& plan, const parallel::FsdpGatherEstimate& gathers) {
  const auto& compute_dtype = plan.parallel.fsdp.compute_dtype;
  const std::string copies =
      compute_dtype ? fmt::format(", as {} compute copies", c10::toString(*compute_dtype))
                    : std::string();
  const std::string kept = gathers.kept_units.empty()
                               ? "no kept unit"
                               : fmt::format(
                                     "{} unit{}",
                                     fmt::join(gathers.kept_units, " and "),
                                     gathers.kept_units.size() > 1 ? "s" : "");
  std::printf(
      "\nstage 3 also gathers during a step (transient, per rank): the %s (%s) "
      "throughout, plus one block unit at a time, two with prefetch; %lld block "
      "units with AUTO_WRAP_THRESHOLD %lld, the largest %s (%s)%s\n",
      kept.c_str(),
      format_bytes(gathers.kept_bytes).c_str(),
      static_cast<long long>(gathers.num_block_units),
      static_cast<long long>(config.get_int("MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD")),
      gathers.largest_block_unit.c_str(),
      format_bytes(gathers.largest_block_unit_bytes).c_str(),
      copies.c_str());
}

// With tensor parallelism: the mesh's tp x dp, and how much of the model each rank holds.
void print_tensor_parallel_header(const parallel::MeshMemoryEstimate& estimate) {
  std::printf(
      "tensor parallel: DISTRIBUTED.TENSOR_PARALLEL_SIZE %d x %d data-parallel "
      "replica%s; each rank holds %s parameters (its shards of the split Linear layers, "
      "the rest replicated)\n",
      estimate.tensor_parallel_size,
      estimate.data_parallel_size,
      estimate.data_parallel_size == 1 ? "" : "s",
      with_commas(estimate.rank_parameter_numel).c_str());
}

// The ZeRO 0-3 table over the data-parallel replicas, the configured stage marked, and what
// stage 3 gathers during a step.
void print_zero_table(
    const Config& config,
    const train::RunPlan& plan,
    const parallel::MeshMemoryEstimate& estimate) {
  std::printf("per-rank model state of rank 0 (the largest); activations and communication "
              "buffers not included\n\n");
  const std::array<const char*, 4> stage_names{
      "0 DDP", "1 ZeRO-1 (optimizer state)", "2 ZeRO-2 (+ gradients)",
      "3 ZeRO-3 (+ parameters; FSDP)"};
  // With offload, the device's total and the host's bytes (stages 1-3 offload).
  const bool offload = estimate.state_options.offload_optimizer;
  std::printf(
      "  %-46s %12s %12s %16s %12s %14s%s\n",
      "stage",
      "parameters",
      "gradients",
      "optimizer state",
      offload ? "device total" : "total",
      "ZeRO formula",
      offload ? "   host memory" : "");
  for (int s = 0; s <= 3; ++s) {
    const auto& row = estimate.zero_stages[static_cast<size_t>(s)];
    const auto& bytes = row.estimated;
    const std::string host =
        offload ? fmt::format(" {:>14}", s == 0 ? "-" : format_bytes(bytes.host)) : "";
    std::printf(
        "%c %-46s %12s %12s %16s %12s %14s%s\n",
        s == estimate.state_options.stage ? '*' : ' ',
        stage_names[s],
        format_bytes(bytes.parameters).c_str(),
        format_bytes(bytes.gradients).c_str(),
        format_bytes(bytes.optimizer_state).c_str(),
        format_bytes(bytes.total()).c_str(),
        format_bytes(row.formula.total()).c_str(),
        host.c_str());
  }
  if (offload) {
    std::printf("\nthe optimizer is offloaded (OPTIMIZER.offload_optimizer, "
                "MODEL.FSDP_CONFIG.offload_optimizer): its state and copies of the rank's "
                "pieces and gradients are in host memory; the ZeRO formula is without offload\n");
  }
  if (estimate.fsdp_gathers) {
    print_fsdp_gathers(config, plan, *estimate.fsdp_gathers);
  } else {
    std::printf("\nFSDP's transient gathers (the full units it holds during a step) are not "
                "estimated with tensor parallelism\n");
  }
  std::printf(
      "\n* the configured stage (OPTIMIZER.name: %s, MODEL.SHARDED_DDP_SETUP.USE_SDP: %s, "
      "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP: %s, TRAINER.TASK_NAME: %s)\n",
      config.get_string("OPTIMIZER.name").c_str(),
      config.get_bool("MODEL.SHARDED_DDP_SETUP.USE_SDP") ? "True" : "False",
      config.get_bool("MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP") ? "True" : "False",
      config.get_string("TRAINER.TASK_NAME").c_str());
}

// "0 = trunk.0..trunk.2, 1 = head.0..head.1"
std::string describe_stages(const parallel::PipelineEstimate& estimate) {
  std::vector<std::string> stages;
  const auto& names = estimate.block_names;
  for (size_t s = 0; s + 1 < estimate.boundaries.size(); ++s) {
    const std::string& first = names[static_cast<size_t>(estimate.boundaries[s])];
    const std::string& last = names[static_cast<size_t>(estimate.boundaries[s + 1] - 1)];
    stages.push_back(fmt::format("{} = {}", s, first == last ? first : first + ".." + last));
  }
  return fmt::format("{}", fmt::join(stages, ", "));
}

// "balanced by parameters": with tensor parallelism the trainer weighs the split model's
// blocks, which the cut says so that nobody compares it with the unsplit model's.
std::string describe_cut(const parallel::ParallelOptions& parallel) {
  const parallel::PipelineParallelOptions& options = parallel.pipeline.stages;
  if (!options.boundaries().empty()) {
    return "from MODEL.PIPELINE.BOUNDARIES";
  }
  const bool split =
      parallel.tensor_parallel_size > 1 && options.balance() == parallel::StageBalance::kParameters;
  return "balanced by " + parallel::to_string(options.balance()) +
         (split ? " (of one tensor-parallel rank's shards, as the trainer cuts)" : "");
}

// What the table is about: the mesh, the schedule, the cut, and why no ZeRO table.
void print_pipeline_header(const train::RunPlan& plan, const parallel::PipelineEstimate& estimate) {
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
  if (plan.parallel.tensor_parallel_size > 1) {
    std::printf(
        "tensor parallel inside the stages: DISTRIBUTED.TENSOR_PARALLEL_SIZE %d; the "
        "model is split first, so a rank's row is one tensor-parallel rank's shards of "
        "its stages (every shard holds the same sizes)\n",
        plan.parallel.tensor_parallel_size);
  }
  std::printf(
      "stages %s, boundaries [%s]: %s\n",
      describe_cut(plan.parallel).c_str(),
      fmt::format("{}", fmt::join(estimate.boundaries, ", ")).c_str(),
      describe_stages(estimate).c_str());
  std::printf(
      "each stage's replicas run %s (ZeRO-2 and FSDP do not compose with a pipeline), "
      "so the ZeRO table is replaced by this one, per pipeline rank\n",
      parallel::data_parallel_placement(plan.parallel.data_parallelism).optimizer_state.at("dp") ==
              parallel::Placement::flat_shard()
          ? "ZeRO-1 (optimizer state sharded over them)"
          : "DDP");
}

// How the activation columns were obtained, so that nobody reads more into them.
void print_activation_note(bool checkpoint_stages, const parallel::PipelineEstimate& estimate) {
  if (!estimate.activations_not_measured.empty()) {
    std::printf("activations: not measured (%s)\n", estimate.activations_not_measured.c_str());
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
void print_pipeline_rows(bool checkpoint_stages, const parallel::PipelineEstimate& estimate) {
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

// What the method keeps beside the model state on every rank (train/method_state_estimate.h).
void print_method_state(const Config& config, const std::vector<train::MethodState>& state) {
  if (state.empty()) {
    return;
  }
  std::printf(
      "\nbeside the model state, on every rank (LOSS.name: %s):\n",
      config.get_string("LOSS.name").c_str());
  for (const train::MethodState& item : state) {
    std::printf(
        "  %12s  %s\n", item.bytes ? format_bytes(*item.bytes).c_str() : "-", item.what.c_str());
  }
}

// The library's options for the run `largo train` would build from the plan.
parallel::RunMemoryEstimateOptions
estimate_options(const train::RunPlan& plan, const models::RunModel& run_model) {
  parallel::RunMemoryEstimateOptions options;
  options.parallel = plan.parallel;
  options.optimizer = plan.options.optimizer.spec;
  options.param_groups = plan.options.optimizer.param_groups;
  if (run_model.linear_eval) { // it trains only its heads: the trunk counts as frozen
    options.param_groups.head_prefix = run_model.linear_eval->head_prefix();
  }
  options.sample_shape = plan.model_data().sample_shape;
  options.batch_per_replica = plan.batch_per_rank;
  return options;
}
} // namespace

int run_estimate_command(const Config& config) {
  const train::RunPlan plan = train::resolve_run(config); // what `largo train` would build
  // Without a pipeline the estimate reads shapes, never values: the model is built in aliased
  // scratch memory, so SEER's 10B RegNet (36 GiB of float32) is sized on a machine of a few
  // GiB. A pipeline's estimate runs the stages' forward to measure activations, which needs
  // values of its own (a label read as an index).
  std::optional<AliasedCpuAllocation> shapes_only;
  if (!plan.parallel.pipeline.enabled()) {
    shapes_only.emplace();
  }
  const models::RunModel run_model = models::build_run_model(plan.model);
  const std::vector<train::MethodState> method_state =
      train::estimate_method_state(plan, run_model);
  const int world_size = static_cast<int>(plan.world.world_size);
  const parallel::MeshMemoryEstimate estimate = parallel::estimate_memory(
      run_model.module(),
      parallel::mesh_dimensions(plan.parallel, world_size),
      estimate_options(plan, run_model));

  std::printf(
      "model %s: %s parameters (%s trained, %s frozen), %s\n",
      plan.model.trunk_name.c_str(),
      with_commas(estimate.trained_numel + estimate.frozen_numel).c_str(),
      with_commas(estimate.trained_numel).c_str(),
      with_commas(estimate.frozen_numel).c_str(),
      describe_precision(estimate).c_str());
  std::printf(
      "optimizer %s; world size %d (DISTRIBUTED.NUM_NODES %lld x NUM_PROC_PER_NODE %lld)\n",
      describe_optimizer(estimate.state_options.optimizer).c_str(),
      world_size,
      static_cast<long long>(config.get_int("DISTRIBUTED.NUM_NODES")),
      static_cast<long long>(config.get_int("DISTRIBUTED.NUM_PROC_PER_NODE")));
  if (estimate.pipeline) {
    const bool checkpoint_stages = plan.parallel.pipeline.stages.checkpoint_stages();
    print_pipeline_header(plan, *estimate.pipeline);
    print_activation_note(checkpoint_stages, *estimate.pipeline);
    print_pipeline_rows(checkpoint_stages, *estimate.pipeline);
    print_method_state(config, method_state);
    return 0;
  }
  if (estimate.tensor_parallel_size > 1) {
    print_tensor_parallel_header(estimate);
  }
  print_zero_table(config, plan, estimate);
  print_method_state(config, method_state);
  return 0;
}

} // namespace largo::app
