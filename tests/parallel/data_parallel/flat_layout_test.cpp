// Shard arithmetic as functions of (sizes, world size, rank): no processes needed.
#include <largo/core/error.h>
#include <largo/parallel/data_parallel/flat_layout.h>

#include <gtest/gtest.h>

namespace largo::parallel::flat_layout_test {
namespace {

TEST(FlatLayoutTest, PadsToAMultipleOfTheWorldSize) {
  FlatLayout layout({5, 3, 4}, 5);
  EXPECT_EQ(layout.total_numel(), 12);
  EXPECT_EQ(layout.shard_numel(), 3); // ceil(12 / 5)
  EXPECT_EQ(layout.padded_numel(), 15);
  EXPECT_EQ(layout.offset(0), 0);
  EXPECT_EQ(layout.offset(1), 5);
  EXPECT_EQ(layout.offset(2), 8);
}

TEST(FlatLayoutTest, PiecesMatchTheHeaderExample) {
  FlatLayout layout({5, 3, 4}, 2); // shards of 6: [0, 6) and [6, 12)
  auto rank0 = layout.pieces_of_rank(0);
  ASSERT_EQ(rank0.size(), 2u);
  EXPECT_EQ(rank0[0].tensor_index, 0u);
  EXPECT_EQ(rank0[0].numel, 5);
  EXPECT_EQ(rank0[1].tensor_index, 1u);
  EXPECT_EQ(rank0[1].tensor_offset, 0);
  EXPECT_EQ(rank0[1].numel, 1);
  auto rank1 = layout.pieces_of_rank(1);
  ASSERT_EQ(rank1.size(), 2u);
  EXPECT_EQ(rank1[0].tensor_index, 1u);
  EXPECT_EQ(rank1[0].tensor_offset, 1);
  EXPECT_EQ(rank1[0].flat_offset, 6);
  EXPECT_EQ(rank1[0].numel, 2);
  EXPECT_EQ(rank1[1].tensor_index, 2u);
  EXPECT_EQ(rank1[1].numel, 4);
}

// Over many shapes and world sizes: the pieces of all ranks tile every tensor exactly once,
// each piece lies inside its rank's shard, and pieces_of_tensor agrees with pieces_of_rank.
TEST(FlatLayoutTest, PiecesTileEveryTensorExactlyOnce) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1}, {7}, {3, 0, 5}, {100, 1, 1, 1, 37}, {4, 4, 4, 4}, {11, 13, 17, 19, 23}};
  for (const auto& numels : shapes) {
    for (int world = 1; world <= 7; ++world) {
      FlatLayout layout(numels, world);
      std::vector<std::vector<int>> owner_of(numels.size());
      for (size_t t = 0; t < numels.size(); ++t) {
        owner_of[t].assign(numels[t], -1);
      }
      for (int rank = 0; rank < world; ++rank) {
        for (const ShardPiece& piece : layout.pieces_of_rank(rank)) {
          EXPECT_GE(piece.flat_offset, rank * layout.shard_numel());
          EXPECT_LE(piece.flat_offset + piece.numel, (rank + 1) * layout.shard_numel());
          EXPECT_EQ(piece.flat_offset, layout.offset(piece.tensor_index) + piece.tensor_offset);
          for (int64_t i = 0; i < piece.numel; ++i) {
            int& owner = owner_of[piece.tensor_index][piece.tensor_offset + i];
            EXPECT_EQ(owner, -1) << "element owned twice";
            owner = rank;
          }
        }
      }
      for (size_t t = 0; t < numels.size(); ++t) {
        for (int owner : owner_of[t]) {
          EXPECT_GE(owner, 0) << "element owned by nobody";
        }
        for (const auto& [rank, piece] : layout.pieces_of_tensor(t)) {
          for (int64_t i = 0; i < piece.numel; ++i) {
            EXPECT_EQ(owner_of[t][piece.tensor_offset + i], rank);
          }
        }
      }
    }
  }
}

TEST(FlatLayoutTest, RejectsBadArguments) {
  EXPECT_THROW(FlatLayout({1, 2}, 0), ConfigError);
  EXPECT_THROW(FlatLayout({1, -2}, 2), ConfigError);
}

} // namespace
} // namespace largo::parallel::flat_layout_test
