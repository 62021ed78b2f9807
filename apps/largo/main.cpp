// The `largo` program: the VISSL-style trainer built on the library's public API.
//   largo train [CONFIG.yaml] [KEY=VALUE ...]   train (no config: the Fashion-MNIST default job);
//                                               starts its own workers when
//                                               DISTRIBUTED.NUM_PROC_PER_NODE > 1
//   largo config [CONFIG.yaml] [KEY=VALUE ...]  validate and print the effective config
//   largo launch --nproc_per_node N ... [--] COMMAND ...
//                                               start a node's workers (torchrun's contract)
//   largo inspect sampler --size N ...          print one rank's sample indices
//   largo estimate [CONFIG.yaml] [KEY=VALUE ...]  per-rank model-state bytes, ZeRO stages 0-3
//                                               (per pipeline rank with a pipeline)
//   largo extract CONFIG.yaml [KEY=VALUE ...]   write a model's features of both splits as
//                                               VISSL's .npy files
//   largo checkpoint consolidate PATH            merge a ZeRO checkpoint's optimizer shards
// Only this file turns errors into messages and exit codes.
#include "commands.h"
#include "estimate_command.h"
#include "extract_command.h"

#include <largo/checkpoint/sharded_checkpoint.h>
#include <largo/comm/world_info.h>
#include <largo/core/config.h>
#include <largo/core/embedded_configs.h>
#include <largo/core/error.h>
#include <largo/core/error_report.h>
#include <largo/core/logging.h>
#include <largo/core/malloc_tuning.h>
#include <largo/core/resources.h>
#include <largo/train/config_composition.h>
#include <largo/train/dataset_catalog.h>
#include <largo/train/engine.h>
#include <largo/train/feature_extraction.h>
#include <largo/train/option_keys.h>
#include <largo/train/run_plan.h>
#include <largo/train/trainer.h>
#include <largo/train/worker_launch.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>

namespace {

// Exit codes: 0 success, 1 training, data or worker failure, 2 bad usage or config,
// 128 + N when `largo launch` / a self-spawning `largo train` forwarded signal N.
constexpr int kExitFailure = 1;
constexpr int kExitBadConfig = 2;

// The positional arguments: a config (a file, or VISSL's config=<name> under the config
// root), VISSL's +config/<group>=<option> fragments, then KEY=VALUE overrides
// (train/config_composition.h); DATASET_NAMES without DATA_PATHS then resolve through the
// dataset catalog (train/dataset_catalog.h). What the catalog resolved goes to `notes`, or
// to the log when none is given.
largo::Config config_from_arguments(
    const std::vector<std::string>& arguments, std::vector<std::string>* notes = nullptr) {
  const std::filesystem::path root = largo::train::config_root();
  largo::Config config = largo::train::compose_config(
      largo::train::parse_config_arguments(arguments), root, largo::embedded::default_job_yaml());
  largo::train::engine_of(config); // an engine Largo lacks is refused by every command
  const auto resolved =
      largo::train::resolve_dataset_names(config, largo::train::find_dataset_catalog(root));
  if (notes != nullptr) {
    *notes = resolved;
  } else {
    for (const std::string& note : resolved) {
      spdlog::info("{}", note);
    }
  }
  return config;
}

// `largo train`, and `largo eval` (`command`) with TEST_ONLY=True among the arguments.
int run_train(const std::vector<std::string>& arguments, const std::string& command) {
  using Kind = largo::train::TrainLaunchPlan::Kind;
  std::vector<std::string> notes;
  largo::Config config = config_from_arguments(arguments, &notes);
  largo::train::require_engine(config, largo::train::Engine::kTrain, command);
  const auto plan = largo::train::plan_train_launch(config);
  const int rank = plan.world ? plan.world->rank : 0;
  largo::init_logging(rank, config.get_bool("VERBOSE"));
  for (const std::string& note : notes) {
    spdlog::info("{}", note);
  }
  // Everything the run would refuse is refused here, before workers start or data loads.
  largo::train::RunPlan run = largo::train::resolve_run(config);
  largo::train::refuse_extraction_keys(run);
  if (plan.kind == Kind::kSpawnWorkers) {
    return largo::app::spawn_workers(plan, "train", arguments);
  }
  if (plan.kind == Kind::kExternalWorker) {
    const int64_t configured =
        config.get_int("DISTRIBUTED.NUM_NODES") * config.get_int("DISTRIBUTED.NUM_PROC_PER_NODE");
    const largo::comm::WorldInfo& world = *plan.world;
    spdlog::info(
        "rank {} of {} (from the launcher's {} variables){}; master {}:{} (address from {}, "
        "port from {}){}",
        world.rank,
        world.world_size,
        world.source,
        configured > 1 && configured != world.world_size
            ? fmt::format(
                  "; DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE = {} is not used: "
                  "the launcher defines the world",
                  configured)
            : "",
        world.master_addr,
        world.master_port,
        world.master_addr_origin,
        world.master_port_origin,
        world.launcher_serves_store
            ? fmt::format("; the launcher serves the store, attempt {} (TORCHELASTIC_RESTART_COUNT)",
                          world.restart_count)
            : "");
  }
  const std::filesystem::path run_dir = run.options.checkpoint.dir;
  largo::train::Trainer trainer(std::move(run), config.to_yaml());
  auto summary = trainer.run();
  if (rank != 0) {
    return 0; // rank 0 reports for the job
  }
  if (summary.final_top1) {
    std::string top5 =
        summary.final_top5 ? fmt::format(", top-5 {:.2f} %", *summary.final_top5) : "";
    std::printf(
        "final test accuracy: top-1 %.2f %%%s (after %lld epochs); run directory %s\n",
        *summary.final_top1,
        top5.c_str(),
        static_cast<long long>(summary.epochs_completed),
        run_dir.string().c_str());
  } else {
    std::printf(
        "training finished after %lld epochs (no evaluation ran); run directory %s\n",
        static_cast<long long>(summary.epochs_completed),
        run_dir.string().c_str());
  }
  return 0;
}

int run_config(const std::vector<std::string>& arguments) {
  std::vector<std::string> notes;
  largo::Config config = config_from_arguments(arguments, &notes);
  // Everything the command that runs the config's engine checks first, and the launch keys.
  if (largo::train::engine_of(config) == largo::train::Engine::kExtractFeatures) {
    largo::train::resolve_extraction(config);
  } else {
    largo::train::resolve_run(config);
  }
  largo::train::validate_launch_config(config); // DISTRIBUTED.INIT_METHOD / RUN_ID too
  for (const std::string& note : notes) {
    std::cout << "# " << note << "\n";
  }
  std::cout << config.to_yaml();
  return 0;
}

// `largo checkpoint consolidate PATH [--output FILE]`: a ZeRO checkpoint's optimizer shards
// merged into one plain checkpoint (checkpoint/sharded_checkpoint.h).
int run_consolidate(const std::string& checkpoint_path, const std::string& output) {
  auto written = largo::checkpoint::consolidate_checkpoint(checkpoint_path, output);
  std::printf("consolidated checkpoint written: %s\n", written.string().c_str());
  return 0;
}

// "largo" or, in a worker of a distributed job, "largo (rank 1 of 2)": whose error it is.
std::string who_am_i(const char* program) {
  try {
    if (auto world = largo::comm::world_from_environment()) {
      return fmt::format("{} (rank {} of {})", program, world->rank, world->world_size);
    }
  } catch (const largo::Error&) {
  }
  return program;
}

// The error boundary (core/error_report.h): every failure becomes one line without C++
// stack frames (the whole text goes to the debug log, VERBOSE=True) and the exit code of its
// class. The allocation guard (core/resources.h) is installed first, so that a size beyond
// the machine's memory fails as a ResourceError naming what asked instead of an
// out-of-memory kill.
int report_errors(const char* program, const std::function<int()>& body) {
  largo::install_allocation_guard();
  try {
    // The library names its options; the program's user wrote YAML keys.
    return largo::train::rethrow_with_yaml_keys(body);
  } catch (...) {
    const largo::ErrorReport report = largo::report_error(std::current_exception());
    if (report.full_text != report.message) {
      spdlog::debug("the full text of the error below:\n{}", report.full_text);
    }
    std::fprintf(
        stderr,
        "%s: %s: %s\n",
        who_am_i(program).c_str(),
        report.label.c_str(),
        report.message.c_str());
    largo::publish_error_report(report); // for the launcher that started this worker, if any
    return report.exit_code;
  }
}

} // namespace

int main(int argc, char** argv) {
  largo::tune_malloc_for_tensors();
  // `largo launch` takes an arbitrary command after its options, which a CLI11 subcommand
  // would try to parse; it splits its own command line.
  if (argc >= 2 && std::strcmp(argv[1], "launch") == 0) {
    largo::init_logging(/*rank=*/0, /*verbose=*/false);
    std::vector<std::string> arguments(argv + 2, argv + argc);
    return report_errors("largo launch", [&] { return largo::app::run_launch(arguments); });
  }

  CLI::App app{"Largo: large-scale neural network training on libtorch"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "largo 0.1.0");

  std::vector<std::string> train_arguments;
  auto* train = app.add_subcommand("train", "Train a model from a VISSL-style YAML config");
  train->add_option(
      "args",
      train_arguments,
      "[CONFIG.yaml | config=NAME] [+config/GROUP=OPTION ...] [KEY=VALUE ...]; without a "
      "config, the Fashion-MNIST default job runs (NAME and GROUP are looked up under "
      "$LARGO_CONFIG_ROOT/config, default ./configs/config)");
  std::vector<std::string> eval_arguments;
  auto* eval = app.add_subcommand(
      "eval",
      "Evaluate a run's newest checkpoint (or MODEL.WEIGHTS_INIT's weights) on DATA.TEST: "
      "largo train with TEST_ONLY=True");
  eval->add_option(
      "args",
      eval_arguments,
      "[CONFIG.yaml | config=NAME] [+config/GROUP=OPTION ...] [KEY=VALUE ...]");
  std::vector<std::string> extract_arguments;
  auto* extract = app.add_subcommand(
      "extract",
      "Write the features of a run's newest checkpoint (or MODEL.WEIGHTS_INIT's weights) for "
      "DATA.TRAIN and DATA.TEST as VISSL's .npy files in CHECKPOINT.DIR");
  extract->add_option(
      "args",
      extract_arguments,
      "CONFIG.yaml | config=NAME [+config/GROUP=OPTION ...] [KEY=VALUE ...]");
  std::vector<std::string> config_arguments;
  auto* config = app.add_subcommand("config", "Validate a config and print the effective tree");
  config->add_option(
      "args",
      config_arguments,
      "[CONFIG.yaml | config=NAME] [+config/GROUP=OPTION ...] [KEY=VALUE ...]");
  // Listed for --help; run above.
  app.add_subcommand(
      "launch",
      "Start the workers of a distributed job: largo launch "
      "--nproc_per_node N [...] -- COMMAND (see largo launch --help)");

  auto* inspect = app.add_subcommand("inspect", "Look inside Largo's components");
  inspect->require_subcommand(1);
  largo::app::InspectSamplerArguments sampler_arguments;
  auto* sampler = inspect->add_subcommand(
      "sampler", "Print one rank's sample indices for an epoch, space-separated on one line");
  sampler->add_option("--size", sampler_arguments.size, "dataset size")->required();
  sampler->add_option("--world_size", sampler_arguments.world_size, "number of ranks")
      ->capture_default_str();
  sampler->add_option("--rank", sampler_arguments.rank, "the rank to print")->capture_default_str();
  sampler->add_option("--epoch", sampler_arguments.epoch)->capture_default_str();
  sampler->add_option("--seed", sampler_arguments.seed)->capture_default_str();
  sampler->add_flag(
      "--stateful",
      sampler_arguments.stateful,
      "VISSL's StatefulDistributedSampler (default: PyTorch's DistributedSampler)");
  sampler->add_option("--shuffle", sampler_arguments.shuffle, "1 or 0 (DistributedSampler)")
      ->capture_default_str();
  sampler->add_flag(
      "--drop_last",
      sampler_arguments.drop_last,
      "drop the tail instead of padding (DistributedSampler; implied by --stateful)");
  sampler->add_option(
      "--batch_size",
      sampler_arguments.batch_size,
      "batch size that --start_iter counts in (--stateful)");
  sampler->add_option(
      "--start_iter",
      sampler_arguments.start_iter,
      "first batch to serve (--stateful: a resumed epoch)");

  auto* checkpoint = app.add_subcommand("checkpoint", "Work on checkpoint files");
  checkpoint->require_subcommand(1);
  auto* consolidate = checkpoint->add_subcommand(
      "consolidate", "Merge a ZeRO checkpoint's optimizer shards into one plain checkpoint");
  std::string consolidate_path;
  std::string consolidate_output;
  consolidate
      ->add_option(
          "checkpoint",
          consolidate_path,
          "a checkpoint file, or a run directory (its checkpoint.torch)")
      ->required();
  consolidate->add_option(
      "--output",
      consolidate_output,
      "where to write (default: <checkpoint>_consolidated.torch beside it)");

  std::vector<std::string> estimate_arguments;
  auto* estimate =
      app.add_subcommand("estimate", "Per-rank memory of ZeRO stages 0-3 for a config");
  estimate->add_option("args", estimate_arguments, "[CONFIG.yaml] [KEY=VALUE ...]");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e); // prints help/version, or the error
    return code == 0 ? 0 : kExitBadConfig;
  }
  if (train->parsed()) {
    return report_errors("largo", [&] { return run_train(train_arguments, "largo train"); });
  }
  if (eval->parsed()) {
    eval_arguments.push_back("TEST_ONLY=True"); // after the user's overrides: it wins
    return report_errors("largo", [&] { return run_train(eval_arguments, "largo eval"); });
  }
  if (extract->parsed()) {
    return report_errors("largo", [&] {
      return largo::app::run_extract_command(
          config_from_arguments(extract_arguments), extract_arguments);
    });
  }
  if (estimate->parsed()) {
    return report_errors("largo", [&] {
      return largo::app::run_estimate_command(config_from_arguments(estimate_arguments));
    });
  }
  if (consolidate->parsed()) {
    return report_errors(
        "largo", [&] { return run_consolidate(consolidate_path, consolidate_output); });
  }
  if (sampler->parsed()) {
    return report_errors("largo", [&] {
      std::cout << largo::app::inspect_sampler(sampler_arguments) << "\n";
      return 0;
    });
  }
  return report_errors("largo", [&] { return run_config(config_arguments); });
}
