// Runs the `largo` program (or any command) from a test: its own process group, stdout and
// stderr captured together, an environment without any launcher's rank variables (so a test
// run inside srun or torchrun does not leak them), a timeout that kills it.
//
//   auto run = largo::testing::run_program({largo_program(), "launch", "--nproc_per_node", "2",
//                                           "--", "true"});
//   EXPECT_TRUE(run.succeeded()) << run.output;
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_paths.h"

extern char** environ;

namespace largo::testing {

inline std::string largo_program() {
  return std::string(largo::test_paths::binary_dir()) + "/largo";
}

// A scratch directory named after the current test; emptied when made, removed on success.
class TestDir {
 public:
  TestDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
        fmt::format("largo_apps_{}_{}_{}", info->test_suite_name(), info->name(), ::getpid());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TestDir() {
    if (!::testing::Test::HasFailure()) {
      std::error_code ignored;
      std::filesystem::remove_all(path_, ignored);
    }
  }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;
  const std::filesystem::path& path() const {
    return path_;
  }
  std::filesystem::path operator/(const std::string& name) const {
    return path_ / name;
  }

 private:
  std::filesystem::path path_;
};

struct ProgramResult {
  int wait_status = -1;
  std::string output; // stdout and stderr, interleaved
  double seconds = 0.0;
  bool timed_out = false;
  bool exited_with(int code) const {
    return !timed_out && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == code;
  }
  bool succeeded() const {
    return exited_with(0);
  }
  std::string status() const {
    if (timed_out) {
      return "timed out";
    }
    return WIFEXITED(wait_status) ? fmt::format("exit {}", WEXITSTATUS(wait_status))
                                  : fmt::format("signal {}", WTERMSIG(wait_status));
  }
};

// A program running in the background.
class RunningProgram {
 public:
  RunningProgram(const std::vector<std::string>& argv,
                 const std::map<std::string, std::string>& env_overrides = {}) {
    static int counter = 0;
    output_path_ = std::filesystem::temp_directory_path() /
        fmt::format("largo_program_{}_{}.log", ::getpid(), counter++);
    std::map<std::string, std::string> variables;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      std::string text(*entry);
      auto eq = text.find('=');
      if (eq != std::string::npos) {
        variables[text.substr(0, eq)] = text.substr(eq + 1);
      }
    }
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                             "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID",
                             "SLURM_NTASKS", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE", "LARGO_TEST_RANK", "LARGO_TEST_WORLD_SIZE"}) {
      variables.erase(name);
    }
    for (const auto& [key, value] : env_overrides) {
      variables[key] = value;
    }
    std::vector<std::string> env_strings;
    for (const auto& [key, value] : variables) {
      env_strings.push_back(key + "=" + value);
    }
    std::vector<std::string> argv_strings = argv;
    std::vector<char*> envp, args;
    for (auto& text : env_strings) {
      envp.push_back(text.data());
    }
    envp.push_back(nullptr);
    for (auto& text : argv_strings) {
      args.push_back(text.data());
    }
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
    start_ = std::chrono::steady_clock::now();
    const int error = posix_spawnp(&pid_, args[0], &actions, &attributes, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (error != 0) {
      ADD_FAILURE() << "could not start " << argv.front() << ": " << std::strerror(error);
      pid_ = -1;
    }
  }
  ~RunningProgram() {
    if (pid_ > 0 && !result_) {
      ::kill(-pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    std::error_code ignored;
    std::filesystem::remove(output_path_, ignored);
  }
  RunningProgram(const RunningProgram&) = delete;
  RunningProgram& operator=(const RunningProgram&) = delete;

  pid_t pid() const {
    return pid_;
  }

  // Waits for the program to end (killing its process group after `timeout`).
  const ProgramResult& wait(std::chrono::seconds timeout = std::chrono::seconds(120)) {
    if (result_) {
      return *result_;
    }
    ProgramResult result;
    const auto deadline = start_ + timeout;
    while (pid_ > 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        result.wait_status = status;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(-pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        result.wait_status = status;
        result.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    result.output = output();
    result_ = result;
    return *result_;
  }

  // What it has written so far.
  std::string output() const {
    std::ifstream in(output_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  pid_t pid_ = -1;
  std::filesystem::path output_path_;
  std::chrono::steady_clock::time_point start_;
  std::optional<ProgramResult> result_;
};

inline ProgramResult run_program(const std::vector<std::string>& argv,
                                 const std::map<std::string, std::string>& env_overrides = {},
                                 std::chrono::seconds timeout = std::chrono::seconds(120)) {
  RunningProgram program(argv, env_overrides);
  return program.wait(timeout);
}

// Waits until `condition()` holds, up to `timeout`; returns whether it did.
template <typename Condition>
bool wait_until(Condition condition, std::chrono::seconds timeout = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

} // namespace largo::testing
