#include <largo/train/worker_launch.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

namespace largo::train {
namespace {

using Getenv = std::function<const char*(const char*)>;

std::optional<std::string> variable(const Getenv& getenv_fn, const char* name) {
  const char* value = getenv_fn(name);
  if (value == nullptr || *value == '\0') {
    return std::nullopt;
  }
  return std::string(value);
}

// A whole decimal number in [low, high], or nullopt.
std::optional<int64_t> parse_int(const std::string& text, int64_t low, int64_t high) {
  if (text.empty()) {
    return std::nullopt;
  }
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size() || value < low || value > high) {
    return std::nullopt;
  }
  return value;
}

// "host:port" (or "[v6 address]:port") as VISSL's tcp RUN_ID.
std::pair<std::string, int> host_and_port(const std::string& run_id) {
  const auto bad = [&] {
    return config_error("DISTRIBUTED.RUN_ID", run_id,
                        "auto (a free port on this machine, one node) or host:port of the node of "
                        "rank 0, e.g. 10.0.0.1:29500");
  };
  const auto colon = run_id.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw bad();
  }
  std::string host = run_id.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const auto port = parse_int(run_id.substr(colon + 1), 1, 65535);
  if (!port || host.empty()) {
    throw bad();
  }
  return {host, static_cast<int>(*port)};
}

} // namespace

namespace {

// Workers that largo train starts itself on several nodes meet at RUN_ID; auto would pick a
// free port here that the other nodes cannot know. A launcher (srun, torchrun, largo launch)
// gives the master instead, which is how VISSL's configs that write auto on several nodes run
// (VISSL's SLURM submission sets RUN_ID to the first node).
void refuse_auto_run_id_across_nodes(const Config& config, int64_t num_nodes) {
  if (num_nodes == 1 || config.get_string("DISTRIBUTED.INIT_METHOD") != "tcp" ||
      config.get_string("DISTRIBUTED.RUN_ID") != "auto") {
    return;
  }
  throw ConfigError(fmt::format(
      "config key DISTRIBUTED.RUN_ID = auto picks a free port on this machine, which the other "
      "nodes cannot know; with DISTRIBUTED.NUM_NODES = {} set RUN_ID to host:port of the node "
      "with NODE_RANK=0 (the same on every node), e.g. 10.0.0.1:29500, or start the workers "
      "with srun in a SLURM job (the master is then the job's first node; docs/launch.md)",
      num_nodes));
}

} // namespace

void validate_launch_config(const Config& config) {
  const int64_t num_nodes = config.get_int("DISTRIBUTED.NUM_NODES");
  const int64_t procs_per_node = config.get_int("DISTRIBUTED.NUM_PROC_PER_NODE");
  if (num_nodes < 1 || num_nodes > 1 << 20) {
    throw config_error("DISTRIBUTED.NUM_NODES", std::to_string(num_nodes), "an integer >= 1");
  }
  if (procs_per_node < 1 || procs_per_node > 1 << 20) {
    throw config_error("DISTRIBUTED.NUM_PROC_PER_NODE", std::to_string(procs_per_node),
                       "an integer >= 1");
  }
  if (num_nodes * procs_per_node == 1) {
    return; // nothing to start: INIT_METHOD and RUN_ID are not used
  }
  const std::string init_method = config.get_string("DISTRIBUTED.INIT_METHOD");
  const std::string run_id = config.get_string("DISTRIBUTED.RUN_ID");
  if (init_method == "tcp") {
    if (run_id != "auto") {
      host_and_port(run_id);
    }
  } else if (init_method == "file") {
    throw ConfigError(
        "config key DISTRIBUTED.INIT_METHOD = file: Largo's workers meet through a TCP store, not "
        "a shared file; use INIT_METHOD: tcp with RUN_ID: auto (one node) or RUN_ID: host:port "
        "(several nodes), or INIT_METHOD: env with MASTER_ADDR / MASTER_PORT");
  } else if (init_method != "env") {
    throw config_error("DISTRIBUTED.INIT_METHOD", init_method,
                       "tcp (the master from DISTRIBUTED.RUN_ID) or env (from MASTER_ADDR and "
                       "MASTER_PORT)");
  }
}

std::optional<comm::MasterPortFallback> run_id_master_port(const Config& config) {
  const std::string run_id = config.get_string("DISTRIBUTED.RUN_ID");
  if (config.get_string("DISTRIBUTED.INIT_METHOD") != "tcp" || run_id == "auto") {
    return std::nullopt;
  }
  return comm::MasterPortFallback{host_and_port(run_id).second, "DISTRIBUTED.RUN_ID"};
}

TrainLaunchPlan plan_train_launch(const Config& config, const Getenv& getenv_arg) {
  const Getenv getenv_fn = getenv_arg ? getenv_arg : [](const char* name) -> const char* {
    return std::getenv(name);
  };
  TrainLaunchPlan plan;
  if (auto world = comm::world_from_environment(getenv_fn, run_id_master_port(config))) {
    plan.kind = TrainLaunchPlan::Kind::kExternalWorker;
    plan.world = std::move(world);
    return plan;
  }
  validate_launch_config(config);
  const int64_t num_nodes = config.get_int("DISTRIBUTED.NUM_NODES");
  const int64_t procs_per_node = config.get_int("DISTRIBUTED.NUM_PROC_PER_NODE");
  if (num_nodes * procs_per_node == 1) {
    return plan;
  }
  refuse_auto_run_id_across_nodes(config, num_nodes);

  plan.kind = TrainLaunchPlan::Kind::kSpawnWorkers;
  comm::LauncherOptions& launcher = plan.launcher;
  launcher.name = "largo train";
  launcher.nproc_per_node_key = "config key DISTRIBUTED.NUM_PROC_PER_NODE";
  launcher.nnodes = static_cast<int>(num_nodes);
  launcher.nproc_per_node = static_cast<int>(procs_per_node);
  if (num_nodes > 1) {
    const auto text = variable(getenv_fn, "NODE_RANK");
    const auto node_rank = text ? parse_int(*text, 0, num_nodes - 1) : std::nullopt;
    if (!node_rank) {
      throw ConfigError(fmt::format(
          "DISTRIBUTED.NUM_NODES = {}: this node's rank must be in the environment variable "
          "NODE_RANK, an integer in [0, {}) (0 on the node at the master address), but it is "
          "{}; run NODE_RANK=<r> largo train ... on each node, or start the workers with "
          "largo launch --nnodes {} --node_rank <r>",
          num_nodes, num_nodes, text ? "'" + *text + "'" : "not set", num_nodes));
    }
    launcher.node_rank = static_cast<int>(*node_rank);
  }

  const std::string init_method = config.get_string("DISTRIBUTED.INIT_METHOD");
  const std::string run_id = config.get_string("DISTRIBUTED.RUN_ID");
  if (init_method == "tcp" && run_id == "auto") {
    launcher.master_addr = "127.0.0.1";
    launcher.master_port = 0;
    plan.master_origin = "DISTRIBUTED.RUN_ID = auto: 127.0.0.1 and a free port";
  } else if (init_method == "tcp") {
    auto [host, port] = host_and_port(run_id);
    launcher.master_addr = host;
    launcher.master_port = port;
    plan.master_origin = fmt::format("DISTRIBUTED.RUN_ID = {}", run_id);
  } else { // env (validate_launch_config allows nothing else)
    const auto addr = variable(getenv_fn, "MASTER_ADDR");
    const auto port_text = variable(getenv_fn, "MASTER_PORT");
    const auto port = port_text ? parse_int(*port_text, 1, 65535) : std::nullopt;
    if (!port || (!addr && num_nodes > 1)) {
      throw ConfigError(fmt::format(
          "config key DISTRIBUTED.INIT_METHOD = env takes the master from the environment, but "
          "{}; export MASTER_ADDR=<address of the node with rank 0> and MASTER_PORT=<a free "
          "port> on every node, or use INIT_METHOD: tcp with RUN_ID: host:port{}",
          !port_text ? "MASTER_PORT is not set"
                     : !port ? fmt::format("MASTER_PORT = '{}' is not a TCP port (1-65535)",
                                           *port_text)
                             : "MASTER_ADDR is not set",
          num_nodes == 1 ? " (or RUN_ID: auto on one node)" : ""));
    }
    launcher.master_addr = addr.value_or("127.0.0.1");
    launcher.master_port = static_cast<int>(*port);
    plan.master_origin = fmt::format("DISTRIBUTED.INIT_METHOD = env: MASTER_ADDR={} MASTER_PORT={}",
                                     launcher.master_addr, launcher.master_port);
  }
  comm::validate(launcher);
  return plan;
}

} // namespace largo::train
