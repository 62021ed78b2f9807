// The mesh's layout and data shards as pure functions of (rank, sizes) over several layouts,
// and on 8 Gloo ranks the groups of every dimension: their members, their numbering and an
// all-reduce over each (the sum of the members' world ranks, in closed form).
#include <largo/core/error.h>
#include <largo/parallel/mesh/device_mesh.h>

#include "comm/distributed_test_util.h"

#include <gtest/gtest.h>

namespace largo::parallel::device_mesh_test {
namespace {

using largo::testing::run_on_ranks;

TEST(DeviceMeshTest, LayoutIsRowMajorWithTheLastDimensionInnermost) {
  const auto dimensions = pp_dp_tp_dimensions(2, 3, 2); // world 12
  for (int rank = 0; rank < 12; ++rank) {
    const auto coordinates = mesh_coordinates(rank, dimensions);
    EXPECT_EQ(rank, (coordinates[0] * 3 + coordinates[1]) * 2 + coordinates[2]);
    EXPECT_EQ(mesh_rank(coordinates, dimensions), rank);
  }
  EXPECT_EQ(mesh_coordinates(11, dimensions), (std::vector<int>{1, 2, 1}));
  EXPECT_EQ(mesh_coordinates(7, dimensions), (std::vector<int>{1, 0, 1}));
  // A group varies one coordinate: the pipeline of rank 7 is its rank in stage 0 and 1.
  EXPECT_EQ(mesh_group_ranks(7, 0, dimensions), (std::vector<int>{1, 7}));
  EXPECT_EQ(mesh_group_ranks(7, 1, dimensions), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(mesh_group_ranks(7, 2, dimensions), (std::vector<int>{6, 7}));
}

TEST(DeviceMeshTest, WithoutTensorParallelismTheLayoutIsStageTimesReplicas) {
  // tp = 1: world rank = stage * D + replica, the pipeline layout Largo has always used.
  for (const auto& [pp, dp] : std::vector<std::pair<int, int>>{{1, 4}, {2, 2}, {4, 1}, {3, 2}}) {
    const auto dimensions = pp_dp_tp_dimensions(pp, dp);
    for (int rank = 0; rank < pp * dp; ++rank) {
      EXPECT_EQ(mesh_coordinates(rank, dimensions), (std::vector<int>{rank / dp, rank % dp, 0}));
      EXPECT_EQ(data_shard(rank, dimensions), (DataShard{rank % dp, dp}));
    }
  }
}

TEST(DeviceMeshTest, OnlyDataParallelReplicasReadDifferentData) {
  for (const auto& [pp, dp, tp] : std::vector<std::tuple<int, int, int>>{
           {1, 1, 1}, {1, 8, 1}, {2, 2, 2}, {1, 2, 4}, {4, 1, 2}, {2, 3, 1}}) {
    const auto dimensions = pp_dp_tp_dimensions(pp, dp, tp);
    const int world = pp * dp * tp;
    for (int a = 0; a < world; ++a) {
      const DataShard shard = data_shard(a, dimensions);
      EXPECT_EQ(shard.count, dp);
      EXPECT_EQ(shard.index, mesh_coordinates(a, dimensions)[1]);
      for (int b = 0; b < world; ++b) { // same data exactly when the dp coordinates agree
        EXPECT_EQ(
            data_shard(b, dimensions) == shard,
            mesh_coordinates(b, dimensions)[1] == mesh_coordinates(a, dimensions)[1])
            << "pp " << pp << " dp " << dp << " tp " << tp << " ranks " << a << ", " << b;
      }
    }
  }
  // No data dimension: every rank reads everything.
  EXPECT_EQ(data_shard(3, {{"pp", 2}, {"tp", 2}}), (DataShard{0, 1}));
}

TEST(DeviceMeshTest, SizesMustMultiplyToTheWorldSize) {
  try {
    check_mesh_dimensions(pp_dp_tp_dimensions(3, 1, 1), 8);
    ADD_FAILURE() << "pp(3) * dp(1) * tp(1) accepted for a world of 8";
  } catch (const OptionError& error) {
    EXPECT_EQ(error.option(), "DeviceMesh dimensions");
    EXPECT_NE(
        std::string(error.what()).find("pp(3) * dp(1) * tp(1) = 3 != world size (8)"),
        std::string::npos)
        << error.what();
  }
  EXPECT_THROW(check_mesh_dimensions(pp_dp_tp_dimensions(0, 8, 1), 0), OptionError);
  EXPECT_THROW(check_mesh_dimensions({{"dp", 2}, {"dp", 2}}, 4), OptionError);
  EXPECT_NO_THROW(check_mesh_dimensions(pp_dp_tp_dimensions(2, 2, 2), 8));
}

TEST(DeviceMeshTest, EachDimensionsGroupHoldsTheRanksAlongIt) {
  run_on_ranks(8, [](comm::ProcessGroup& world) {
    const DeviceMesh mesh(world, pp_dp_tp_dimensions(2, 2, 2));
    const int rank = world.rank();
    const int pp = rank / 4, dp = rank / 2 % 2, tp = rank % 2;
    EXPECT_EQ(mesh.coordinate("pp"), pp);
    EXPECT_EQ(mesh.coordinate("dp"), dp);
    EXPECT_EQ(mesh.coordinate("tp"), tp);
    EXPECT_EQ(mesh.size("dp"), 2);
    EXPECT_EQ(&mesh.world(), &world);
    EXPECT_EQ(mesh.data_shard(), (DataShard{dp, 2}));
    const std::map<std::string, std::vector<int>> expected{
        {"pp", {dp * 2 + tp, 4 + dp * 2 + tp}},
        {"dp", {pp * 4 + tp, pp * 4 + 2 + tp}},
        {"tp", {pp * 4 + dp * 2, pp * 4 + dp * 2 + 1}},
    };
    for (const auto& [name, members] : expected) {
      comm::ProcessGroup& group = *mesh.group(name);
      ASSERT_EQ(group.world_size(), 2) << name;
      EXPECT_EQ(group.rank(), mesh.coordinate(name)) << name;
      for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(group.global_rank(i), members[static_cast<size_t>(i)]) << name;
      }
      at::Tensor sum = at::tensor({static_cast<int64_t>(rank)});
      group.all_reduce(sum, comm::ReduceOp::kSum);
      EXPECT_EQ(sum.item<int64_t>(), members[0] + members[1]) << name;
    }
    EXPECT_EQ(
        mesh.describe(),
        fmt::format(
            "world 8 = pp(2) * dp(2) * tp(2) (world rank = (pp * 2 + dp) * 2 + tp); "
            "this rank {}: pp {}, dp {}, tp {}",
            rank,
            pp,
            dp,
            tp));
    EXPECT_THROW(mesh.group("cp"), OptionError);
  });
}

} // namespace
} // namespace largo::parallel::device_mesh_test
