// Collectives in closed form (each rank contributes values derived from its rank, so every
// result is known), over Gloo on 127.0.0.1 with 2 and 3 ranks; and the failures a user
// meets: a dead peer, a stalled peer, a taken port, an absent master, mismatched world sizes.
#include <largo/comm/process_group.h>
#include <largo/core/error.h>

#include "../../src/largo/comm/failure_advice.h"
#include "comm/distributed_test_util.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace largo::comm::process_group_test {
namespace {

using largo::testing::run_on_ranks;
using largo::testing::run_processes;

std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, AllReduceSumMaxMin) {
  run_on_ranks(GetParam(), [](ProcessGroup& group) {
    const int world = group.world_size();
    const float rank = static_cast<float>(group.rank());
    at::Tensor sum = at::arange(5, at::kFloat) + rank; // element i: i + rank
    group.all_reduce(sum);
    // sum over r of (i + r) = world * i + world * (world - 1) / 2
    at::Tensor expected = at::arange(5, at::kFloat) * world + world * (world - 1) / 2.0;
    EXPECT_TRUE(sum.equal(expected)) << sum;

    at::Tensor max = at::full({3}, rank, at::kDouble);
    group.all_reduce(max, ReduceOp::kMax);
    EXPECT_TRUE(max.equal(at::full({3}, world - 1.0, at::kDouble)));
    at::Tensor min = at::full({3}, rank + 10, at::kLong);
    group.all_reduce(min, ReduceOp::kMin);
    EXPECT_TRUE(min.equal(at::full({3}, 10, at::kLong)));
  });
}

TEST_P(CollectivesTest, BroadcastAndReduceFromEveryRoot) {
  run_on_ranks(GetParam(), [](ProcessGroup& group) {
    const int world = group.world_size();
    for (int root = 0; root < world; ++root) {
      at::Tensor value = at::full({2, 3}, static_cast<float>(group.rank() * 100 + 7));
      group.broadcast(value, root);
      EXPECT_TRUE(value.equal(at::full({2, 3}, static_cast<float>(root * 100 + 7))));

      at::Tensor partial = at::full({4}, static_cast<float>(group.rank() + 1));
      group.reduce(partial, root);
      if (group.rank() == root) {
        EXPECT_TRUE(partial.equal(at::full({4}, world * (world + 1) / 2.0f)));
      }
    }
  });
}

TEST_P(CollectivesTest, AllGatherPlacesRankRAtOffsetRTimesN) {
  run_on_ranks(GetParam(), [](ProcessGroup& group) {
    const int world = group.world_size();
    const int64_t n = 5;
    at::Tensor input = at::arange(n, at::kFloat) + 10.0f * group.rank();
    at::Tensor output = at::full({world * n}, -1.0f);
    group.all_gather(output, input);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(output.narrow(0, r * n, n).equal(at::arange(n, at::kFloat) + 10.0f * r));
    }
  });
}

TEST_P(CollectivesTest, ReduceScatterGivesRankItsPartOfTheSum) {
  run_on_ranks(GetParam(), [](ProcessGroup& group) {
    const int world = group.world_size();
    const int64_t n = 4;
    // Element j of rank r's input: j + r; the sum over ranks: world * j + world(world-1)/2.
    at::Tensor input = at::arange(world * n, at::kDouble) + group.rank();
    at::Tensor output = at::zeros({n}, at::kDouble);
    group.reduce_scatter(output, input);
    at::Tensor j = at::arange(group.rank() * n, (group.rank() + 1) * n, at::kDouble);
    EXPECT_TRUE(output.equal(j * world + world * (world - 1) / 2.0)) << output;
  });
}

TEST_P(CollectivesTest, AsyncCollectivesCompleteInAnyWaitOrder) {
  run_on_ranks(GetParam(), [](ProcessGroup& group) {
    const int world = group.world_size();
    std::vector<at::Tensor> tensors;
    std::vector<Work> works;
    for (int i = 0; i < 4; ++i) {
      tensors.push_back(at::full({1000}, static_cast<float>(i * group.rank())));
      works.push_back(group.all_reduce_async(tensors.back()));
    }
    for (int i = 3; i >= 0; --i) {
      works[i].wait();
      EXPECT_TRUE(tensors[i].equal(at::full({1000}, i * world * (world - 1) / 2.0f)));
    }
    group.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest, ::testing::Values(2, 3),
                         [](const auto& info) { return fmt::format("world{}", info.param); });

TEST(SingleProcessGroupTest, CollectivesAreIdentities) {
  auto group = ProcessGroup::single_process();
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->world_size(), 1);
  at::Tensor value = at::arange(6, at::kFloat);
  group->all_reduce(value);
  group->broadcast(value, 0);
  group->reduce(value, 0);
  EXPECT_TRUE(value.equal(at::arange(6, at::kFloat)));
  at::Tensor gathered = at::zeros({6});
  group->all_gather(gathered, value);
  EXPECT_TRUE(gathered.equal(value));
  at::Tensor scattered = at::zeros({6});
  group->reduce_scatter(scattered, value);
  EXPECT_TRUE(scattered.equal(value));
  group->barrier();
}

TEST(ProcessGroupFailureTest, DeadPeerRaisesCommErrorInsteadOfHanging) {
  run_on_ranks(2, [](ProcessGroup& group) {
    // Both ranks finish one collective before rank 1 leaves: leaving while the peer is still
    // connecting makes a set-up error instead (seen in CI under the sanitizers), and once
    // rank 1's collective is done rank 0 is past its set-up.
    if (group.rank() == 1) {
      group.all_reduce(at::ones({1000}));
      return; // rank 1 exits without joining the next collective: its sockets close
    }
    const auto start = std::chrono::steady_clock::now();
    std::string message = message_of([&] {
      for (int i = 0; i < 100; ++i) { // the first calls may complete before the exit is seen
        group.all_reduce(at::ones({1000}));
      }
    });
    EXPECT_NE(message.find("all_reduce"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 0 of 2"), std::string::npos) << message;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  });
}

// The race behind the test above: when this rank writes to the dead peer's closed socket
// before it reads the close, Gloo's writev raises SIGPIPE, which by default kills the process
// with no message (seen once in CI under the sanitizers). A group of several ranks makes the
// write fail with EPIPE instead, i.e. a CommError.
TEST(ProcessGroupFailureTest, AGroupOfSeveralRanksIgnoresBrokenPipes) {
  run_on_ranks(2, [](ProcessGroup& group) {
    struct sigaction current {};
    ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &current), 0);
    EXPECT_EQ(current.sa_handler, SIG_IGN) << "SIGPIPE would kill a rank whose peer died";
    group.barrier(); // neither rank leaves while the other is still connecting
  });
}

TEST(ProcessGroupFailureTest, StalledPeerTimesOutWithAClearError) {
  largo::testing::RankRunOptions options;
  options.collective_timeout = std::chrono::seconds(2);
  run_on_ranks(
      2,
      [](ProcessGroup& group) {
        if (group.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(6)); // never joins
          return;
        }
        std::string message = message_of([&] { group.all_reduce(at::ones({10})); });
        EXPECT_NE(message.find("all_reduce"), std::string::npos) << message;
        EXPECT_NE(message.find("COLLECTIVE_TIMEOUT_SECONDS"), std::string::npos) << message;
      },
      options);
}

TEST(ProcessGroupFailureTest, StoppedPeerIsNamedWithItsLastCollectiveWithoutTrace) {
  // Rank 1 runs two collectives, then stops itself (SIGSTOP) before the third; rank 0's
  // third times out and must name rank 1, what it was last doing, and no C++ frames. Rank 0
  // then continues rank 1 (SIGCONT) so the test ends.
  largo::testing::RankRunOptions options;
  options.collective_timeout = std::chrono::seconds(3);
  const std::string pid_file =
      fmt::format("/tmp/largo_stopped_peer_{}", std::getenv("MASTER_PORT") ? std::getenv("MASTER_PORT") : "0");
  run_on_ranks(
      2,
      [&](ProcessGroup& group) {
        group.all_reduce(at::ones({10}));
        group.broadcast(at::ones({1024}), 0);
        if (group.rank() == 1) {
          std::ofstream(pid_file) << ::getpid();
          // The beacon publishes within a quarter heartbeat of a collective's start.
          std::this_thread::sleep_for(std::chrono::milliseconds(600));
          ::raise(SIGSTOP);
          return; // continued by rank 0
        }
        const auto start = std::chrono::steady_clock::now();
        std::string message = message_of([&] { group.all_reduce(at::ones({10})); });
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
        EXPECT_NE(
            message.find("all_reduce of 40 B (collective #3) on rank 0 of 2"), std::string::npos)
            << message;
        EXPECT_NE(message.find("rank 1 stopped making progress"), std::string::npos) << message;
        EXPECT_NE(message.find("its collective #2, broadcast of 4.00 KiB"), std::string::npos)
            << message;
        EXPECT_EQ(message.find("frame #"), std::string::npos) << message;
        EXPECT_EQ(message.find("Exception raised from"), std::string::npos) << message;
        pid_t peer = 0;
        std::ifstream(pid_file) >> peer;
        ASSERT_GT(peer, 0);
        ::kill(peer, SIGCONT);
        std::remove(pid_file.c_str());
      },
      options);
}

TEST(ProcessGroupFailureTest, PortInUseIsNamed) {
  // Hold a listening socket on a port, then ask rank 0 to serve the rendezvous there.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ProcessGroupOptions options;
  options.rank = 0;
  options.world_size = 2;
  options.master_port = ntohs(address.sin_port);
  options.rendezvous_timeout = std::chrono::seconds(2);
  std::string message = message_of([&] { ProcessGroup::create(options); });
  ::close(fd);
  EXPECT_NE(message.find("already in use"), std::string::npos) << message;
  EXPECT_NE(message.find(std::to_string(options.master_port)), std::string::npos) << message;
}

TEST(ProcessGroupFailureTest, UnreachableMasterIsNamed) {
  ProcessGroupOptions options;
  options.rank = 1;
  options.world_size = 2;
  options.master_port = find_free_port(); // nobody serves it
  options.rendezvous_timeout = std::chrono::seconds(2);
  std::string message = message_of([&] { ProcessGroup::create(options); });
  EXPECT_NE(message.find("could not reach the rendezvous master at 127.0.0.1:" +
                         std::to_string(options.master_port)),
            std::string::npos)
      << message;
}

TEST(ProcessGroupFailureTest, WorldSizeMismatchIsNamed) {
  largo::testing::RankRunOptions options;
  // Rank 1 believes the job has 3 processes; rank 0 that it has 2.
  options.extra_env = [](int rank) {
    return std::map<std::string, std::string>{{"WORLD_SIZE", rank == 1 ? "3" : "2"}};
  };
  run_processes(
      2,
      [](int rank) {
        auto world = world_from_environment();
        ASSERT_TRUE(world.has_value());
        ProcessGroupOptions group_options;
        group_options.rank = world->rank;
        group_options.world_size = world->world_size;
        group_options.master_port = world->master_port;
        group_options.rendezvous_timeout = std::chrono::seconds(10);
        std::string message = message_of([&] { ProcessGroup::create(group_options); });
        EXPECT_NE(message.find("world size mismatch"), std::string::npos) << message;
      },
      options);
}

// torchrun's agent serves the job's store and keeps it across restarts
// (TORCHELASTIC_USE_AGENT_STORE=True): here the test process plays the agent. Attempt 0 and
// then attempt 1 (TORCHELASTIC_RESTART_COUNT) of a 2-rank job meet in the same store; the
// second must not read the first one's rank claims or Gloo addresses, and rank 0 must not try
// to serve the agent's port itself.
TEST(ProcessGroupLauncherStoreTest, EachAttemptMeetsInTheLaunchersStoreAfresh) {
  c10::intrusive_ptr<c10d::TCPStore> agent_store;
  if (largo::testing::is_parent()) {
    c10d::TCPStoreOptions store_options;
    store_options.port = 0; // any free port
    store_options.isServer = true;
    store_options.waitWorkers = false;
    agent_store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_options);
  }
  const int agent_port = agent_store ? agent_store->getPort() : 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    largo::testing::RankRunOptions options;
    options.extra_env = [&](int) {
      return std::map<std::string, std::string>{
          {"MASTER_PORT", std::to_string(agent_port)},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)}};
    };
    run_processes(
        2,
        [](int rank) {
          ProcessGroupOptions group_options;
          group_options.rendezvous_timeout = std::chrono::seconds(20);
          group_options.gloo_threads = 1;
          auto group = ProcessGroup::from_environment(group_options);
          ASSERT_EQ(group->world_size(), 2);
          at::Tensor value = at::full({4}, static_cast<float>(rank + 1));
          group->all_reduce(value);
          EXPECT_TRUE(value.eq(1 + 2).all().item<bool>()) << value;
          group->barrier();
        },
        options);
  }
}

// NCCL's "invalid usage" (seen on an H200 with two ranks on one GPU) is a refusal, not a lost
// peer; c10d's wording of it, as it came back there.
TEST(ProcessGroupFailureTest, NcclRefusalIsNotBlamedOnADeadPeer) {
  const std::string refused =
      "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run "
      "with NCCL_DEBUG=WARN for details), NCCL version 2.28.9";
  const std::string advice = detail::launch_failure_advice(refused);
  EXPECT_NE(advice.find("NCCL refused the call"), std::string::npos) << advice;
  EXPECT_NE(advice.find("one GPU per rank"), std::string::npos) << advice;
  EXPECT_EQ(advice.find("probably died"), std::string::npos) << advice;
  const std::string lost = "Connection reset by peer";
  EXPECT_NE(
      detail::launch_failure_advice(lost).find("probably died or stalled"), std::string::npos);
}

TEST(ProcessGroupFailureTest, RejectsUnknownBackend) {
  ProcessGroupOptions options;
  options.backend = "mpi";
  options.world_size = 2;
  std::string message = message_of([&] { ProcessGroup::create(options); });
  EXPECT_NE(message.find("DISTRIBUTED.BACKEND = mpi"), std::string::npos) << message;
}

} // namespace
} // namespace largo::comm::process_group_test
