// Reading a rank's place in the job from torchrun / largo launch, SLURM and Open MPI
// variables.
#include <largo/comm/world_info.h>
#include <largo/core/error.h>

#include <gtest/gtest.h>

#include <map>
#include <string>

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

TEST(WorldInfoTest, FindsAFreePort) {
  int port = find_free_port();
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
}

} // namespace
} // namespace largo::comm::world_info_test
