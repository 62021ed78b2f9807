// The `largo` program: the VISSL-style trainer built on the library's public API.
//   largo train [CONFIG.yaml] [KEY=VALUE ...]   train (no config: the Fashion-MNIST default job)
//   largo config [CONFIG.yaml] [KEY=VALUE ...]  validate and print the effective config
//   largo estimate [CONFIG.yaml] [KEY=VALUE ...]  per-rank model-state bytes, ZeRO stages 0-3
// Only this file turns errors into messages and exit codes.
#include "estimate_command.h"

#include <largo/core/config.h>
#include <largo/core/embedded_configs.h>
#include <largo/core/error.h>
#include <largo/core/logging.h>
#include <largo/core/malloc_tuning.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <iostream>

namespace {

// Exit codes: 0 success, 1 training or data failure, 2 bad usage or config.
constexpr int kExitFailure = 1;
constexpr int kExitBadConfig = 2;

// The positional arguments are an optional config file followed by KEY=VALUE overrides.
largo::Config config_from_arguments(const std::vector<std::string>& arguments) {
  std::vector<std::string> overrides;
  std::optional<std::string> file;
  for (const auto& argument : arguments) {
    bool is_override = argument.find('=') != std::string::npos;
    if (!is_override && !file && overrides.empty()) {
      file = argument;
    } else if (!is_override) {
      throw largo::ConfigError(fmt::format(
          "unexpected argument '{}': give at most one config file, before the KEY=VALUE "
          "overrides",
          argument));
    } else {
      overrides.push_back(argument);
    }
  }
  largo::Config config = largo::Config::defaults();
  if (file) {
    config.merge_file(*file);
  } else {
    config.merge_yaml(largo::embedded::default_job_yaml(), "configs/default_job.yaml");
  }
  for (const auto& assignment : overrides) {
    config.apply_override(assignment);
  }
  return config;
}

int run_train(const std::vector<std::string>& arguments) {
  largo::Config config = config_from_arguments(arguments);
  largo::init_logging(/*rank=*/0, config.get_bool("VERBOSE"));
  auto options = largo::train::trainer_options_from_config(config);
  largo::train::Trainer trainer(options, config.to_yaml());
  auto summary = trainer.run();
  if (summary.final_top1) {
    std::string top5 = summary.final_top5 ? fmt::format(", top-5 {:.2f} %", *summary.final_top5) : "";
    std::printf("final test accuracy: top-1 %.2f %%%s (after %lld epochs); run directory %s\n",
                *summary.final_top1, top5.c_str(), static_cast<long long>(summary.epochs_completed),
                options.checkpoint.dir.string().c_str());
  } else {
    std::printf("training finished after %lld epochs (no evaluation ran); run directory %s\n",
                static_cast<long long>(summary.epochs_completed),
                options.checkpoint.dir.string().c_str());
  }
  return 0;
}

int run_config(const std::vector<std::string>& arguments) {
  largo::Config config = config_from_arguments(arguments);
  largo::train::trainer_options_from_config(config); // range checks too
  std::cout << config.to_yaml();
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  largo::tune_malloc_for_tensors();
  CLI::App app{"Largo: large-scale neural network training on libtorch"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "largo 0.1.0");

  std::vector<std::string> train_arguments;
  auto* train = app.add_subcommand("train", "Train a model from a VISSL-style YAML config");
  train->add_option("args", train_arguments,
                    "[CONFIG.yaml] [KEY=VALUE ...]; without a config file, the Fashion-MNIST "
                    "default job runs");
  std::vector<std::string> config_arguments;
  auto* config = app.add_subcommand("config", "Validate a config and print the effective tree");
  config->add_option("args", config_arguments, "[CONFIG.yaml] [KEY=VALUE ...]");

  std::vector<std::string> estimate_arguments;
  auto* estimate = app.add_subcommand("estimate", "Per-rank memory of ZeRO stages 0-3 for a config");
  estimate->add_option("args", estimate_arguments, "[CONFIG.yaml] [KEY=VALUE ...]");

  CLI11_PARSE(app, argc, argv);
  try {
    if (train->parsed()) {
      return run_train(train_arguments);
    }
    if (estimate->parsed()) {
      return largo::app::run_estimate_command(config_from_arguments(estimate_arguments));
    }
    return run_config(config_arguments);
  } catch (const largo::ConfigError& e) {
    std::fprintf(stderr, "largo: config error: %s\n", e.what());
    return kExitBadConfig;
  } catch (const largo::Error& e) {
    std::fprintf(stderr, "largo: error: %s\n", e.what());
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "largo: internal error: %s\n", e.what());
    return kExitFailure;
  }
}
