// Past one machine (issue 45), run as programs: torchrun's elastic restarts (the real
// torchrun of the PyTorch Largo is built against) resuming from the newest complete
// checkpoint, a killed rank 0 reading as one clear message under every launcher, and
// `srun largo train` with only the variables SLURM sets. Every job is tiny (synthetic data,
// one thread per rank) and talks Gloo over 127.0.0.1.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/comm/world_info.h>

#include "apps/program_runner.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>

namespace largo::testing::elastic_test {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// No C++ stack trace reached the user.
void expect_no_stack_trace(const std::string& output) {
  EXPECT_FALSE(contains(output, "frame #")) << output;
  EXPECT_FALSE(contains(output, "Exception raised from")) << output;
}

// The torchrun beside the Python Largo is built against (scripts/torch_env.sh), or "".
std::string torchrun_program() {
  const fs::path python = LARGO_PYTHON;
  if (python.empty()) {
    return "";
  }
  const fs::path torchrun = python.parent_path() / "torchrun";
  return fs::exists(torchrun) ? torchrun.string() : "";
}

// 2 ranks x batch 8 over 96 samples: 6 iterations per epoch; `epochs` epochs.
fs::path write_job(const fs::path& dir, int epochs) {
  const fs::path config = dir / "job.yaml";
  std::ofstream(config) << fmt::format(
      R"(config:
  LOG_FREQUENCY: 3
  SEED_VALUE: 3
  DATA:
    NUM_DATALOADER_WORKERS: 1
    TRAIN:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {{NUM_SAMPLES: 96, IMAGE_SHAPE: [1, 16, 16], NUM_CLASSES: 4}}
      BATCHSIZE_PER_REPLICA: 8
      TRANSFORMS: [{{name: ToTensor}}]
    TEST:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {{NUM_SAMPLES: 32, IMAGE_SHAPE: [1, 16, 16], NUM_CLASSES: 4}}
      BATCHSIZE_PER_REPLICA: 16
      TRANSFORMS: [{{name: ToTensor}}]
  MODEL:
    TRUNK: {{NAME: small_cnn}}
  OPTIMIZER:
    name: sgd
    num_epochs: {}
    param_schedulers:
      lr: {{name: constant, value: 0.05}}
  MACHINE: {{DEVICE: cpu, NUM_THREADS: 1}}
  DISTRIBUTED: {{BACKEND: gloo, RENDEZVOUS_TIMEOUT_SECONDS: 30, COLLECTIVE_TIMEOUT_SECONDS: 30}}
  CHECKPOINT: {{DIR: "{}"}}
)",
      epochs,
      (dir / "run").string());
  return config;
}

checkpoint::StateDict final_checkpoint(const fs::path& run_dir, int epochs) {
  return checkpoint::load_checkpoint(
      run_dir / fmt::format("model_final_checkpoint_phase{}.torch", epochs - 1));
}

pid_t read_pid(const fs::path& path) {
  pid_t pid = 0;
  std::ifstream(path) >> pid;
  return pid;
}

// ---- torchrun -----------------------------------------------------------------------------

// The must-have of elastic training: torchrun (c10d rendezvous, its agent serving the store
// across attempts) restarts a group whose worker was SIGKILLed mid-epoch, and the new
// workers resume from the newest complete checkpoint and finish. Without scoping Largo's keys
// to the attempt, the restarted workers stop with "two processes claim rank 0 of this job".
//
// A deterministic kill point without a hook in the library: in attempt 0, rank 0's worker puts
// a FIFO where the iteration-4 checkpoint's temporary file goes (<file>.tmp.<pid>: exec keeps
// the pid), so rank 0 blocks opening it, after model_iteration2.torch is complete; the test
// then SIGKILLs rank 1. Attempt 1's rank 0 removes the FIFO first.
TEST(TorchrunTest, ARestartAfterAWorkerIsKilledResumesFromTheNewestCheckpoint) {
  const std::string torchrun = torchrun_program();
  if (torchrun.empty()) {
    GTEST_SKIP() << "no torchrun beside LARGO_PYTHON ('" << LARGO_PYTHON
                 << "'): scripts/install_deps.sh installs PyTorch with it";
  }
  TestDir dir;
  const int epochs = 2;
  const fs::path config = write_job(dir.path(), epochs);
  const fs::path run_dir = dir / "run";
  // A script file: torchrun substitutes its arguments as Python string templates ($$ -> $).
  const fs::path worker = dir / "worker.sh";
  std::ofstream(worker) << fmt::format(
      "echo $$ > {0}/pid.$RANK.$TORCHELASTIC_RESTART_COUNT; "
      "if [ \"$RANK\" = 0 ]; then "
      "  if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
      "    mkdir -p {1} && mkfifo {1}/model_iteration4.torch.tmp.$$; "
      "  else rm -f {1}/model_iteration4.torch.tmp.*; fi; "
      "fi; "
      "exec {2} train {3} CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2\n",
      dir.path().string(),
      run_dir.string(),
      largo_program(),
      config.string());
  const std::string rendezvous = fmt::format("127.0.0.1:{}", comm::find_free_port());
  RunningProgram job(
      {torchrun,
       "--no-python",
       "--nnodes",
       "1",
       "--nproc_per_node",
       "2",
       "--max-restarts",
       "1",
       "--rdzv-backend",
       "c10d",
       "--rdzv-endpoint",
       rendezvous,
       "--rdzv-id",
       "largo_elastic_test",
       "--local-addr",
       "127.0.0.1",
       "--monitor-interval",
       "0.1",
       "sh",
       worker.string()});
  pid_t rank1 = 0;
  const bool blocked = wait_until([&] {
    rank1 = read_pid(dir / "pid.1.0");
    return fs::exists(run_dir / "model_iteration2.torch") && rank1 > 0;
  });
  ASSERT_TRUE(blocked) << "attempt 0 did not write its iteration-2 checkpoint:\n" << job.output();
  ASSERT_EQ(::kill(rank1, SIGKILL), 0);
  const auto& run = job.wait(std::chrono::seconds(90));
  ASSERT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  EXPECT_TRUE(fs::exists(dir / "pid.0.1")) << "torchrun must have restarted the group:\n"
                                           << run.output;
  EXPECT_FALSE(contains(run.output, "two processes claim rank")) << run.output;
  EXPECT_TRUE(contains(run.output, "the launcher serves the store, attempt 1")) << run.output;
  EXPECT_TRUE(contains(run.output, "model_iteration2.torch (epoch 0, iteration 2 of the epoch"))
      << "attempt 1 must resume from the newest complete checkpoint:\n"
      << run.output;
  auto final_state = final_checkpoint(run_dir, epochs);
  EXPECT_EQ(final_state.at("world_size").toInt(), 2);
  EXPECT_TRUE(final_state.at("complete").toBool());
  expect_no_stack_trace(run.output);
}

// ---- a dead rank 0 --------------------------------------------------------------------------

// Kills rank 0 of a running 2-rank job started by `argv`, whose workers record their pids as
// dir/pid.<RANK> (the job's command line arranges it), and returns what the job printed.
ProgramResult kill_rank_zero(
    const TestDir& dir,
    const std::vector<std::string>& argv,
    const std::map<std::string, std::string>& env = {}) {
  RunningProgram job(argv, env);
  pid_t rank0 = 0;
  const bool training = wait_until([&] {
    std::ifstream metrics(dir / "run" / "metrics.jsonl");
    std::string line;
    rank0 = read_pid(dir / "pid.0");
    return rank0 > 0 && read_pid(dir / "pid.1") > 0 && std::getline(metrics, line) && !line.empty();
  });
  EXPECT_TRUE(training) << "the job did not start training:\n" << job.output();
  if (training) {
    ::kill(rank0, SIGKILL);
  }
  return job.wait(std::chrono::seconds(60));
}

TEST(DeadPeerTest, RankZeroKilledUnderLargoLaunchIsOneClearMessage) {
  TestDir dir;
  const fs::path config = write_job(dir.path(), /*epochs=*/1000); // runs until killed
  const std::string worker = fmt::format(
      "echo $$ > {}/pid.$RANK; exec {} train {}",
      dir.path().string(),
      largo_program(),
      config.string());
  const auto run = kill_rank_zero(
      dir, {largo_program(), "launch", "--nproc_per_node", "2", "--", "sh", "-c", worker});
  EXPECT_TRUE(run.exited_with(1)) << run.status() << "\n" << run.output;
  EXPECT_TRUE(contains(run.output, "rank 0 (local rank 0 on node 0")) << run.output;
  EXPECT_TRUE(contains(run.output, "was killed by signal 9 (SIGKILL)")) << run.output;
  expect_no_stack_trace(run.output);
}

TEST(DeadPeerTest, RankZeroKilledUnderASelfSpawningTrainIsOneClearMessage) {
  TestDir dir;
  const fs::path config = write_job(dir.path(), /*epochs=*/1000);
  RunningProgram job(
      {largo_program(), "train", config.string(), "DISTRIBUTED.NUM_PROC_PER_NODE=2"});
  const bool training = wait_until([&] {
    std::ifstream metrics(dir / "run" / "metrics.jsonl");
    std::string line;
    return std::getline(metrics, line) && !line.empty();
  });
  ASSERT_TRUE(training) << job.output();
  // The workers are the spawning process's children (`largo train` again); rank 0 is the one
  // whose environment says RANK=0.
  pid_t rank0 = 0;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    std::ifstream stat(entry.path() / "stat");
    std::string pid, command, state;
    pid_t parent = 0;
    stat >> pid >> command >> state >> parent;
    if (parent != job.pid()) {
      continue;
    }
    std::ifstream environ_file(entry.path() / "environ");
    for (std::string variable; std::getline(environ_file, variable, '\0');) {
      if (variable == "RANK=0") {
        rank0 = static_cast<pid_t>(std::stol(name));
      }
    }
  }
  ASSERT_GT(rank0, 0) << job.output();
  ASSERT_EQ(::kill(rank0, SIGKILL), 0);
  const auto& run = job.wait(std::chrono::seconds(60));
  EXPECT_TRUE(run.exited_with(1)) << run.status() << "\n" << run.output;
  EXPECT_TRUE(contains(
      run.output,
      fmt::format(
          "rank 0 (local rank 0 on node 0, pid {}) was "
          "killed by signal 9 (SIGKILL)",
          rank0)))
      << run.output;
  expect_no_stack_trace(run.output);
}

// Under torchrun its agent serves the store, so a dead rank 0 takes no store with it; the
// survivors must still print no C++ frames, and torchrun's report names rank 0 as the root
// cause.
TEST(DeadPeerTest, RankZeroKilledUnderTorchrunPrintsNoStackTrace) {
  const std::string torchrun = torchrun_program();
  if (torchrun.empty()) {
    GTEST_SKIP() << "no torchrun beside LARGO_PYTHON ('" << LARGO_PYTHON << "')";
  }
  TestDir dir;
  const fs::path config = write_job(dir.path(), /*epochs=*/1000);
  const fs::path worker = dir / "worker.sh"; // a file: torchrun would turn $$ into $
  std::ofstream(worker) << fmt::format(
      "echo $$ > {}/pid.$RANK; exec {} train {}\n",
      dir.path().string(),
      largo_program(),
      config.string());
  const auto run = kill_rank_zero(
      dir,
      {torchrun,
       "--no-python",
       "--nnodes",
       "1",
       "--nproc_per_node",
       "2",
       "--rdzv-backend",
       "c10d",
       "--rdzv-endpoint",
       fmt::format("127.0.0.1:{}", comm::find_free_port()),
       "--local-addr",
       "127.0.0.1",
       "--monitor-interval",
       "0.1",
       "sh",
       worker.string()});
  EXPECT_TRUE(run.exited_with(1)) << run.status() << "\n" << run.output;
  const auto root_cause = run.output.find("Root Cause");
  ASSERT_NE(root_cause, std::string::npos) << run.output;
  EXPECT_TRUE(contains(run.output.substr(root_cause), "rank      : 0 (local_rank: 0)"))
      << run.output;
  EXPECT_TRUE(contains(run.output.substr(root_cause), "Signal 9 (SIGKILL)")) << run.output;
  expect_no_stack_trace(run.output);
}

// ---- SLURM --------------------------------------------------------------------------------

// `srun largo train job.yaml` in a batch script that exports nothing: what srun sets for the
// two tasks of a one-node step (a fake environment: no cluster here). The master is the first
// host of the compressed node list, "127.0.0.[1-2]" standing in for "gpu[001-002]" so that
// everything stays on loopback, and the port DISTRIBUTED.RUN_ID's (the job's default port,
// 20000 + SLURM_JOB_ID mod 10000, might be taken on this machine).
TEST(SlurmTest, SrunTasksWithOnlySlurmsVariablesTrainTogether) {
  TestDir dir;
  const fs::path config = write_job(dir.path(), /*epochs=*/1);
  const int port = comm::find_free_port();
  auto task = [&](int rank) {
    return std::map<std::string, std::string>{
        {"SLURM_JOB_ID", "4242"},
        {"SLURM_JOB_NODELIST", "127.0.0.[1-2]"},
        {"SLURM_NNODES", "1"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_NTASKS_PER_NODE", "2"},
        {"SLURM_PROCID", std::to_string(rank)},
        {"SLURM_LOCALID", std::to_string(rank)},
        {"SLURM_NODEID", "0"}};
  };
  const std::vector<std::string> argv = {
      largo_program(),
      "train",
      config.string(),
      fmt::format("DISTRIBUTED.RUN_ID=127.0.0.1:{}", port)};
  RunningProgram task0(argv, task(0));
  RunningProgram task1(argv, task(1));
  const auto& run0 = task0.wait(std::chrono::seconds(90));
  const auto& run1 = task1.wait(std::chrono::seconds(90));
  ASSERT_TRUE(run0.succeeded()) << run0.status() << "\n"
                                << run0.output << "\ntask 1:\n"
                                << run1.output;
  ASSERT_TRUE(run1.succeeded()) << run1.status() << "\n" << run1.output;
  EXPECT_TRUE(contains(
      run0.output,
      fmt::format(
          "rank 0 of 2 (from the launcher's slurm variables); "
          "master 127.0.0.1:{} (address from the first "
          "host of SLURM_JOB_NODELIST, port from "
          "DISTRIBUTED.RUN_ID)",
          port)))
      << run0.output;
  EXPECT_EQ(final_checkpoint(dir / "run", 1).at("world_size").toInt(), 2);
}

} // namespace
} // namespace largo::testing::elastic_test
