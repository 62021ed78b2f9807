// How `largo train` decides to train alone, join a launcher's job, or start its own workers
// (VISSL's DISTRIBUTED.NUM_NODES / NUM_PROC_PER_NODE / INIT_METHOD / RUN_ID), and the errors
// for configs it cannot run.
#include <largo/core/error.h>
#include <largo/train/worker_launch.h>

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace largo::train::worker_launch_test {
namespace {

using Kind = TrainLaunchPlan::Kind;

auto env_of(const std::map<std::string, std::string>& variables) {
  return [variables](const char* name) -> const char* {
    auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  };
}

TrainLaunchPlan plan(const std::vector<std::string>& overrides,
                     const std::map<std::string, std::string>& env = {}) {
  return plan_train_launch(Config::load({}, overrides), env_of(env));
}

std::string error_of(const std::vector<std::string>& overrides,
                     const std::map<std::string, std::string>& env = {}) {
  try {
    plan(overrides, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(WorkerLaunchTest, OneProcessByDefault) {
  EXPECT_EQ(plan({}).kind, Kind::kSingleProcess);
  // INIT_METHOD does not matter when there is nothing to start.
  EXPECT_EQ(plan({"DISTRIBUTED.INIT_METHOD=file"}).kind, Kind::kSingleProcess);
}

TEST(WorkerLaunchTest, TwoProcessesPerNodeSpawnWithAFreeLocalPort) {
  auto p = plan({"DISTRIBUTED.NUM_PROC_PER_NODE=2"});
  ASSERT_EQ(p.kind, Kind::kSpawnWorkers);
  EXPECT_EQ(p.launcher.nproc_per_node, 2);
  EXPECT_EQ(p.launcher.nnodes, 1);
  EXPECT_EQ(p.launcher.node_rank, 0);
  EXPECT_EQ(p.launcher.master_addr, "127.0.0.1");
  EXPECT_EQ(p.launcher.master_port, 0) << "0: the launcher picks a free port";
  EXPECT_EQ(p.launcher.name, "largo train");
}

TEST(WorkerLaunchTest, ALaunchersEnvironmentDefinesTheWorld) {
  for (const auto& env : std::vector<std::map<std::string, std::string>>{
           {{"RANK", "1"}, {"WORLD_SIZE", "4"}},
           {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}},
           {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}}}) {
    auto p = plan({"DISTRIBUTED.NUM_PROC_PER_NODE=8"}, env);
    ASSERT_EQ(p.kind, Kind::kExternalWorker);
    ASSERT_TRUE(p.world.has_value());
    EXPECT_EQ(p.world->world_size, 4);
  }
}

TEST(WorkerLaunchTest, RunIdHostAndPortIsTheMaster) {
  auto p = plan({"DISTRIBUTED.NUM_NODES=2", "DISTRIBUTED.NUM_PROC_PER_NODE=3",
                 "DISTRIBUTED.RUN_ID=node0.cluster:29611"},
                {{"NODE_RANK", "1"}});
  ASSERT_EQ(p.kind, Kind::kSpawnWorkers);
  EXPECT_EQ(p.launcher.master_addr, "node0.cluster");
  EXPECT_EQ(p.launcher.master_port, 29611);
  EXPECT_EQ(p.launcher.nnodes, 2);
  EXPECT_EQ(p.launcher.node_rank, 1);
  EXPECT_EQ(p.launcher.nproc_per_node, 3);
  auto v6 = plan({"DISTRIBUTED.NUM_PROC_PER_NODE=2", "DISTRIBUTED.RUN_ID='[::1]:29612'"});
  EXPECT_EQ(v6.launcher.master_addr, "::1");
  EXPECT_EQ(v6.launcher.master_port, 29612);
}

TEST(WorkerLaunchTest, EnvInitMethodReadsMasterAddrAndPort) {
  auto p = plan({"DISTRIBUTED.NUM_PROC_PER_NODE=2", "DISTRIBUTED.INIT_METHOD=env"},
                {{"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29700"}});
  EXPECT_EQ(p.launcher.master_addr, "10.0.0.5");
  EXPECT_EQ(p.launcher.master_port, 29700);
  // One node: the address defaults to loopback.
  auto local = plan({"DISTRIBUTED.NUM_PROC_PER_NODE=2", "DISTRIBUTED.INIT_METHOD=env"},
                    {{"MASTER_PORT", "29701"}});
  EXPECT_EQ(local.launcher.master_addr, "127.0.0.1");
}

TEST(WorkerLaunchTest, ConfigsItCannotRunAreClearErrors) {
  const std::vector<std::string> two = {"DISTRIBUTED.NUM_PROC_PER_NODE=2"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), two.begin(), two.end());
    return extra;
  };
  EXPECT_NE(error_of(with({"DISTRIBUTED.INIT_METHOD=file"})).find("INIT_METHOD = file"),
            std::string::npos);
  EXPECT_NE(error_of(with({"DISTRIBUTED.INIT_METHOD=shm"}))
                .find("config key DISTRIBUTED.INIT_METHOD = shm: expected tcp"),
            std::string::npos);
  for (const char* bad : {"localhost", "host:0", "host:70000", "host:12ab"}) {
    EXPECT_NE(error_of(with({std::string("DISTRIBUTED.RUN_ID=") + bad}))
                  .find(std::string("config key DISTRIBUTED.RUN_ID = ") + bad),
              std::string::npos)
        << bad;
  }
  EXPECT_NE(error_of(with({"DISTRIBUTED.INIT_METHOD=env"})).find("MASTER_PORT is not set"),
            std::string::npos);
  EXPECT_NE(error_of(with({"DISTRIBUTED.INIT_METHOD=env"}), {{"MASTER_PORT", "x"}})
                .find("MASTER_PORT = 'x' is not a TCP port"),
            std::string::npos);
  EXPECT_NE(error_of({"DISTRIBUTED.NUM_NODES=2", "DISTRIBUTED.INIT_METHOD=env"},
                     {{"NODE_RANK", "0"}, {"MASTER_PORT", "29500"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
  // Several nodes: the node's rank must come from NODE_RANK, and auto cannot work.
  EXPECT_NE(error_of({"DISTRIBUTED.NUM_NODES=2", "DISTRIBUTED.RUN_ID=h:1"})
                .find("NODE_RANK, an integer in [0, 2) (0 on the node at the master address), "
                      "but it is not set"),
            std::string::npos);
  EXPECT_NE(error_of({"DISTRIBUTED.NUM_NODES=2", "DISTRIBUTED.RUN_ID=h:1"}, {{"NODE_RANK", "2"}})
                .find("but it is '2'"),
            std::string::npos);
  EXPECT_NE(error_of({"DISTRIBUTED.NUM_NODES=2"}, {{"NODE_RANK", "0"}})
                .find("DISTRIBUTED.RUN_ID = auto picks a free port on this machine"),
            std::string::npos);
  EXPECT_NE(error_of({"DISTRIBUTED.NUM_PROC_PER_NODE=0"})
                .find("config key DISTRIBUTED.NUM_PROC_PER_NODE = 0: expected an integer >= 1"),
            std::string::npos);
}

TEST(WorkerLaunchTest, LargoConfigValidatesWithoutTheEnvironment) {
  // A multi-node config is valid on any machine; only running it needs NODE_RANK.
  EXPECT_NO_THROW(validate_launch_config(
      Config::load({}, {"DISTRIBUTED.NUM_NODES=4", "DISTRIBUTED.RUN_ID=10.0.0.1:29500"})));
  // RUN_ID auto on several nodes: valid (srun gives the master), refused only when largo train
  // would start the workers itself (above).
  EXPECT_NO_THROW(validate_launch_config(Config::load({}, {"DISTRIBUTED.NUM_NODES=4"})));
  EXPECT_THROW(validate_launch_config(Config::load(
                   {}, {"DISTRIBUTED.NUM_PROC_PER_NODE=2", "DISTRIBUTED.RUN_ID=no_port"})),
               ConfigError);
}

// VISSL's multi-node configs write RUN_ID auto and run under SLURM: a task that srun started
// (here task 9 of 4 nodes x 4) takes its place and the master from srun's variables.
TEST(WorkerLaunchTest, AutoRunIdOnSeveralNodesRunsUnderSrun) {
  const std::map<std::string, std::string> srun_task_9 = {
      {"SLURM_JOB_ID", "123456"},
      {"SLURM_JOB_NODELIST", "gpu[001-003,010]"},
      {"SLURM_NNODES", "4"},
      {"SLURM_NTASKS", "16"},
      {"SLURM_NTASKS_PER_NODE", "4"},
      {"SLURM_PROCID", "9"},
      {"SLURM_LOCALID", "1"},
      {"SLURM_NODEID", "2"},
      {"SLURM_STEP_NODELIST", "gpu[001-003,010]"}};
  const auto p = plan({"DISTRIBUTED.NUM_NODES=4", "DISTRIBUTED.NUM_PROC_PER_NODE=4"}, srun_task_9);
  ASSERT_EQ(p.kind, Kind::kExternalWorker);
  ASSERT_TRUE(p.world.has_value());
  EXPECT_EQ(p.world->rank, 9);
  EXPECT_EQ(p.world->world_size, 16);
  EXPECT_EQ(p.world->master_addr, "gpu001");
  EXPECT_EQ(p.world->master_port, 20000 + 123456 % 10000);
  // Outside a launcher the same config is refused, naming the key and the way out.
  const std::string message = error_of({"DISTRIBUTED.NUM_NODES=4"}, {{"NODE_RANK", "0"}});
  EXPECT_NE(message.find("config key DISTRIBUTED.RUN_ID = auto"), std::string::npos) << message;
  EXPECT_NE(message.find("srun"), std::string::npos) << message;
}

} // namespace
} // namespace largo::train::worker_launch_test
