// StatePlacements on its own: what its questions answer for each kind of placement, how it
// describes them, and a name that is not a trained parameter.
#include <largo/core/error.h>
#include <largo/parallel/mesh/placement.h>

#include <gtest/gtest.h>

namespace largo::parallel::placement_test {
namespace {

StatePlacements two_parameters() {
  return StatePlacements({{"fc.weight", {4, 8}, {}, {}}, {"fc.bias", {4}, {}, {}}});
}

TEST(PlacementTest, ReplicatedEverywhereHoldsTheWholeModel) {
  const StatePlacements placements = two_parameters();
  EXPECT_TRUE(placements.module_holds_whole_model());
  EXPECT_FALSE(placements.module_holds_gathered_copies());
  EXPECT_TRUE(placements.cover_whole_model());
  EXPECT_FALSE(placements.optimizer_state_in_flat_pieces());
  EXPECT_EQ(placements.describe(), "value {}, optimizer state {}: 2 parameters");
}

TEST(PlacementTest, EachKindAnswersItsQuestion) {
  StatePlacements zero = two_parameters(); // ZeRO-1/2: the values stay whole
  zero.place_all("dp", Placement::replicate(), Placement::flat_shard());
  EXPECT_TRUE(zero.module_holds_whole_model());
  EXPECT_TRUE(zero.optimizer_state_in_flat_pieces());
  EXPECT_EQ(zero.describe(), "value {}, optimizer state {dp: FlatShard}: 2 parameters");

  StatePlacements fsdp = two_parameters();
  fsdp.place_all("dp", Placement::flat_shard(), Placement::flat_shard());
  EXPECT_FALSE(fsdp.module_holds_whole_model());
  EXPECT_TRUE(fsdp.module_holds_gathered_copies());
  EXPECT_TRUE(fsdp.optimizer_state_in_flat_pieces());

  StatePlacements split = two_parameters(); // a column-parallel layer: the weight and bias
  split.place("fc.weight", "tp", Placement::shard(0), Placement::shard(0));
  EXPECT_FALSE(split.module_holds_whole_model());
  EXPECT_FALSE(split.module_holds_gathered_copies());
  EXPECT_EQ(
      split.describe(),
      "value {tp: Shard(0)}, optimizer state {tp: Shard(0)}: 1 parameter; "
      "value {}, optimizer state {}: 1 parameter");
  // ZeRO over "dp" beside tensor parallelism: pieces of slices, consolidated for checkpoints.
  split.place_all("dp", Placement::replicate(), Placement::flat_shard());
  EXPECT_FALSE(split.optimizer_state_in_flat_pieces());

  StatePlacements stage = two_parameters();
  stage.place_all("pp", Placement::owned_by(1), Placement::owned_by(1));
  EXPECT_FALSE(stage.cover_whole_model());
  EXPECT_FALSE(stage.module_holds_whole_model());
  stage.place_all("dp", Placement::replicate(), Placement::flat_shard()); // ZeRO-1 per stage
  EXPECT_FALSE(stage.optimizer_state_in_flat_pieces());
  EXPECT_EQ(Placement::shard(0, 3).describe(), "Shard(0, 3 blocks)");
  EXPECT_EQ(Placement::owned_by(1).describe(), "OwnedBy(1)");
}

// The order ParallelModel's whole-state calls undo the dimensions in: slices (Shard) before
// stages (OwnedBy), whatever order the strategies placed them in; flat pieces and replicated
// dimensions not at all; values and optimizer state each by their own placements.
TEST(PlacementTest, DimensionsToGatherRunFromSlicesToStages) {
  StatePlacements three_d = two_parameters();
  three_d.place_all("pp", Placement::owned_by(0), Placement::owned_by(0));
  three_d.place_all("dp", Placement::replicate(), Placement::flat_shard()); // ZeRO-1
  three_d.place("fc.weight", "tp", Placement::shard(1), Placement::shard(1));
  const std::vector<std::string> slices_then_stages{"tp", "pp"};
  EXPECT_EQ(three_d.dimensions_to_gather(/*optimizer_state=*/false), slices_then_stages);
  EXPECT_EQ(three_d.dimensions_to_gather(/*optimizer_state=*/true), slices_then_stages);

  StatePlacements fsdp = two_parameters();
  fsdp.place_all("dp", Placement::flat_shard(), Placement::flat_shard());
  EXPECT_TRUE(fsdp.dimensions_to_gather(false).empty());
  EXPECT_TRUE(two_parameters().dimensions_to_gather(true).empty());

  // A pipeline rank whose stages train nothing still owns them: it joins the stages' merge.
  StatePlacements frozen_stage({});
  frozen_stage.place_all("pp", Placement::owned_by(1), Placement::owned_by(1));
  EXPECT_EQ(frozen_stage.dimensions_to_gather(false), std::vector<std::string>{"pp"});
  EXPECT_EQ(frozen_stage.dimensions_to_gather(true), std::vector<std::string>{"pp"});

  StatePlacements state_only = two_parameters(); // a placement of the optimizer state alone
  state_only.place("fc.bias", "tp", Placement::replicate(), Placement::shard(0));
  EXPECT_TRUE(state_only.dimensions_to_gather(false).empty());
  EXPECT_EQ(state_only.dimensions_to_gather(true), std::vector<std::string>{"tp"});
}

TEST(PlacementTest, PlacingAnUnknownNameIsAnError) {
  StatePlacements placements = two_parameters();
  EXPECT_THROW(
      placements.place("head.weight", "tp", Placement::shard(1), Placement::shard(1)),
      largo::Error);
}

} // namespace
} // namespace largo::parallel::placement_test
