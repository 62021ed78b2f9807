#include <largo/comm/launcher.h>

#include <largo/comm/world_info.h>
#include <largo/core/error.h>
#include <largo/core/error_report.h>
#include <largo/core/resources.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

extern char** environ;

namespace largo::comm {
namespace {

using Clock = std::chrono::steady_clock;

// The signals the launcher forwards to its workers. The handler only records them; the
// watch loop does the work.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
volatile std::sig_atomic_t g_first_signal = 0;
volatile std::sig_atomic_t g_signal_count = 0;

void record_signal(int signal) {
  if (g_first_signal == 0) {
    g_first_signal = signal;
  }
  g_signal_count = g_signal_count + 1;
}

// Installs record_signal for the forwarded signals while it lives.
class SignalForwarding {
 public:
  SignalForwarding() {
    g_first_signal = 0;
    g_signal_count = 0;
    struct sigaction action {};
    action.sa_handler = record_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
      ::sigaction(kForwardedSignals[i], &action, &previous_[i]);
    }
  }
  ~SignalForwarding() {
    for (size_t i = 0; i < std::size(kForwardedSignals); ++i) {
      ::sigaction(kForwardedSignals[i], &previous_[i], nullptr);
    }
  }
  SignalForwarding(const SignalForwarding&) = delete;
  SignalForwarding& operator=(const SignalForwarding&) = delete;

 private:
  struct sigaction previous_[std::size(kForwardedSignals)] {};
};

// The usual names (sigabbrev_np needs glibc 2.32).
std::string signal_name(int signal) {
  static const std::pair<int, const char*> names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},   {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"},
      {SIGTTIN, "SIGTTIN"}, {SIGTTOU, "SIGTTOU"}, {SIGCONT, "SIGCONT"}};
  for (const auto& [number, name] : names) {
    if (number == signal) {
      return name;
    }
  }
  return fmt::format("signal {}", signal);
}

struct Worker {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1; // also its process group id
  bool running = false;
  int wait_status = 0;
  Clock::time_point started;
  int stop_signal = 0;     // the signal that stopped it (SIGSTOP, ...), 0 while it runs
  Clock::time_point stopped_at;
  std::filesystem::path error_report; // where its error boundary writes its one-line error
};

// The one-line error a failed worker wrote (core/error_report.h), or "".
std::string reported_error(const Worker& worker) {
  std::ifstream in(worker.error_report);
  std::string line;
  std::getline(in, line);
  return line;
}

// A directory for this launch's worker error reports, removed with the launch.
class ReportDirectory {
 public:
  ReportDirectory() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "largo_launch_XXXXXX").string();
    if (::mkdtemp(pattern.data()) != nullptr) {
      path_ = pattern;
    }
  }
  ~ReportDirectory() {
    std::error_code ec;
    if (!path_.empty()) {
      std::filesystem::remove_all(path_, ec);
    }
  }
  ReportDirectory(const ReportDirectory&) = delete;
  ReportDirectory& operator=(const ReportDirectory&) = delete;
  // "" when no directory could be made (then workers report nothing, the launch goes on).
  std::filesystem::path file_for(int rank, int attempt) const {
    return path_.empty() ? std::filesystem::path()
                         : path_ / fmt::format("rank{}.attempt{}", rank, attempt);
  }

 private:
  std::filesystem::path path_;
};

// The launcher's environment with `overrides` applied, as "KEY=VALUE" strings.
std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> variables;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string text(*entry);
    const auto eq = text.find('=');
    if (eq != std::string::npos) {
      variables[text.substr(0, eq)] = text.substr(eq + 1);
    }
  }
  for (const auto& [key, value] : overrides) {
    variables[key] = value;
  }
  std::vector<std::string> strings;
  strings.reserve(variables.size());
  for (const auto& [key, value] : variables) {
    strings.push_back(key + "=" + value);
  }
  return strings;
}

std::vector<char*> pointers_to(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& text : strings) {
    pointers.push_back(text.data());
  }
  pointers.push_back(nullptr);
  return pointers;
}

// Forks and execs `command` in its own process group, killed when the launcher dies.
// Returns the pid, or throws ConfigError when the command cannot be executed (exec's error
// comes back through a close-on-exec pipe).
pid_t start_process(const std::vector<std::string>& command, std::vector<std::string> env) {
  std::vector<std::string> argv_strings = command;
  std::vector<char*> argv = pointers_to(argv_strings);
  std::vector<char*> envp = pointers_to(env);
  int exec_error_pipe[2];
  if (::pipe2(exec_error_pipe, O_CLOEXEC) != 0) {
    throw Error(fmt::format("could not create a pipe to start a worker: {}", std::strerror(errno)));
  }
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(exec_error_pipe[0]);
    ::close(exec_error_pipe[1]);
    throw Error(fmt::format("could not fork a worker: {}", std::strerror(error)));
  }
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != launcher) {
      ::_exit(127); // the launcher died before prctl took effect
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    const int error = errno;
    [[maybe_unused]] auto written = ::write(exec_error_pipe[1], &error, sizeof(error));
    ::_exit(127);
  }
  ::setpgid(pid, pid); // also from here, so the group exists before we signal it
  ::close(exec_error_pipe[1]);
  int exec_error = 0;
  ssize_t got = 0;
  do {
    got = ::read(exec_error_pipe[0], &exec_error, sizeof(exec_error));
  } while (got < 0 && errno == EINTR);
  ::close(exec_error_pipe[0]);
  if (got == static_cast<ssize_t>(sizeof(exec_error))) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    throw ConfigError(fmt::format(
        "cannot run the worker command '{}': {}{}", command.front(), std::strerror(exec_error),
        command.front().find('/') == std::string::npos ? " (looked up on PATH)" : ""));
  }
  return pid;
}

// Reaps the workers that have ended; returns the ones that failed: those killed by a signal
// first (when a rank dies, its peers often fail in their next collective, within the same
// poll, and the cause is the one to name first), then in rank order.
std::vector<const Worker*> reap(std::vector<Worker>& workers) {
  std::vector<const Worker*> failed;
  for (auto& worker : workers) {
    if (!worker.running) {
      continue;
    }
    int status = 0;
    pid_t got = ::waitpid(worker.pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
    if (got == worker.pid && WIFSTOPPED(status)) {
      worker.stop_signal = WSTOPSIG(status);
      worker.stopped_at = Clock::now();
      spdlog::warn("rank {} (pid {}) was stopped by {}: the job cannot make progress until it "
                   "continues (SIGCONT); its peers fail their next collective after "
                   "DISTRIBUTED.COLLECTIVE_TIMEOUT_SECONDS",
                   worker.rank, worker.pid, signal_name(worker.stop_signal));
      continue;
    }
    if (got == worker.pid && WIFCONTINUED(status)) {
      worker.stop_signal = 0;
      continue;
    }
    if (got == worker.pid) {
      worker.running = false;
      worker.wait_status = status;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        failed.push_back(&worker);
      }
    }
  }
  std::stable_partition(failed.begin(), failed.end(),
                        [](const Worker* worker) { return WIFSIGNALED(worker->wait_status); });
  return failed;
}

bool any_running(const std::vector<Worker>& workers) {
  for (const auto& worker : workers) {
    if (worker.running) {
      return true;
    }
  }
  return false;
}

void signal_groups(const std::vector<Worker>& workers, int signal) {
  for (const auto& worker : workers) {
    if (worker.pid > 0) {
      ::kill(-worker.pid, signal); // ESRCH when the whole group is gone: fine
    }
  }
}

// Sends `signal` to every worker's process group, waits up to `grace` for the workers to
// exit, then kills what is left (also processes the workers started). A second forwarded
// signal cuts the grace short.
void stop_workers(std::vector<Worker>& workers, int signal, std::chrono::milliseconds grace) {
  signal_groups(workers, signal);
  signal_groups(workers, SIGCONT); // a stopped worker handles the signal only once it runs
  const int signals_before = g_signal_count;
  const auto deadline = Clock::now() + grace;
  while (any_running(workers) && Clock::now() < deadline && g_signal_count == signals_before) {
    reap(workers);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  signal_groups(workers, SIGKILL);
  for (auto& worker : workers) {
    if (worker.running) {
      int status = 0;
      while (::waitpid(worker.pid, &status, 0) < 0 && errno == EINTR) {
      }
      worker.running = false;
      worker.wait_status = status;
    }
  }
}

std::string join(const std::vector<std::string>& words) {
  std::string text;
  for (const auto& word : words) {
    text += (text.empty() ? "" : " ") + word;
  }
  return text;
}

// "rank 1 (...) was stopped by SIGSTOP 31.2 s ago and stalled the job; rank 0 (...) then
// exited with status 6 (communication error: ...)": a stopped worker is the cause to name
// first, then the failed worker and the reason it wrote.
std::string describe_failure(const std::vector<Worker>& workers,
                             const std::vector<const Worker*>& failed, int node_rank) {
  const Worker& first = *failed.front();
  const double seconds = std::chrono::duration<double>(Clock::now() - first.started).count();
  std::string what = fmt::format("rank {} (local rank {} on node {}, pid {}) {} after {:.1f} s",
                                 first.rank, first.local_rank, node_rank, first.pid,
                                 describe_exit_status(first.wait_status), seconds);
  const std::string reason = reported_error(first);
  if (!reason.empty()) {
    what += fmt::format(" ({})", reason);
  }
  for (const Worker& worker : workers) {
    if (worker.running && worker.stop_signal != 0) {
      const double stopped =
          std::chrono::duration<double>(Clock::now() - worker.stopped_at).count();
      return fmt::format(
          "rank {} (local rank {} on node {}, pid {}) was stopped by {} {:.1f} s ago and "
          "stalled the job; then {}",
          worker.rank, worker.local_rank, node_rank, worker.pid, signal_name(worker.stop_signal),
          stopped, what);
    }
  }
  return what;
}

std::string rank_range(int first, int count) {
  return count == 1 ? fmt::format("rank {}", first)
                    : fmt::format("ranks {}-{}", first, first + count - 1);
}

} // namespace

void validate(const LauncherOptions& options) {
  auto fail = [](const std::string& message) { throw ConfigError(message); };
  if (options.nproc_per_node < 1) {
    fail(fmt::format("nproc_per_node = {}: expected the number of workers on this node, >= 1",
                     options.nproc_per_node));
  }
  if (options.nnodes < 1) {
    fail(fmt::format("nnodes = {}: expected the number of nodes, >= 1", options.nnodes));
  }
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    fail(fmt::format("node_rank = {} with nnodes = {}: expected 0 <= node_rank < nnodes (0 on "
                     "the node at master_addr)",
                     options.node_rank, options.nnodes));
  }
  if (options.max_restarts < 0) {
    fail(fmt::format("max_restarts = {}: expected >= 0", options.max_restarts));
  }
  if (options.master_port < 0 || options.master_port > 65535) {
    fail(fmt::format("master_port = {}: expected a TCP port (1-65535), or 0 to pick a free one",
                     options.master_port));
  }
  if (options.master_addr.empty()) {
    fail("master_addr is empty: expected the address of the node of rank 0 (127.0.0.1 for one "
         "machine)");
  }
  if (options.stop_grace.count() < 0 || options.poll_interval.count() <= 0) {
    fail("stop_grace must be >= 0 and poll_interval > 0");
  }
}

void check_workers_fit_machine(const LauncherOptions& options) {
  // A few workers per core still run (slowly: trying out a 4-rank job on a laptop); thousands
  // fork until the machine chokes.
  const int64_t cores = available_cpu_cores();
  if (options.nproc_per_node > kMaxWorkersPerCore * cores) {
    throw ResourceError(fmt::format(
        "{} = {}: this machine gives {} {} cores, and Largo starts at most {} workers per core "
        "({} here); use fewer workers per node",
        options.nproc_per_node_key, options.nproc_per_node, options.name, cores,
        kMaxWorkersPerCore, kMaxWorkersPerCore * cores));
  }
}

int resolve_master_port(const LauncherOptions& options) {
  if (options.master_port != 0) {
    return options.master_port;
  }
  return options.nnodes == 1 ? find_free_port() : kDefaultMasterPort;
}

std::map<std::string, std::string> worker_environment(
    const LauncherOptions& options, int local_rank, int master_port, int restart_count,
    const std::function<const char*(const char*)>& inherited_arg) {
  auto inherited = inherited_arg ? inherited_arg
                                 : [](const char* name) -> const char* { return std::getenv(name); };
  const int world_size = options.nnodes * options.nproc_per_node;
  const int rank = options.node_rank * options.nproc_per_node + local_rank;
  std::map<std::string, std::string> env = options.extra_env;
  env["RANK"] = std::to_string(rank);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["WORLD_SIZE"] = std::to_string(world_size);
  env["LOCAL_WORLD_SIZE"] = std::to_string(options.nproc_per_node);
  env["GROUP_RANK"] = std::to_string(options.node_rank);
  env["GROUP_WORLD_SIZE"] = std::to_string(options.nnodes);
  env["ROLE_RANK"] = std::to_string(rank);
  env["ROLE_WORLD_SIZE"] = std::to_string(world_size);
  env["ROLE_NAME"] = std::string("default"); // std::string: GCC 12 -O3 warns on the char* form
  env["MASTER_ADDR"] = options.master_addr;
  env["MASTER_PORT"] = std::to_string(master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = std::string("none");
  // Rank 0 serves the job's store, not this launcher (torchrun's agent does, and says True):
  // a Largo or PyTorch worker must not look for a launcher's store, even when this launcher
  // itself runs under torchrun.
  env["TORCHELASTIC_USE_AGENT_STORE"] = std::string("False");
  const char* omp = inherited("OMP_NUM_THREADS");
  if (options.default_omp_num_threads && options.nproc_per_node > 1 &&
      (omp == nullptr || *omp == '\0') && !options.extra_env.count("OMP_NUM_THREADS")) {
    env["OMP_NUM_THREADS"] = std::string("1");
  }
  return env;
}

std::string describe_exit_status(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return fmt::format("exited with status {}", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    const int signal = WTERMSIG(wait_status);
    return fmt::format("was killed by signal {} ({})", signal, signal_name(signal));
  }
  return fmt::format("ended with wait status {}", wait_status);
}

LaunchResult launch_workers(const LauncherOptions& options, const std::vector<std::string>& command) {
  validate(options);
  if (command.empty() || command.front().empty()) {
    throw ConfigError(fmt::format("{}: no worker command given; put it after the options, e.g. "
                                  "largo launch --nproc_per_node 2 -- largo train my.yaml",
                                  options.name));
  }
  check_workers_fit_machine(options);
  const int world_size = options.nnodes * options.nproc_per_node;
  const int first_rank = options.node_rank * options.nproc_per_node;
  SignalForwarding forwarding;
  ReportDirectory reports;
  LaunchResult result;
  for (int attempt = 0;; ++attempt) {
    const int master_port = resolve_master_port(options);
    spdlog::info("{}: starting {} worker{} ({} of {}) on node {} of {}; rendezvous at {}:{}{}{}",
                 options.name, options.nproc_per_node, options.nproc_per_node == 1 ? "" : "s",
                 rank_range(first_rank, options.nproc_per_node), world_size, options.node_rank,
                 options.nnodes, options.master_addr, master_port,
                 options.master_port == 0 && options.nnodes == 1 ? " (a free port)" : "",
                 attempt > 0 ? fmt::format("; restart {} of {}", attempt, options.max_restarts)
                             : "");
    spdlog::debug("{}: worker command: {}", options.name, join(command));
    std::vector<Worker> workers(options.nproc_per_node);
    for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
      Worker& worker = workers[local_rank];
      worker.local_rank = local_rank;
      worker.rank = first_rank + local_rank;
      worker.error_report = reports.file_for(worker.rank, attempt);
      auto env = worker_environment(options, local_rank, master_port, attempt);
      if (!worker.error_report.empty()) {
        env[kErrorReportVariable] = worker.error_report.string();
      }
      try {
        worker.pid = start_process(command, environment_with(env));
      } catch (...) {
        stop_workers(workers, SIGTERM, options.stop_grace);
        throw;
      }
      worker.running = true;
      worker.started = Clock::now();
    }

    // Watch until every worker is done, one fails, or a signal arrives.
    std::vector<const Worker*> failed;
    while (true) {
      if (g_first_signal != 0) {
        const int signal = g_first_signal;
        spdlog::warn("{}: received {}; forwarding it to the workers and waiting for them to exit",
                     options.name, signal_name(signal));
        stop_workers(workers, signal, options.stop_grace);
        result.signal = signal;
        return result;
      }
      failed = reap(workers);
      if (!failed.empty() || !any_running(workers)) {
        break;
      }
      std::this_thread::sleep_for(options.poll_interval);
    }
    if (failed.empty()) {
      spdlog::info("{}: all {} worker{} finished successfully", options.name,
                   options.nproc_per_node, options.nproc_per_node == 1 ? "" : "s");
      return result;
    }

    const std::string what = describe_failure(workers, failed, options.node_rank);
    spdlog::error("{}: {}; stopping the other workers", options.name, what);
    for (size_t i = 1; i < failed.size(); ++i) {
      spdlog::error("{}: rank {} (local rank {}, pid {}) also {}", options.name, failed[i]->rank,
                    failed[i]->local_rank, failed[i]->pid,
                    describe_exit_status(failed[i]->wait_status));
    }
    stop_workers(workers, SIGTERM, options.stop_grace);
    if (g_first_signal != 0) {
      result.signal = g_first_signal;
      return result;
    }
    if (attempt < options.max_restarts) {
      ++result.restarts;
      spdlog::warn("{}: restarting the node's {} worker{} ({} of {} restarts); a trainer with "
                   "CHECKPOINT.AUTO_RESUME continues from its latest checkpoint",
                   options.name, options.nproc_per_node, options.nproc_per_node == 1 ? "" : "s",
                   attempt + 1, options.max_restarts);
      continue;
    }
    throw WorkerError(fmt::format(
        "{}; the other workers were stopped{}. The worker's own output above says why.", what,
        options.max_restarts > 0
            ? fmt::format(" and no restart is left ({} of --max_restarts {} used)",
                          options.max_restarts, options.max_restarts)
            : ""));
  }
}

} // namespace largo::comm
