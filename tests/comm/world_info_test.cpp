// Reading a rank's place in the job from torchrun / largo launch, SLURM and Open MPI
// variables.
#include <largo/comm/world_info.h>
#include <largo/core/error.h>

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace largo::comm::world_info_test {
namespace {

// An environment made of a map, for world_from_environment's getenv hook.
auto env_of(const std::map<std::string, std::string>& variables) {
  return [variables](const char* name) -> const char* {
    auto it = variables.find(name);
    return it == variables.end() ? nullptr : it->second.c_str();
  };
}

TEST(WorldInfoTest, NoLauncherVariablesMeansSingleProcess) {
  EXPECT_FALSE(world_from_environment(env_of({})).has_value());
}

TEST(WorldInfoTest, ReadsTorchrunVariables) {
  auto info = world_from_environment(env_of({{"RANK", "3"}, {"WORLD_SIZE", "4"},
                                             {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29511"}}));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->source, "env");
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->world_size, 4);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->local_world_size, 2);
  EXPECT_EQ(info->master_addr, "10.0.0.7");
  EXPECT_EQ(info->master_port, 29511);
}

TEST(WorldInfoTest, DefaultsToLoopbackAndPort29500) {
  auto info = world_from_environment(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->master_addr, "127.0.0.1");
  EXPECT_EQ(info->master_port, 29500);
  EXPECT_EQ(info->local_rank, 0);
}

TEST(WorldInfoTest, ReadsSlurmVariables) {
  auto info = world_from_environment(env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"},
                                             {"SLURM_LOCALID", "1"},
                                             {"SLURM_NTASKS_PER_NODE", "4"}}));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->source, "slurm");
  EXPECT_EQ(info->rank, 5);
  EXPECT_EQ(info->world_size, 8);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->local_world_size, 4);
}

TEST(WorldInfoTest, ReadsOpenMpiVariables) {
  auto info = world_from_environment(env_of({{"OMPI_COMM_WORLD_RANK", "2"},
                                             {"OMPI_COMM_WORLD_SIZE", "3"},
                                             {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}}));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->source, "openmpi");
  EXPECT_EQ(info->rank, 2);
  EXPECT_EQ(info->world_size, 3);
}

TEST(WorldInfoTest, TorchrunVariablesWinOverSlurm) {
  // torchrun inside a SLURM allocation: SLURM describes the allocation, RANK the worker.
  auto info = world_from_environment(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"},
                                             {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->source, "env");
  EXPECT_EQ(info->rank, 1);
}

TEST(WorldInfoTest, RejectsBadValuesNamingTheVariable) {
  auto message_of = [](const std::map<std::string, std::string>& variables) {
    try {
      world_from_environment(env_of(variables));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(message_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("[0, world size)"),
            std::string::npos);
  EXPECT_NE(message_of({{"RANK", "0"}}).find("WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(message_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT=70000"),
            std::string::npos);
}

TEST(WorldInfoTest, ExpandsSlurmsCompressedNodeLists) {
  using Hosts = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_nodelist("node7"), Hosts({"node7"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu[001-004,010]"),
            Hosts({"gpu001", "gpu002", "gpu003", "gpu004", "gpu010"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu[09-11],login1"), Hosts({"gpu09", "gpu10", "gpu11", "login1"}));
  EXPECT_EQ(expand_slurm_nodelist("a[1-2]-ib,b3"), Hosts({"a1-ib", "a2-ib", "b3"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]n[1-2]"), Hosts({"r1n1", "r1n2", "r2n1", "r2n2"}));
  for (const std::string bad : {"gpu[001-004", "gpu[4-1]", "gpu[a-b]", "gpu]", ""}) {
    try {
      expand_slurm_nodelist(bad, "SLURM_JOB_NODELIST");
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_JOB_NODELIST"), std::string::npos) << e.what();
    }
  }
}

// What srun sets for task 9 of `sbatch --nodes 4 --ntasks-per-node 4` with `srun largo train`,
// nothing exported by the batch script.
std::map<std::string, std::string> srun_task_9() {
  return {{"SLURM_JOB_ID", "123456"},          {"SLURM_JOB_NODELIST", "gpu[001-003,010]"},
          {"SLURM_NODELIST", "gpu[001-003,010]"}, {"SLURM_NNODES", "4"},
          {"SLURM_NTASKS", "16"},              {"SLURM_NTASKS_PER_NODE", "4"},
          {"SLURM_PROCID", "9"},               {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "2"},               {"SLURM_STEP_NODELIST", "gpu[001-003,010]"},
          {"SLURM_STEP_TASKS_PER_NODE", "4(x4)"}};
}

TEST(WorldInfoTest, UnderSrunTheMasterIsTheFirstNodeAndThePortFollowsTheJob) {
  auto info = world_from_environment(env_of(srun_task_9()));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->source, "slurm");
  EXPECT_EQ(info->rank, 9);
  EXPECT_EQ(info->world_size, 16);
  EXPECT_EQ(info->local_rank, 1);
  EXPECT_EQ(info->local_world_size, 4);
  EXPECT_EQ(info->master_addr, "gpu001");
  EXPECT_EQ(info->master_addr_origin, "the first host of SLURM_STEP_NODELIST");
  EXPECT_EQ(info->master_port, 20000 + 123456 % 10000);
  EXPECT_EQ(info->master_port, slurm_default_master_port(123456));

  // A fallback (the program's DISTRIBUTED.RUN_ID) wins over the job's default port, and
  // MASTER_ADDR / MASTER_PORT exported by the batch script win over both.
  info = world_from_environment(env_of(srun_task_9()), MasterPortFallback{29873, "DISTRIBUTED.RUN_ID"});
  EXPECT_EQ(info->master_port, 29873);
  EXPECT_EQ(info->master_port_origin, "DISTRIBUTED.RUN_ID");
  auto exported = srun_task_9();
  exported["MASTER_ADDR"] = "10.1.2.3";
  exported["MASTER_PORT"] = "29600";
  info = world_from_environment(env_of(exported), MasterPortFallback{29873, "DISTRIBUTED.RUN_ID"});
  EXPECT_EQ(info->master_addr, "10.1.2.3");
  EXPECT_EQ(info->master_port, 29600);
}

TEST(WorldInfoTest, SrunWithoutNtasksCountsNodesTimesTasksPerNode) {
  auto variables = srun_task_9();
  variables.erase("SLURM_NTASKS");
  variables.erase("SLURM_STEP_NODELIST");
  variables["SLURM_NTASKS_PER_NODE"] = "4(x4)";
  auto info = world_from_environment(env_of(variables));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->world_size, 16);
  EXPECT_EQ(info->local_world_size, 4);
  EXPECT_EQ(info->master_addr, "gpu001");
  EXPECT_EQ(info->master_addr_origin, "the first host of SLURM_JOB_NODELIST");
}

TEST(WorldInfoTest, ABadSlurmNodeListIsAnErrorNamingIt) {
  auto variables = srun_task_9();
  variables["SLURM_STEP_NODELIST"] = "gpu[001-";
  try {
    world_from_environment(env_of(variables));
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_STEP_NODELIST"), std::string::npos) << e.what();
  }
}

TEST(WorldInfoTest, ReadsTorchrunsAgentStoreAndAttempt) {
  auto info = world_from_environment(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"TORCHELASTIC_RESTART_COUNT", "3"}}));
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->launcher_serves_store);
  EXPECT_EQ(info->restart_count, 3);
  info = world_from_environment(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"},
                                        {"TORCHELASTIC_USE_AGENT_STORE", "False"}}));
  EXPECT_FALSE(info->launcher_serves_store);
  EXPECT_EQ(info->restart_count, 0);
}

TEST(WorldInfoTest, FindsAFreePort) {
  int port = find_free_port();
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

} // namespace
} // namespace largo::comm::world_info_test
