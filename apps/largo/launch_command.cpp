// `largo launch` and the self-spawning `largo train`: both start workers with
// largo::comm::launch_workers (comm/launcher.h); this file only turns command lines into
// LauncherOptions.
#include "commands.h"

#include <largo/comm/launcher.h>
#include <largo/core/error.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

namespace largo::app {
namespace {

// Splits what follows `largo launch` into the launcher's option tokens and the worker
// command: the command starts after "--", or at the first word that is not an option or an
// option's value (every launcher option takes a value, as --opt V or --opt=V).
void split_command_line(const std::vector<std::string>& arguments,
                        std::vector<std::string>& option_tokens,
                        std::vector<std::string>& command) {
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& word = arguments[i];
    if (word == "--") {
      command.assign(arguments.begin() + static_cast<std::ptrdiff_t>(i) + 1, arguments.end());
      return;
    }
    if (word.size() > 1 && word[0] == '-') {
      option_tokens.push_back(word);
      const bool takes_next = word.find('=') == std::string::npos && word != "-h" &&
          word != "--help" && i + 1 < arguments.size();
      if (takes_next) {
        option_tokens.push_back(arguments[++i]);
      }
      continue;
    }
    command.assign(arguments.begin() + static_cast<std::ptrdiff_t>(i), arguments.end());
    return;
  }
}

std::filesystem::path this_program() {
  std::error_code error;
  auto path = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) {
    throw Error(fmt::format("cannot find this program's path to start it again as a worker "
                            "(/proc/self/exe: {}); start the workers with largo launch instead",
                            error.message()));
  }
  return path;
}

int exit_code_of(const comm::LaunchResult& result) {
  return result.signal != 0 ? 128 + result.signal : 0;
}

} // namespace

int run_launch(const std::vector<std::string>& arguments) {
  comm::LauncherOptions options;
  CLI::App app{"largo launch --nproc_per_node N [--nnodes M --node_rank R --master_addr A "
               "--master_port P] [--max_restarts K] [--] COMMAND [ARGS...]\n\nStarts the workers "
               "of one node of a distributed job, with torchrun's environment (RANK, "
               "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...).",
               "largo launch"};
  app.add_option("--nproc_per_node,--nproc-per-node", options.nproc_per_node,
                 "workers on this node (one per GPU, or e.g. one per core pair on a CPU)")
      ->required();
  app.add_option("--nnodes", options.nnodes, "nodes in the job")->capture_default_str();
  app.add_option("--node_rank,--node-rank", options.node_rank,
                 "this node, 0 .. nnodes-1 (0 on the node at --master_addr)")
      ->capture_default_str();
  app.add_option("--master_addr,--master-addr", options.master_addr,
                 "address of the node of rank 0, reachable from every node")
      ->capture_default_str();
  app.add_option("--master_port,--master-port", options.master_port,
                 "rank 0's rendezvous port; default: a free port on one node, 29500 on several");
  app.add_option("--max_restarts,--max-restarts", options.max_restarts,
                 "start the node's workers again this often after a failure (a trainer with "
                 "CHECKPOINT.AUTO_RESUME resumes from its latest checkpoint)")
      ->capture_default_str();
  app.footer("A worker that exits non-zero or is killed stops the others (SIGTERM, SIGKILL after "
             "5 s); SIGINT/SIGTERM are forwarded to the workers. See docs/launch.md.");

  std::vector<std::string> option_tokens;
  std::vector<std::string> command;
  split_command_line(arguments, option_tokens, command);
  std::reverse(option_tokens.begin(), option_tokens.end()); // CLI11 takes them reversed
  try {
    app.parse(option_tokens);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& error) {
    throw ConfigError(fmt::format("{} (see largo launch --help)", error.what()));
  }
  if (command.empty()) {
    throw ConfigError(
        "no worker command given: put it after the options, e.g. largo launch "
        "--nproc_per_node 2 -- largo train my.yaml (see largo launch --help)");
  }
  return exit_code_of(comm::launch_workers(options, command));
}

int spawn_workers(const train::TrainLaunchPlan& plan, const std::string& subcommand,
                  const std::vector<std::string>& arguments) {
  std::vector<std::string> command = {this_program().string(), subcommand};
  command.insert(command.end(), arguments.begin(), arguments.end());
  comm::LauncherOptions launcher = plan.launcher;
  launcher.name = "largo " + subcommand; // the launcher's messages name the command
  spdlog::info("largo {}: DISTRIBUTED.NUM_NODES = {}, NUM_PROC_PER_NODE = {}: starting this "
               "node's workers (node {} of {}); master from {}",
               subcommand, launcher.nnodes, launcher.nproc_per_node, launcher.node_rank,
               launcher.nnodes, plan.master_origin);
  return exit_code_of(comm::launch_workers(launcher, command));
}

} // namespace largo::app
