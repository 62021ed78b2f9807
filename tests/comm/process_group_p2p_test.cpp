// Point-to-point messages and sub-groups, in closed form over Gloo on 127.0.0.1: what a
// pipeline of stages and its 2-D layout (pipeline x data parallel) need from comm.
#include <largo/comm/process_group.h>
#include <largo/core/error.h>

#include "comm/distributed_test_util.h"

namespace largo::comm::process_group_p2p_test {
namespace {

using largo::testing::run_on_ranks;

// Each rank sends to the next one around a ring and receives from the previous one.
TEST(PointToPointTest, RingOfThreeRanks) {
  run_on_ranks(3, [](ProcessGroup& group) {
    const int world = group.world_size();
    const int next = (group.rank() + 1) % world;
    const int previous = (group.rank() + world - 1) % world;
    at::Tensor outgoing = at::arange(6, at::kFloat).reshape({2, 3}) + 100.0f * group.rank();
    at::Tensor incoming = at::empty({2, 3}, at::kFloat);
    Work received = group.recv_async(incoming, previous, /*tag=*/7);
    group.send(outgoing, next, /*tag=*/7);
    received.wait();
    EXPECT_TRUE(incoming.equal(at::arange(6, at::kFloat).reshape({2, 3}) + 100.0f * previous));
  });
}

// Messages with different tags pair by tag, whatever the order the receiver posts them in;
// messages with the same tag pair in issue order. bfloat16 travels bit for bit.
TEST(PointToPointTest, TagsPairMessagesPostedInAnyOrder) {
  run_on_ranks(2, [](ProcessGroup& group) {
    if (group.rank() == 0) {
      for (int tag = 0; tag < 4; ++tag) {
        group.send_async(at::full({5}, static_cast<double>(tag), at::kDouble), 1, tag).wait();
      }
      group.send(at::full({3}, 1.5, at::kBFloat16), 1, 9);
      group.send(at::full({3}, 2.5, at::kBFloat16), 1, 9);
      return;
    }
    std::vector<at::Tensor> received;
    std::vector<Work> works;
    for (int tag = 3; tag >= 0; --tag) { // reverse order
      received.push_back(at::empty({5}, at::kDouble));
      works.push_back(group.recv_async(received.back(), 0, tag));
    }
    for (auto& work : works) {
      work.wait();
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(received[i].equal(at::full({5}, 3.0 - i, at::kDouble))) << i;
    }
    at::Tensor first = at::empty({3}, at::kBFloat16);
    at::Tensor second = at::empty({3}, at::kBFloat16);
    group.recv(first, 0, 9);
    group.recv(second, 0, 9);
    EXPECT_TRUE(first.equal(at::full({3}, 1.5, at::kBFloat16)));
    EXPECT_TRUE(second.equal(at::full({3}, 2.5, at::kBFloat16)));
  });
}

TEST(PointToPointTest, BadPeerOrTagIsAnError) {
  auto single = ProcessGroup::single_process();
  EXPECT_THROW(single->send(at::zeros({1}), 0), Error);
  run_on_ranks(2, [](ProcessGroup& group) {
    EXPECT_THROW(group.send(at::zeros({1}), group.rank()), Error); // itself
    EXPECT_THROW(group.recv(at::zeros({1}), 2), Error);            // outside the group
    EXPECT_THROW(group.send(at::zeros({1}), 1 - group.rank(), -1), Error);
    EXPECT_THROW(group.send(at::zeros({4}).t().expand({2, 4}), 1 - group.rank()), c10::Error);
  });
}

// 4 ranks as 2 x 2: rows {0,1} {2,3} and columns {0,2} {1,3}. Every rank creates every group
// in the same order; each collective then involves only its group's ranks.
TEST(SubGroupTest, RowsAndColumnsOfATwoByTwoLayout) {
  run_on_ranks(4, [](ProcessGroup& world) {
    const int rank = world.rank();
    std::shared_ptr<ProcessGroup> row, column;
    for (int r = 0; r < 2; ++r) {
      auto group = world.new_group({2 * r, 2 * r + 1});
      EXPECT_EQ(group != nullptr, rank / 2 == r);
      if (group) {
        row = group;
      }
    }
    for (int c = 0; c < 2; ++c) {
      auto group = world.new_group({c + 2, c}); // listed in reverse: rank c+2 is rank 0
      if (group) {
        column = group;
      }
    }
    ASSERT_TRUE(row && column);
    EXPECT_EQ(row->world_size(), 2);
    EXPECT_EQ(row->rank(), rank % 2);
    EXPECT_EQ(column->rank(), rank / 2 == 1 ? 0 : 1);
    EXPECT_EQ(column->global_rank(0), rank % 2 + 2);
    EXPECT_EQ(row->global_rank(1), rank / 2 * 2 + 1);

    // Sum of the world ranks of each row: {0+1, 2+3}; of each column: {0+2, 1+3}.
    at::Tensor row_sum = at::full({2}, static_cast<float>(rank));
    row->all_reduce(row_sum);
    EXPECT_TRUE(row_sum.equal(at::full({2}, rank / 2 == 0 ? 1.0f : 5.0f)));
    at::Tensor column_sum = at::full({2}, static_cast<float>(rank));
    column->all_reduce(column_sum);
    EXPECT_TRUE(column_sum.equal(at::full({2}, rank % 2 == 0 ? 2.0f : 4.0f)));

    // Point to point inside a column: group rank 0 (world rank c+2) sends to group rank 1.
    at::Tensor message = at::full({3}, static_cast<float>(rank));
    if (column->rank() == 0) {
      column->send(message, 1, 0);
    } else {
      column->recv(message, 0, 0);
      EXPECT_TRUE(message.equal(at::full({3}, static_cast<float>(rank + 2))));
    }
    // Sub-groups of a sub-group: one of a single rank each, then the whole row again.
    auto first = row->new_group({0});
    auto second = row->new_group({1});
    auto self = row->rank() == 0 ? first : second;
    ASSERT_TRUE(self);
    EXPECT_FALSE(row->rank() == 0 ? second : first);
    EXPECT_EQ(self->world_size(), 1);
    EXPECT_EQ(self->global_rank(0), rank);
    auto whole_row = row->new_group({1, 0});
    ASSERT_TRUE(whole_row);
    at::Tensor value = at::full({1}, static_cast<float>(rank));
    whole_row->broadcast(value, 0); // its rank 0 is the row's rank 1
    EXPECT_EQ(value.item<float>(), static_cast<float>(rank / 2 * 2 + 1));
    world.barrier();
  });
}

TEST(SubGroupTest, BadRankListsAreConfigErrors) {
  auto single = ProcessGroup::single_process();
  EXPECT_THROW(single->new_group({}), ConfigError);
  EXPECT_THROW(single->new_group({0, 0}), ConfigError);
  EXPECT_THROW(single->new_group({1}), ConfigError);
  auto self = single->new_group({0});
  ASSERT_TRUE(self);
  EXPECT_EQ(self->world_size(), 1);
}

} // namespace
} // namespace largo::comm::process_group_p2p_test
