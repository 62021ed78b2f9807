// The launcher as a library: option validation, the torchrun environment as a function of
// (node, local rank, attempt), exit statuses in words, and launch_workers() itself on small
// shell workers (failures, restarts, a forwarded signal). The `largo launch` program is
// tested in tests/apps/launch_test.cpp.
#include <largo/comm/launcher.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

namespace largo::comm::launcher_test {
namespace {

namespace fs = std::filesystem;

auto env_of(const std::map<std::string, std::string>& variables) {
  return [variables](const char* name) -> const char* {
    auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const LauncherOptions& options) {
  try {
    validate(options);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

LauncherOptions quick(int nproc_per_node) {
  LauncherOptions options;
  options.nproc_per_node = nproc_per_node;
  options.stop_grace = std::chrono::seconds(2);
  options.poll_interval = std::chrono::milliseconds(10);
  options.name = "test launcher";
  return options;
}

fs::path scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() /
      fmt::format("largo_launcher_{}_{}", info->name(), ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(LauncherTest, ValidateNamesTheOptionAndValue) {
  LauncherOptions options;
  EXPECT_EQ(error_of(options), "");
  options.nproc_per_node = 0;
  EXPECT_NE(error_of(options).find("nproc_per_node = 0"), std::string::npos);
  options = {};
  options.nnodes = 2;
  options.node_rank = 2;
  EXPECT_NE(error_of(options).find("node_rank = 2 with nnodes = 2"), std::string::npos);
  options = {};
  options.node_rank = -1;
  EXPECT_NE(error_of(options).find("node_rank = -1"), std::string::npos);
  options = {};
  options.master_port = 65536;
  EXPECT_NE(error_of(options).find("master_port = 65536"), std::string::npos);
  options = {};
  options.max_restarts = -2;
  EXPECT_NE(error_of(options).find("max_restarts = -2"), std::string::npos);
  options = {};
  options.master_addr = "";
  EXPECT_NE(error_of(options).find("master_addr is empty"), std::string::npos);
}

TEST(LauncherTest, WorkerEnvironmentIsTorchrunsContract) {
  LauncherOptions options;
  options.nnodes = 3;
  options.node_rank = 2;
  options.nproc_per_node = 4;
  options.master_addr = "10.1.2.3";
  options.max_restarts = 5;
  options.extra_env = {{"EXTRA", "x"}, {"RANK", "overridden"}};
  auto env = worker_environment(options, /*local_rank=*/1, /*master_port=*/29511,
                                /*restart_count=*/2, env_of({}));
  EXPECT_EQ(env["RANK"], "9"); // node-major: 2 * 4 + 1
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["WORLD_SIZE"], "12");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "2");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "3");
  EXPECT_EQ(env["ROLE_RANK"], "9");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "12");
  EXPECT_EQ(env["MASTER_ADDR"], "10.1.2.3");
  EXPECT_EQ(env["MASTER_PORT"], "29511");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "5");
  EXPECT_EQ(env["EXTRA"], "x");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  // An OMP_NUM_THREADS the user set is left alone, and one worker per node gets none.
  EXPECT_EQ(worker_environment(options, 0, 1, 0, env_of({{"OMP_NUM_THREADS", "3"}}))
                .count("OMP_NUM_THREADS"),
            0u);
  options.nproc_per_node = 1;
  EXPECT_EQ(worker_environment(options, 0, 1, 0, env_of({})).count("OMP_NUM_THREADS"), 0u);
}

TEST(LauncherTest, MasterPortZeroIsAFreePortOnOneNodeAnd29500OnSeveral) {
  LauncherOptions options;
  options.master_port = 0;
  const int port = resolve_master_port(options);
  EXPECT_GT(port, 0);
  EXPECT_NE(port, 29500);
  options.nnodes = 2;
  EXPECT_EQ(resolve_master_port(options), 29500);
  options.master_port = 1234;
  EXPECT_EQ(resolve_master_port(options), 1234);
}

TEST(LauncherTest, ExitStatusesInWords) {
  EXPECT_EQ(describe_exit_status(3 << 8), "exited with status 3");
  EXPECT_EQ(describe_exit_status(SIGKILL), "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(describe_exit_status(SIGSEGV), "was killed by signal 11 (SIGSEGV)");
}

TEST(LauncherTest, SuccessfulWorkersReturnNormally) {
  const fs::path dir = scratch_dir();
  auto result = launch_workers(quick(3), {"sh", "-c", "touch " + dir.string() + "/done.$RANK"});
  EXPECT_EQ(result.signal, 0);
  EXPECT_EQ(result.restarts, 0);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(fs::exists(dir / fmt::format("done.{}", rank)));
  }
  fs::remove_all(dir);
}

TEST(LauncherTest, AFailedWorkerStopsTheOthersAndIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  try {
    launch_workers(quick(2), {"sh", "-c", "if [ $LOCAL_RANK = 0 ]; then exit 7; fi; sleep 60"});
    ADD_FAILURE() << "expected a WorkerError";
  } catch (const WorkerError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("rank 0 (local rank 0 on node 0, pid "), std::string::npos) << message;
    EXPECT_NE(message.find("exited with status 7"), std::string::npos) << message;
  }
  // Rank 1's `sleep 60` was stopped, not waited for.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(LauncherTest, AStoppedWorkerIsNamedAsTheCauseWithThePeersReportedError) {
  // Rank 1 stops itself (SIGSTOP); rank 0 fails as a trainer would after its collective timed
  // out, writing its one-line error where the launcher asked (LARGO_ERROR_REPORT_FILE).
  const auto start = std::chrono::steady_clock::now();
  try {
    launch_workers(
        quick(2),
        {"sh",
         "-c",
         "if [ $RANK = 1 ]; then kill -STOP $$; sleep 60; fi; sleep 1; "
         "echo 'communication error: all_reduce of 4.00 KiB (collective #7) "
         "failed' > $LARGO_ERROR_REPORT_FILE; exit 6"});
    ADD_FAILURE() << "expected a WorkerError";
  } catch (const WorkerError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find("rank 1 (local rank 1 on node 0, pid "), 0u) << message;
    EXPECT_NE(message.find("was stopped by SIGSTOP"), std::string::npos) << message;
    EXPECT_NE(message.find("stalled the job; then rank 0 (local rank 0"), std::string::npos)
        << message;
    EXPECT_NE(message.find("exited with status 6 after"), std::string::npos) << message;
    EXPECT_NE(
        message.find("(communication error: all_reduce of 4.00 KiB (collective #7) failed)"),
        std::string::npos)
        << message;
  }
  // The stopped worker was continued and stopped, not waited for.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(LauncherTest, MoreWorkersThanCoresAreRefusedBeforeAnyStarts) {
  LauncherOptions options = quick(100000);
  options.nproc_per_node_key = "config key DISTRIBUTED.NUM_PROC_PER_NODE";
  try {
    launch_workers(options, {"sh", "-c", "exit 0"});
    ADD_FAILURE() << "expected a ResourceError";
  } catch (const ResourceError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("config key DISTRIBUTED.NUM_PROC_PER_NODE = 100000"), std::string::npos)
        << message;
    EXPECT_NE(message.find("cores"), std::string::npos) << message;
  }
}

TEST(LauncherTest, AWorkerIgnoringSigtermIsKilledAfterTheGrace) {
  const auto start = std::chrono::steady_clock::now();
  LauncherOptions options = quick(2);
  options.stop_grace = std::chrono::milliseconds(300);
  EXPECT_THROW(launch_workers(options, {"sh", "-c",
                                        "trap '' TERM; if [ $RANK = 1 ]; then exit 1; fi; "
                                        "while true; do sleep 0.05; done"}),
               WorkerError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(LauncherTest, RestartsStartTheGroupAgainWithTheRestartCount) {
  const fs::path dir = scratch_dir();
  LauncherOptions options = quick(2);
  options.max_restarts = 3;
  // Attempts 0 and 1 fail on rank 1; attempt 2 succeeds.
  const std::string script = fmt::format(
      "echo $TORCHELASTIC_RESTART_COUNT >> {}/attempts.$RANK; "
      "if [ $RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; then exit 1; fi",
      dir.string());
  auto result = launch_workers(options, {"sh", "-c", script});
  EXPECT_EQ(result.restarts, 2);
  std::ifstream attempts(dir / "attempts.1");
  std::string text((std::istreambuf_iterator<char>(attempts)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "0\n1\n2\n");
  fs::remove_all(dir);
}

TEST(LauncherTest, ACommandThatCannotRunIsAConfigError) {
  try {
    launch_workers(quick(2), {"largo-no-such-program"});
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot run the worker command 'largo-no-such-program': "
                                         "No such file or directory (looked up on PATH)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(launch_workers(quick(1), {}), ConfigError);
}

TEST(LauncherTest, ASignalToTheLauncherIsForwardedToTheWorkers) {
  const fs::path dir = scratch_dir();
  const std::string script = fmt::format(
      "trap 'echo INT > {0}/got.$RANK; exit 0' INT; touch {0}/ready.$RANK; "
      "while true; do sleep 0.05; done",
      dir.string());
  // Interrupt this process (where launch_workers runs) once both workers are ready.
  std::thread interrupter([&] {
    for (int i = 0; i < 3000 && !(fs::exists(dir / "ready.0") && fs::exists(dir / "ready.1")); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(::getpid(), SIGINT);
  });
  auto result = launch_workers(quick(2), {"sh", "-c", script});
  interrupter.join();
  EXPECT_EQ(result.signal, SIGINT);
  EXPECT_TRUE(fs::exists(dir / "got.0"));
  EXPECT_TRUE(fs::exists(dir / "got.1"));
  // The launcher's handlers are gone again: SIGINT has its default action back.
  struct sigaction current {};
  ::sigaction(SIGINT, nullptr, &current);
  EXPECT_EQ(current.sa_handler, SIG_DFL);
  fs::remove_all(dir);
}

} // namespace
} // namespace largo::comm::launcher_test
