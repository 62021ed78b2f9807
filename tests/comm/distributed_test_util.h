// Multi-process tests on one machine: a test body runs in N processes (the ranks) that talk
// over Gloo on 127.0.0.1.
//
// How: the test process (the parent) re-executes its own binary once per rank, filtered to
// the same test, with LARGO_TEST_RANK / LARGO_TEST_WORLD_SIZE / MASTER_PORT set; in those
// children run_processes() runs the body instead of spawning. The parent waits for every
// rank (killing all of them after the timeout) and fails the test with each failed rank's
// output. Each rank's own gtest assertions decide its exit status. A rank whose Gloo
// connection set-up fails (a rare clash between tests running at once) makes the attempt
// start again once on a fresh port.
//
// A test may call run_processes() several times (e.g. save with 2 ranks, resume with 3):
// the children of call k run only the body of call k and then exit, so the code between
// and after the calls runs in the parent alone. Code *before* the first call runs in the
// children too: guard setup that must happen once with `if (is_parent())`.
//
//   TEST(AllReduceTest, SumOfRanks) {
//     largo::testing::run_on_ranks(3, [](largo::comm::ProcessGroup& group) {
//       at::Tensor t = at::full({4}, static_cast<float>(group.rank()));
//       group.all_reduce(t);
//       EXPECT_TRUE(t.eq(0 + 1 + 2).all().item<bool>());
//     });
//   }
#pragma once

#include <largo/comm/process_group.h>
#include <largo/comm/world_info.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <spawn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace largo::testing {

struct RankRunOptions {
  std::chrono::seconds timeout{120};
  // Extra environment variables of one rank's process (e.g. a different WORLD_SIZE).
  std::function<std::map<std::string, std::string>(int rank)> extra_env;
  // Options of the process group run_on_ranks() creates.
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(60)};
};

// This process's rank when it is a child started by run_processes(), else -1.
inline int child_rank() {
  const char* rank = std::getenv("LARGO_TEST_RANK");
  return rank == nullptr ? -1 : std::atoi(rank);
}

inline bool is_parent() {
  return child_rank() < 0;
}

// Which run_processes() call of the test this child belongs to.
inline int child_phase() {
  const char* phase = std::getenv("LARGO_TEST_PHASE");
  return phase == nullptr ? 0 : std::atoi(phase);
}

inline std::string current_test_filter() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return fmt::format("{}.{}", info->test_suite_name(), info->name());
}

// Runs `body(rank)` in `world_size` processes. In the parent: spawns, waits, and records a
// test failure (with the output) for each rank that failed, crashed or timed out.
inline void run_processes(int world_size, const std::function<void(int rank)>& body,
                          const RankRunOptions& options = {}) {
  // run_processes() calls so far in the current test (counted per test, so a gtest run of
  // several tests in one process numbers each test's phases from 0, as its children do).
  static int calls = 0;
  static std::string counted_test;
  if (counted_test != current_test_filter()) {
    counted_test = current_test_filter();
    calls = 0;
  }
  const int phase = calls++;
  if (int rank = child_rank(); rank >= 0) {
    if (phase != child_phase()) {
      return; // another call's children run that body
    }
    torch::set_num_threads(1); // the ranks share this machine's cores
    body(rank);
    // Done: the rest of the test body belongs to the parent. Exit without unwinding (no
    // static destructors racing the process group's threads); the status is the verdict.
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  // Two tests running at once (ctest -j) can, rarely, have a rank's Gloo connection set up
  // fail ("could not connect its gloo process group to its peers"): that is the machine, not
  // the code under test, and it happens before any test body runs. Such an attempt is
  // stopped at once and retried once on a fresh port; any other failure counts.
  constexpr const char* kSetupFailure = "could not connect its gloo process group";
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool last_attempt = attempt == 1;
    const int port = comm::find_free_port();
    const auto log_dir = std::filesystem::temp_directory_path() /
        fmt::format("largo_ranks_{}_{}", ::getpid(), port);
    std::filesystem::create_directories(log_dir);
    const std::string filter = "--gtest_filter=" + current_test_filter();
    std::vector<pid_t> pids(world_size, -1);
    std::vector<std::filesystem::path> logs;
    for (int rank = 0; rank < world_size; ++rank) {
      std::map<std::string, std::string> env_map;
      for (char** entry = environ; *entry != nullptr; ++entry) {
        std::string text(*entry);
        auto eq = text.find('=');
        env_map[text.substr(0, eq)] = eq == std::string::npos ? "" : text.substr(eq + 1);
      }
      env_map["LARGO_TEST_RANK"] = std::to_string(rank);
      env_map["LARGO_TEST_WORLD_SIZE"] = std::to_string(world_size);
      env_map["LARGO_TEST_PHASE"] = std::to_string(phase);
      env_map["RANK"] = std::to_string(rank);
      env_map["WORLD_SIZE"] = std::to_string(world_size);
      env_map["LOCAL_RANK"] = std::to_string(rank);
      env_map["MASTER_ADDR"] = "127.0.0.1";
      env_map["MASTER_PORT"] = std::to_string(port);
      if (options.extra_env) {
        for (const auto& [key, value] : options.extra_env(rank)) {
          env_map[key] = value;
        }
      }
      std::vector<std::string> env_strings;
      for (const auto& [key, value] : env_map) {
        env_strings.push_back(key + "=" + value);
      }
      std::vector<char*> envp;
      for (auto& text : env_strings) {
        envp.push_back(text.data());
      }
      envp.push_back(nullptr);
      logs.push_back(log_dir / fmt::format("rank{}.log", rank));
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, logs.back().c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
      std::string self = "/proc/self/exe";
      std::vector<char*> argv{self.data(), const_cast<char*>(filter.c_str()), nullptr};
      int status = posix_spawn(&pids[rank], "/proc/self/exe", &actions, nullptr, argv.data(),
                               envp.data());
      posix_spawn_file_actions_destroy(&actions);
      ASSERT_EQ(status, 0) << "could not spawn rank " << rank;
    }
    auto output_of = [&](int rank) {
      std::ifstream log(logs[rank]);
      std::stringstream text;
      text << log.rdbuf();
      return text.str();
    };

    std::vector<int> statuses(world_size, -1);
    std::vector<bool> done(world_size, false);
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    int remaining = world_size;
    bool timed_out = false;
    bool setup_failed = false;
    while (remaining > 0) {
      for (int rank = 0; rank < world_size; ++rank) {
        if (!done[rank] && ::waitpid(pids[rank], &statuses[rank], WNOHANG) == pids[rank]) {
          done[rank] = true;
          --remaining;
          const bool failed = !WIFEXITED(statuses[rank]) || WEXITSTATUS(statuses[rank]) != 0;
          if (failed && !last_attempt && output_of(rank).find(kSetupFailure) != std::string::npos) {
            setup_failed = true;
          }
        }
      }
      const bool give_up = setup_failed || std::chrono::steady_clock::now() > deadline;
      if (remaining > 0 && give_up) {
        timed_out = !setup_failed;
        for (int rank = 0; rank < world_size; ++rank) {
          if (!done[rank]) {
            ::kill(pids[rank], SIGKILL);
            ::waitpid(pids[rank], &statuses[rank], 0);
            done[rank] = true;
          }
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (setup_failed) {
      std::fprintf(stderr, "run_processes: a rank's Gloo connection set-up failed; retrying "
                           "on a fresh port\n");
      std::filesystem::remove_all(log_dir);
      continue;
    }
    bool all_ok = !timed_out;
    for (int rank = 0; rank < world_size; ++rank) {
      const int status = statuses[rank];
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        all_ok = false;
        ADD_FAILURE() << fmt::format(
            "rank {} of {} {}; its output:\n{}", rank, world_size,
            WIFEXITED(status) ? fmt::format("exited with status {}", WEXITSTATUS(status))
                              : fmt::format("was killed by signal {}{}", WTERMSIG(status),
                                            timed_out ? " (test timeout)" : ""),
            output_of(rank));
      }
    }
    if (all_ok) {
      std::filesystem::remove_all(log_dir);
    }
    return;
  }
}

// Runs `body(group)` on `world_size` ranks joined in a Gloo process group.
inline void run_on_ranks(int world_size, const std::function<void(comm::ProcessGroup&)>& body,
                         const RankRunOptions& options = {}) {
  run_processes(
      world_size,
      [&](int rank) {
        auto world = comm::world_from_environment();
        ASSERT_TRUE(world.has_value());
        comm::ProcessGroupOptions group_options;
        group_options.rank = world->rank;
        group_options.world_size = world->world_size;
        group_options.master_addr = world->master_addr;
        group_options.master_port = world->master_port;
        group_options.rendezvous_timeout = std::chrono::seconds(60);
        group_options.collective_timeout = options.collective_timeout;
        group_options.gloo_threads = 1;
        auto group = comm::ProcessGroup::create(group_options);
        body(*group);
      },
      options);
}

} // namespace largo::testing
