// The `largo` program's subcommands beyond train/config (main.cpp dispatches; only main.cpp
// turns errors into exit codes).
#pragma once

#include <largo/train/worker_launch.h>

#include <string>
#include <vector>

namespace largo::app {

// `largo launch [OPTIONS] [--] COMMAND [ARGS...]` (`arguments`: what follows "launch").
// Returns the exit code: 0 when every worker succeeded, 128 + N after forwarding signal N.
// Throws ConfigError for bad options, WorkerError when a worker failed.
int run_launch(const std::vector<std::string>& arguments);

// A self-spawning `largo train` (or `largo extract`): starts this program again as
// `plan.launcher`'s workers with `largo SUBCOMMAND ARGUMENTS...`. Returns like run_launch.
int spawn_workers(const train::TrainLaunchPlan& plan, const std::string& subcommand,
                  const std::vector<std::string>& arguments);

// `largo inspect sampler --size N ...` prints one rank's sample indices on one line.
struct InspectSamplerArguments {
  int64_t size = -1;
  int64_t world_size = 1;
  int64_t rank = 0;
  int64_t epoch = 0;
  uint64_t seed = 0;
  bool stateful = false;
  int shuffle = 1;
  bool drop_last = false;
  int64_t batch_size = -1; // -1: not given
  int64_t start_iter = -1; // -1: not given
};
// Throws ConfigError naming the flag for a bad combination or value.
std::string inspect_sampler(const InspectSamplerArguments& arguments);

} // namespace largo::app
