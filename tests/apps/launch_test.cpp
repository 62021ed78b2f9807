// `largo launch` and the self-spawning `largo train`, run as programs: the torchrun
// environment, a dead rank stopping the job with a message naming it, forwarded signals, two
// "nodes" on loopback forming one job, restarts that resume from the checkpoint, and clear
// errors for bad arguments. Every job is tiny (synthetic data, one thread per rank) and
// talks Gloo over 127.0.0.1.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/comm/world_info.h>

#include "apps/program_runner.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <sstream>

namespace largo::testing::launch_test {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) {
    ++count;
  }
  return count;
}

// A tiny synthetic job for 2 ranks: 96 samples / 2 ranks / batch 8 = 6 iterations per epoch.
fs::path write_tiny_job(const fs::path& dir, int epochs = 2) {
  const fs::path config = dir / "tiny.yaml";
  std::ofstream(config) << fmt::format(R"(config:
  LOG_FREQUENCY: 3
  SEED_VALUE: 3
  DATA:
    NUM_DATALOADER_WORKERS: 1
    TRAIN:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {{NUM_SAMPLES: 96, IMAGE_SHAPE: [1, 16, 16], NUM_CLASSES: 4}}
      BATCHSIZE_PER_REPLICA: 8
      TRANSFORMS: [{{name: RandomHorizontalFlip}}, {{name: ToTensor}}]
    TEST:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {{NUM_SAMPLES: 32, IMAGE_SHAPE: [1, 16, 16], NUM_CLASSES: 4}}
      BATCHSIZE_PER_REPLICA: 16
      TRANSFORMS: [{{name: ToTensor}}]
  MODEL:
    TRUNK: {{NAME: small_cnn, SMALL_CNN: {{DROPOUT: 0.5}}}}
  OPTIMIZER:
    name: sgd
    num_epochs: {}
    param_schedulers:
      lr: {{name: cosine, start_value: 0.05, end_value: 0.0, update_interval: step}}
  MACHINE: {{DEVICE: cpu, NUM_THREADS: 1}}
  DISTRIBUTED: {{BACKEND: gloo, RENDEZVOUS_TIMEOUT_SECONDS: 60, COLLECTIVE_TIMEOUT_SECONDS: 60}}
  CHECKPOINT: {{DIR: "{}"}}
)",
                                       epochs, (dir / "run").string());
  return config;
}

std::map<std::string, std::string> read_env_file(const fs::path& path) {
  std::map<std::string, std::string> variables;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) {
      variables[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return variables;
}

checkpoint::StateDict final_checkpoint(const fs::path& run_dir, int epochs) {
  return checkpoint::load_checkpoint(
      run_dir / fmt::format("model_final_checkpoint_phase{}.torch", epochs - 1));
}

void expect_same_model(const checkpoint::StateDict& a, const checkpoint::StateDict& b) {
  auto model_a = a.at("model").toGenericDict();
  auto model_b = b.at("model").toGenericDict();
  ASSERT_EQ(model_a.size(), model_b.size());
  for (const auto& entry : model_a) {
    const std::string name = entry.key().toStringRef();
    ASSERT_TRUE(model_b.contains(name)) << name;
    EXPECT_TRUE(torch::equal(entry.value().toTensor(), model_b.at(name).toTensor())) << name;
  }
}

TEST(LaunchTest, WorkersGetTheTorchrunEnvironment) {
  TestDir dir;
  const std::string dump = fmt::format("env > {}/env.$RANK", dir.path().string());
  auto run = run_program({largo_program(), "launch", "--nproc_per_node", "2", "--nnodes", "2",
                          "--node_rank", "1", "--master_port", "23456", "--", "sh", "-c", dump},
                         {{"OMP_NUM_THREADS", ""}});
  ASSERT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  for (int local_rank = 0; local_rank < 2; ++local_rank) {
    const int rank = 2 + local_rank; // node 1 of 2, 2 workers per node
    auto env = read_env_file(dir / fmt::format("env.{}", rank));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local_rank));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "1");
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "23456");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False") << "rank 0 serves the store";
    EXPECT_EQ(env["OMP_NUM_THREADS"], "1") << "set when unset, as torchrun does";
  }
}

TEST(LaunchTest, ASingleNodeWithoutMasterPortGetsAFreePortAndSaysWhich) {
  TestDir dir;
  const std::string dump = fmt::format("echo $MASTER_PORT > {}/port.$RANK", dir.path().string());
  auto run = run_program(
      {largo_program(), "launch", "--nproc_per_node", "2", "sh", "-c", dump}); // no "--" needed
  ASSERT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  std::string port0, port1;
  std::ifstream(dir / "port.0") >> port0;
  std::ifstream(dir / "port.1") >> port1;
  EXPECT_EQ(port0, port1);
  EXPECT_NE(port0, "29500");
  EXPECT_TRUE(contains(run.output, fmt::format("rendezvous at 127.0.0.1:{} (a free port)", port0)))
      << run.output;
}

TEST(LaunchTest, AWorkerThatExitsNonZeroStopsTheOthersAndIsNamed) {
  // Rank 1 fails at once; rank 0 would sleep for a minute unless the launcher stops it.
  auto run = run_program({largo_program(), "launch", "--nproc_per_node", "2", "--", "sh", "-c",
                          "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60"});
  EXPECT_TRUE(run.exited_with(1)) << run.status() << "\n" << run.output;
  EXPECT_LT(run.seconds, 30.0);
  EXPECT_TRUE(contains(run.output, "rank 1 (local rank 1 on node 0")) << run.output;
  EXPECT_TRUE(contains(run.output, "exited with status 3")) << run.output;
}

TEST(LaunchTest, KillingOneRankOfATrainingJobStopsTheLauncherNamingIt) {
  TestDir dir;
  const fs::path config = write_tiny_job(dir.path(), /*epochs=*/1000); // runs until killed
  // Each worker records its pid, then becomes `largo train` (exec keeps the pid).
  const std::string worker = fmt::format("echo $$ > {}/pid.$RANK; exec {} train {}",
                                         dir.path().string(), largo_program(), config.string());
  RunningProgram launcher({largo_program(), "launch", "--nproc_per_node", "2", "--", "sh", "-c",
                           worker});
  // Once the job has trained a few iterations (rank 0 writes metrics), kill rank 1.
  const bool training = wait_until([&] {
    std::ifstream metrics(dir / "run" / "metrics.jsonl");
    std::string line;
    return fs::exists(dir / "pid.1") && std::getline(metrics, line) && !line.empty();
  });
  ASSERT_TRUE(training) << "the job did not start training:\n" << launcher.output();
  pid_t rank1 = 0;
  std::ifstream(dir / "pid.1") >> rank1;
  ASSERT_GT(rank1, 0);
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(rank1, SIGKILL), 0);
  const auto& run = launcher.wait(std::chrono::seconds(60));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_TRUE(run.exited_with(1)) << run.status() << "\n" << run.output;
  EXPECT_LT(seconds, 30.0) << "the launcher must stop the job within 30 s of a rank dying";
  EXPECT_TRUE(contains(run.output, fmt::format("rank 1 (local rank 1 on node 0, pid {}) was "
                                               "killed by signal 9 (SIGKILL)",
                                               rank1)))
      << run.output;
  pid_t rank0 = 0;
  std::ifstream(dir / "pid.0") >> rank0;
  EXPECT_NE(::kill(rank0, 0), 0) << "rank 0 must have been stopped too";
}

TEST(LaunchTest, SignalsAreForwardedToTheWorkers) {
  TestDir dir;
  // Each worker says it is ready, then waits; on SIGTERM it notes the signal and exits.
  const std::string worker = fmt::format(
      "trap 'echo TERM > {0}/got.$RANK; exit 0' TERM; touch {0}/ready.$RANK; "
      "while true; do sleep 0.05; done",
      dir.path().string());
  RunningProgram launcher({largo_program(), "launch", "--nproc_per_node", "2", "--", "sh", "-c",
                           worker});
  ASSERT_TRUE(wait_until([&] { return fs::exists(dir / "ready.0") && fs::exists(dir / "ready.1"); }))
      << launcher.output();
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  const auto& run = launcher.wait(std::chrono::seconds(30));
  EXPECT_TRUE(run.exited_with(128 + SIGTERM)) << run.status() << "\n" << run.output;
  EXPECT_TRUE(fs::exists(dir / "got.0")) << run.output;
  EXPECT_TRUE(fs::exists(dir / "got.1")) << run.output;
  EXPECT_TRUE(contains(run.output, "received SIGTERM; forwarding it to the workers")) << run.output;
}

TEST(LaunchTest, TwoNodesOnLoopbackFormOneJobAndTrain) {
  TestDir dir;
  const fs::path config = write_tiny_job(dir.path());
  const std::string port = std::to_string(comm::find_free_port());
  auto node = [&](const char* node_rank) {
    return std::vector<std::string>{largo_program(), "launch", "--nnodes", "2", "--node_rank",
                                    node_rank, "--nproc_per_node", "1", "--master_addr",
                                    "127.0.0.1", "--master_port", port, "--", largo_program(),
                                    "train", config.string()};
  };
  RunningProgram node0(node("0"));
  RunningProgram node1(node("1"));
  const auto& run0 = node0.wait();
  const auto& run1 = node1.wait();
  ASSERT_TRUE(run0.succeeded()) << run0.status() << "\n" << run0.output << "\nnode 1:\n" << run1.output;
  ASSERT_TRUE(run1.succeeded()) << run1.status() << "\n" << run1.output;
  EXPECT_TRUE(contains(run0.output, "starting 1 worker (rank 0 of 2) on node 0 of 2")) << run0.output;
  EXPECT_TRUE(contains(run1.output, "starting 1 worker (rank 1 of 2) on node 1 of 2")) << run1.output;
  EXPECT_TRUE(contains(run0.output, "final test accuracy")) << "rank 0 reports:\n" << run0.output;
  EXPECT_FALSE(contains(run1.output, "final test accuracy")) << run1.output;
  auto final_state = final_checkpoint(dir / "run", 2);
  EXPECT_EQ(final_state.at("world_size").toInt(), 2);
  EXPECT_TRUE(final_state.at("complete").toBool());
}

TEST(LaunchTest, MaxRestartsRestartsACrashedGroupThatResumesFromItsCheckpoint) {
  TestDir dir;
  const int epochs = 2;
  const fs::path config = write_tiny_job(dir.path(), epochs);
  const std::string checkpoint_every_2 = "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2";

  // The reference: the same job, uninterrupted.
  auto reference = run_program({largo_program(), "launch", "--nproc_per_node", "2", "--",
                                largo_program(), "train", config.string(), checkpoint_every_2,
                                "CHECKPOINT.DIR=" + (dir / "reference").string()});
  ASSERT_TRUE(reference.succeeded()) << reference.status() << "\n" << reference.output;

  // A deterministic crash without a hook in the library: on its first attempt, rank 0's
  // worker puts a directory where the iteration-4 checkpoint goes, so rank 0 fails to write
  // it and exits (after model_iteration2.torch exists); the launcher stops rank 1 and
  // restarts both, rank 0 removing the obstacle first. The new group must resume mid-epoch
  // from iteration 2 and end exactly where the uninterrupted job did.
  const fs::path run_dir = dir / "run";
  const std::string worker = fmt::format(
      "if [ \"$RANK\" = 0 ]; then "
      "  if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then mkdir -p {0}/model_iteration4.torch; "
      "  else rmdir {0}/model_iteration4.torch; fi; "
      "fi; exec {1} train {2} {3}",
      run_dir.string(), largo_program(), config.string(), checkpoint_every_2);
  auto run = run_program({largo_program(), "launch", "--nproc_per_node", "2", "--max_restarts",
                          "1", "--", "sh", "-c", worker});
  ASSERT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  EXPECT_TRUE(contains(run.output, "model_iteration4.torch")) << "the first attempt must fail "
                                                                "writing it:\n"
                                                             << run.output;
  EXPECT_TRUE(contains(run.output, "restarting the node's 2 workers (1 of 1 restarts)"))
      << run.output;
  EXPECT_TRUE(contains(run.output, "model_iteration2.torch (epoch 0, iteration 2 of the epoch"))
      << "the restarted group must resume from the iteration-2 checkpoint:\n"
      << run.output;
  expect_same_model(final_checkpoint(run_dir, epochs), final_checkpoint(dir / "reference", epochs));
}

TEST(LaunchTest, MaxRestartsExhaustedIsAnErrorNamingTheRank) {
  auto run = run_program({largo_program(), "launch", "--nproc_per_node", "2", "--max_restarts",
                          "2", "--", "sh", "-c",
                          "if [ \"$LOCAL_RANK\" = 0 ]; then kill -9 $$; fi; sleep 60"});
  EXPECT_TRUE(run.exited_with(1)) << run.status() << "\n" << run.output;
  EXPECT_EQ(count_of(run.output, "restarting the node's 2 workers"), 2u) << run.output;
  EXPECT_TRUE(contains(run.output, "rank 0 (local rank 0 on node 0")) << run.output;
  EXPECT_TRUE(contains(run.output, "was killed by signal 9 (SIGKILL)")) << run.output;
  EXPECT_TRUE(contains(run.output, "no restart is left")) << run.output;
}

TEST(LaunchTest, BadArgumentsGiveClearErrors) {
  struct Case {
    std::vector<std::string> arguments;
    std::string message;
  };
  // The range checks of every option are tested in-process (tests/comm/launcher_test.cpp);
  // here, that each kind of mistake reaches the user from the program, with exit status 2.
  const std::vector<Case> cases = {
      {{}, "--nproc_per_node is required"},
      {{"--nproc_per_node", "2"}, "no worker command given"},
      {{"--nproc_per_node", "two", "--", "true"}, "--nproc_per_node"},
      {{"--nproc_per_node", "1", "--nnodes", "2", "--node_rank", "2", "--", "true"},
       "node_rank = 2 with nnodes = 2"},
      {{"--nproc_per_node", "1", "--bogus", "1", "--", "true"}, "--bogus"},
      {{"--nproc_per_node", "1", "--", "/nonexistent/worker"},
       "cannot run the worker command '/nonexistent/worker': No such file or directory"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {largo_program(), "launch"};
    argv.insert(argv.end(), c.arguments.begin(), c.arguments.end());
    auto run = run_program(argv);
    EXPECT_TRUE(run.exited_with(2)) << run.status() << " for " << fmt::format("{}", fmt::join(c.arguments, " "))
                                    << "\n" << run.output;
    EXPECT_TRUE(contains(run.output, c.message)) << "expected '" << c.message << "' in:\n"
                                                 << run.output;
  }
}

TEST(TrainSpawnTest, TrainWithTwoProcessesPerNodeStartsItsOwnWorkers) {
  TestDir dir;
  const fs::path config = write_tiny_job(dir.path());
  auto run = run_program(
      {largo_program(), "train", config.string(), "DISTRIBUTED.NUM_PROC_PER_NODE=2"});
  ASSERT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  EXPECT_TRUE(contains(run.output, "starting 2 workers (ranks 0-1 of 2)")) << run.output;
  EXPECT_TRUE(contains(run.output, "DISTRIBUTED.RUN_ID = auto")) << run.output;
  EXPECT_TRUE(contains(run.output, "DDP over 2 ranks (gloo)")) << run.output;
  EXPECT_EQ(count_of(run.output, "final test accuracy"), 1u) << "rank 0 alone reports:\n"
                                                             << run.output;
  auto final_state = final_checkpoint(dir / "run", 2);
  EXPECT_EQ(final_state.at("world_size").toInt(), 2);
}

TEST(TrainSpawnTest, AnExternalLauncherDefinesTheWorld) {
  // Under largo launch (as under torchrun), NUM_PROC_PER_NODE = 2 in the config does not make
  // each worker spawn more: the 2 launched workers are the job.
  TestDir dir;
  const fs::path config = write_tiny_job(dir.path(), /*epochs=*/1);
  auto run = run_program({largo_program(), "launch", "--nproc_per_node", "2", "--",
                          largo_program(), "train", config.string(),
                          "DISTRIBUTED.NUM_PROC_PER_NODE=4"});
  ASSERT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  EXPECT_TRUE(contains(run.output, "rank 0 of 2 (from the launcher's env variables); "
                                   "DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE = 4 is not used"))
      << run.output;
  EXPECT_EQ(final_checkpoint(dir / "run", 1).at("world_size").toInt(), 2);
}

TEST(TrainSpawnTest, BadDistributedKeysGiveClearErrors) {
  TestDir dir;
  const fs::path config = write_tiny_job(dir.path());
  struct Case {
    std::vector<std::string> overrides;
    std::map<std::string, std::string> env;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"DISTRIBUTED.NUM_PROC_PER_NODE=2", "DISTRIBUTED.INIT_METHOD=file"}, {},
       "DISTRIBUTED.INIT_METHOD = file"},
      {{"DISTRIBUTED.NUM_NODES=2"}, {}, "NODE_RANK"},
      {{"DISTRIBUTED.NUM_NODES=2"}, {{"NODE_RANK", "0"}}, "DISTRIBUTED.RUN_ID = auto"},
      {{"DISTRIBUTED.NUM_PROC_PER_NODE=2", "DISTRIBUTED.RUN_ID=nohost"}, {},
       "config key DISTRIBUTED.RUN_ID = nohost"},
      {{"DISTRIBUTED.NUM_PROC_PER_NODE=2", "DISTRIBUTED.INIT_METHOD=env"}, {},
       "MASTER_PORT is not set"},
      {{"DISTRIBUTED.NUM_PROC_PER_NODE=0"}, {}, "DISTRIBUTED.NUM_PROC_PER_NODE = 0"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {largo_program(), "train", config.string()};
    argv.insert(argv.end(), c.overrides.begin(), c.overrides.end());
    auto run = run_program(argv, c.env);
    EXPECT_TRUE(run.exited_with(2)) << run.status() << "\n" << run.output;
    EXPECT_TRUE(contains(run.output, c.message)) << "expected '" << c.message << "' in:\n"
                                                 << run.output;
    EXPECT_FALSE(fs::exists(dir / "run")) << "nothing may start on a bad config";
  }
}

} // namespace
} // namespace largo::testing::launch_test
