// Starting the worker processes of one node of a distributed job: what `largo launch` and a
// self-spawning `largo train` do, with torchrun's contract, so any worker command works
// (a Largo program, a torchrun-style Python script, a shell script).
//
// Each worker gets, besides the launcher's own environment:
//   RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE      its place in the job
//   GROUP_RANK, GROUP_WORLD_SIZE                         this node's rank, the number of nodes
//   ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME=default        as torchrun sets them
//   MASTER_ADDR, MASTER_PORT                             where rank 0 serves the rendezvous
//   TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID
//   TORCHELASTIC_USE_AGENT_STORE=False                   rank 0 serves the store, not the
//                                                        launcher (unlike torchrun's agent)
//   OMP_NUM_THREADS=1                                    only when unset and several workers
//                                                        share the node (as torchrun)
// Ranks are node-major: node n's local rank l is RANK n * nproc_per_node + l.
//
// Failures: the launcher watches its workers; when one exits non-zero or is killed, it stops
// the others (SIGTERM to each worker's process group, SIGKILL after stop_grace) and either
// starts the node's group again (max_restarts; TORCHELASTIC_RESTART_COUNT counts the
// attempts, and a trainer with CHECKPOINT.AUTO_RESUME continues from its latest checkpoint)
// or throws WorkerError naming the rank and its exit status or signal, and the reason that
// worker gave (each worker gets LARGO_ERROR_REPORT_FILE, where the largo program's error
// boundary writes its one-line error, core/error_report.h). A worker stopped by a signal
// (SIGSTOP) is noticed at once; when the job then fails (its peers' collectives time out,
// DISTRIBUTED.COLLECTIVE_TIMEOUT_SECONDS), the error names the stopped rank first. SIGINT, SIGTERM,
// SIGHUP and SIGQUIT received by the launcher are forwarded to the workers, which are then
// waited for (SIGKILL after stop_grace); the launch returns the signal, and restarts nothing.
//
// Each worker runs in its own process group (so stopping it also stops the processes it
// started) and is killed if the launcher dies (PR_SET_PDEATHSIG), so no worker outlives it.
// No collectives here: the launcher never joins the job's process group.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace largo::comm {

struct LauncherOptions {
  int nproc_per_node = 1; // workers on this node (torchrun --nproc_per_node)
  int nnodes = 1;         // nodes in the job (--nnodes)
  int node_rank = 0;      // this node, in [0, nnodes) (--node_rank)
  std::string master_addr = "127.0.0.1"; // rank 0's node (--master_addr)
  // Rank 0's rendezvous port (--master_port). 0: a single-node job picks a free port on this
  // machine (again for each restart); a multi-node job uses 29500, as torchrun does.
  int master_port = 0;
  int max_restarts = 0; // how often the node's group is started again after a failure
  // After SIGTERM, how long workers get to exit before SIGKILL.
  std::chrono::milliseconds stop_grace{std::chrono::seconds(5)};
  // How often the workers are checked.
  std::chrono::milliseconds poll_interval{std::chrono::milliseconds(50)};
  // Set OMP_NUM_THREADS=1 for the workers when it is unset and nproc_per_node > 1.
  bool default_omp_num_threads = true;
  // Extra variables for every worker (the launcher's contract variables still win).
  std::map<std::string, std::string> extra_env;
  // A word for the launcher's messages ("largo launch", "largo train").
  std::string name = "largo launch";
  // What sets nproc_per_node, for messages ("--nproc_per_node", "DISTRIBUTED.NUM_PROC_PER_NODE").
  std::string nproc_per_node_key = "--nproc_per_node";
};

// Throws ConfigError naming the option (torchrun's flag names) and its value unless
// nproc_per_node >= 1, nnodes >= 1, 0 <= node_rank < nnodes, max_restarts >= 0,
// 0 <= master_port <= 65535 and master_addr is not empty.
void validate(const LauncherOptions& options);

// The port the workers of one attempt are given: options.master_port, or a free port on
// this machine (single node) / 29500 (several nodes) when it is 0.
int resolve_master_port(const LauncherOptions& options);

// The variables the launcher sets for local worker `local_rank` (the list at the top).
// `inherited` looks a variable up in the launcher's environment (for OMP_NUM_THREADS).
std::map<std::string, std::string> worker_environment(
    const LauncherOptions& options, int local_rank, int master_port, int restart_count,
    const std::function<const char*(const char*)>& inherited = nullptr);

struct LaunchResult {
  int restarts = 0; // how often the group was started again
  // The signal (SIGINT, SIGTERM, ...) that stopped the launch and was forwarded to the
  // workers; 0 when every worker finished successfully.
  int signal = 0;
};

// Throws ResourceError naming options.nproc_per_node_key when nproc_per_node is more than
// kMaxWorkersPerCore per core of this node (thousands of workers would fork until the machine
// chokes; a few per core still run, slowly).
inline constexpr int kMaxWorkersPerCore = 4;
void check_workers_fit_machine(const LauncherOptions& options);

// Runs `command` (argv; looked up on PATH) as nproc_per_node workers and waits for them.
// Returns when every worker exited 0, or after a forwarded signal (see above). Throws
// ConfigError for bad options or a command that cannot be started, ResourceError for more
// workers than cores (check_workers_fit_machine), WorkerError when a
// worker failed and no restart is left. Installs handlers for the forwarded signals while it
// runs (the previous ones are restored on return).
LaunchResult launch_workers(const LauncherOptions& options, const std::vector<std::string>& command);

// "exited with status 3", "was killed by signal 9 (SIGKILL)": a waitpid status in words.
std::string describe_exit_status(int wait_status);

} // namespace largo::comm
