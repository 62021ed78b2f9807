// Samplers: DistributedSampler against indices recorded from PyTorch and
// StatefulDistributedSampler against VISSL's formula run in Python
// (tests/reference/gen_sampler_baselines.py), and both in closed form.
#include "largo/data/sampler.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "largo/core/error.h"
#include "test_paths.h"

namespace largo::data::sampler_test {
namespace {

const nlohmann::json& baselines() {
  static const nlohmann::json data = [] {
    const std::string path =
        std::string(largo::test_paths::data_dir()) + "/data/baselines/sampler_baselines.json";
    std::ifstream in(path);
    if (!in) {
      throw std::runtime_error(
          "cannot open " + path + "; run tests/reference/gen_sampler_baselines.py");
    }
    return nlohmann::json::parse(in);
  }();
  return data;
}

// Compares `actual` with a baseline entry: the full list, or head, tail and checksum.
void expect_matches(
    const std::vector<int64_t>& actual, const nlohmann::json& expected, const std::string& what) {
  const auto length = expected.at("length").get<size_t>();
  ASSERT_EQ(actual.size(), length) << what;
  if (expected.contains("values")) {
    EXPECT_EQ(actual, expected.at("values").get<std::vector<int64_t>>()) << what;
    return;
  }
  const auto head = expected.at("head").get<std::vector<int64_t>>();
  const auto tail = expected.at("tail").get<std::vector<int64_t>>();
  EXPECT_EQ(std::vector<int64_t>(actual.begin(), actual.begin() + head.size()), head) << what;
  EXPECT_EQ(std::vector<int64_t>(actual.end() - tail.size(), actual.end()), tail) << what;
  int64_t checksum = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    checksum += static_cast<int64_t>(i + 1) * actual[i];
  }
  EXPECT_EQ(checksum, expected.at("checksum").get<int64_t>()) << what;
}

TEST(SeededRandperm, MatchesPythonTorchRandperm) {
  const auto& cases = baselines().at("randperm");
  ASSERT_GE(cases.size(), 5U);
  for (const auto& entry : cases) {
    const auto n = entry.at("n").get<int64_t>();
    const auto seed = entry.at("seed").get<uint64_t>();
    expect_matches(
        seeded_randperm(n, seed),
        entry,
        "randperm(" + std::to_string(n) + ", seed " + std::to_string(seed) + ")");
  }
}

TEST(DistributedSampler, MatchesPyTorchForEveryRecordedCase) {
  const auto& cases = baselines().at("distributed_sampler");
  ASSERT_GE(cases.size(), 40U);
  for (const auto& entry : cases) {
    const std::string what = entry.dump().substr(0, 160);
    DistributedSampler sampler(
        entry.at("dataset_size").get<int64_t>(),
        entry.at("num_replicas").get<int64_t>(),
        entry.at("rank").get<int64_t>(),
        entry.at("shuffle").get<bool>(),
        entry.at("seed").get<uint64_t>(),
        entry.at("drop_last").get<bool>());
    sampler.set_epoch(entry.at("epoch").get<int64_t>());
    EXPECT_EQ(sampler.num_samples(), entry.at("num_samples").get<int64_t>()) << what;
    expect_matches(sampler.indices(), entry, what);
  }
}

TEST(DistributedSampler, RanksPartitionTheDatasetAndEpochsReshuffle) {
  constexpr int64_t kSize = 103;
  constexpr int64_t kReplicas = 4;
  std::multiset<int64_t> seen;
  for (int64_t rank = 0; rank < kReplicas; ++rank) {
    DistributedSampler sampler(kSize, kReplicas, rank, true, 3, false);
    sampler.set_epoch(2);
    const auto indices = sampler.indices();
    EXPECT_EQ(static_cast<int64_t>(indices.size()), 26);
    seen.insert(indices.begin(), indices.end());
  }
  // 104 slots for 103 samples: every sample once, one repeated as padding.
  EXPECT_EQ(seen.size(), 104U);
  for (int64_t i = 0; i < kSize; ++i) {
    EXPECT_GE(seen.count(i), 1U) << i;
  }
  DistributedSampler sampler(kSize, kReplicas, 0, true, 3, false);
  sampler.set_epoch(2);
  const auto epoch2 = sampler.indices();
  sampler.set_epoch(3);
  EXPECT_NE(sampler.indices(), epoch2);
}

TEST(DistributedSampler, RejectsBadArguments) {
  EXPECT_THROW(DistributedSampler(10, 0, 0), ConfigError);
  EXPECT_THROW(DistributedSampler(10, 2, 2), ConfigError);
  EXPECT_THROW(DistributedSampler(10, 2, -1), ConfigError);
  EXPECT_THROW(DistributedSampler(-1, 1, 0), ConfigError);
}

TEST(StatefulDistributedSampler, ContiguousBlockPerRankReorderedBySharedPermutation) {
  // N = 52, R = 3: total 51 (sample 51 dropped), n = 17 per rank.
  constexpr int64_t kReplicas = 3;
  constexpr uint64_t kSeed = 0;
  constexpr int64_t kEpoch = 1;
  // The permutation is torch.randperm(17, seed 0 + 1), recorded from Python.
  std::vector<int64_t> python_perm;
  for (const auto& entry : baselines().at("randperm")) {
    if (entry.at("n") == 17 && entry.at("seed") == kSeed + kEpoch) {
      python_perm = entry.at("values").get<std::vector<int64_t>>();
    }
  }
  ASSERT_EQ(python_perm.size(), 17U);
  std::set<int64_t> all;
  for (int64_t rank = 0; rank < kReplicas; ++rank) {
    StatefulDistributedSampler sampler(52, kReplicas, rank, /*batch_size=*/4, kSeed);
    sampler.set_epoch(kEpoch);
    EXPECT_EQ(sampler.num_samples(), 17);
    const auto indices = sampler.epoch_indices();
    ASSERT_EQ(indices.size(), 17U);
    for (size_t i = 0; i < indices.size(); ++i) {
      EXPECT_EQ(indices[i], rank * 17 + python_perm[i]) << "rank " << rank << " position " << i;
    }
    EXPECT_EQ(sampler.indices(), indices); // start_iter 0: the whole epoch
    all.insert(indices.begin(), indices.end());
  }
  EXPECT_EQ(all.size(), 51U);
  EXPECT_EQ(*all.rbegin(), 50);
}

TEST(StatefulDistributedSampler, MatchesVisslForEveryRecordedCase) {
  const auto& cases = baselines().at("stateful_distributed_sampler");
  ASSERT_GE(cases.size(), 40U);
  for (const auto& entry : cases) {
    const std::string what = entry.dump().substr(0, 160);
    StatefulDistributedSampler sampler(
        entry.at("dataset_size").get<int64_t>(),
        entry.at("num_replicas").get<int64_t>(),
        entry.at("rank").get<int64_t>(),
        entry.at("batch_size").get<int64_t>(),
        entry.at("seed").get<uint64_t>());
    sampler.set_epoch(entry.at("epoch").get<int64_t>());
    sampler.set_start_iter(entry.at("start_iter").get<int64_t>());
    EXPECT_EQ(sampler.num_samples(), entry.at("num_samples").get<int64_t>()) << what;
    expect_matches(sampler.indices(), entry, what);
  }
}

TEST(StatefulDistributedSampler, StartIterSkipsWholeBatchesAndStateRoundTrips) {
  StatefulDistributedSampler sampler(100, 2, 1, /*batch_size=*/8, /*seed=*/5);
  sampler.set_epoch(3);
  const auto full = sampler.epoch_indices();
  ASSERT_EQ(full.size(), 50U);
  sampler.set_start_iter(2);
  EXPECT_EQ(sampler.indices(), std::vector<int64_t>(full.begin() + 16, full.end()));
  sampler.set_start_iter(6, /*batch_size=*/7); // the tail batch: positions 42..49
  EXPECT_EQ(sampler.indices(), std::vector<int64_t>(full.begin() + 42, full.end()));
  sampler.set_start_iter(9, 7);
  EXPECT_TRUE(sampler.indices().empty());

  sampler.set_start_iter(4, 8);
  const StatefulDistributedSampler::State state = sampler.state_dict();
  EXPECT_EQ(state.epoch, 3);
  EXPECT_EQ(state.start_iter, 4);
  StatefulDistributedSampler resumed(100, 2, 1, 8, 5);
  resumed.load_state_dict(state);
  EXPECT_EQ(resumed.indices(), sampler.indices());
  EXPECT_EQ(resumed.epoch_indices(), full);

  sampler.set_epoch(4); // a new epoch reshuffles; set_epoch leaves start_iter alone
  EXPECT_NE(sampler.epoch_indices(), full);
  EXPECT_EQ(sampler.start_iter(), 4);
  EXPECT_THROW(sampler.set_start_iter(-1), ConfigError);
  EXPECT_THROW(StatefulDistributedSampler(10, 2, 0, 0), ConfigError);
}

// ---- Continuing an epoch at another number of replicas ------------------------------------

using Stretch = StatefulDistributedSampler::Stretch;

// The samples `samplers` read from start_iter on (as a run resumed there would), all ranks.
std::vector<int64_t> read_by(const std::vector<StatefulDistributedSampler>& samplers) {
  std::vector<int64_t> read;
  for (const auto& sampler : samplers) {
    const auto indices = sampler.indices();
    read.insert(read.end(), indices.begin(), indices.end());
  }
  return read;
}

// Every rank of `replicas`, at epoch 2 with seed 7, continuing after `earlier`.
std::vector<StatefulDistributedSampler>
world(int64_t dataset_size, int64_t replicas, const std::vector<Stretch>& earlier) {
  std::vector<StatefulDistributedSampler> samplers;
  for (int64_t rank = 0; rank < replicas; ++rank) {
    samplers.emplace_back(dataset_size, replicas, rank, /*batch_size=*/4, /*seed=*/7);
    samplers.back().set_epoch(2);
    samplers.back().set_earlier_stretches(earlier);
  }
  return samplers;
}

// The first `samples` of each rank's order: what a world read before its checkpoint.
std::vector<int64_t>
first_of_each(const std::vector<StatefulDistributedSampler>& samplers, int64_t samples) {
  std::vector<int64_t> read;
  for (const auto& sampler : samplers) {
    const auto order = sampler.epoch_indices();
    read.insert(read.end(), order.begin(), order.begin() + std::min<size_t>(samples, order.size()));
  }
  return read;
}

// Each of 0 .. n-1 once, and nothing else.
void expect_each_once(std::vector<int64_t> read, int64_t n, const std::string& what) {
  std::sort(read.begin(), read.end());
  std::vector<int64_t> expected(static_cast<size_t>(n));
  std::iota(expected.begin(), expected.end(), int64_t{0});
  EXPECT_EQ(read, expected) << what;
}

TEST(StatefulDistributedSampler, TwoReplicasContinuedByThreeReadEverySampleOnce) {
  // 48 samples, 2 replicas of 24; each read 12 (3 batches of 4); 24 left, 8 for each of 3.
  const auto before = world(48, 2, {});
  const auto after = world(48, 3, {{2, 12}});
  auto read = first_of_each(before, 12);
  for (const auto& sampler : after) {
    EXPECT_EQ(sampler.num_samples(), 8);
    EXPECT_EQ(sampler.epoch_indices().size(), 8U);
    EXPECT_EQ(sampler.num_earlier_samples(), 24);
    EXPECT_EQ(sampler.epoch_size(), 48);
  }
  const auto rest = read_by(after);
  read.insert(read.end(), rest.begin(), rest.end());
  expect_each_once(read, 48, "2 -> 3");
  // In order: replica 0's unread tail first, so the new rank 0 reads its next 8.
  const auto old_rank0 = before[0].epoch_indices();
  EXPECT_EQ(
      after[0].epoch_indices(),
      std::vector<int64_t>(old_rank0.begin() + 12, old_rank0.begin() + 20));
}

TEST(StatefulDistributedSampler, ThreeToTwoAndAChainOfResumesReadEverySampleOnce) {
  // 48 samples, 3 replicas of 16, each read 8; 24 left: 12 for each of 2.
  const auto before = world(48, 3, {});
  const auto after = world(48, 2, {{3, 8}});
  auto read = first_of_each(before, 8);
  const auto rest = read_by(after);
  read.insert(read.end(), rest.begin(), rest.end());
  expect_each_once(read, 48, "3 -> 2");

  // 2 -> 3 -> 2 in one epoch: the 3 replicas' 8 each are split again after 4 of them.
  auto chain = first_of_each(world(48, 2, {}), 12);
  const auto middle = first_of_each(world(48, 3, {{2, 12}}), 4);
  const auto last = world(48, 2, {{2, 12}, {3, 4}});
  EXPECT_EQ(last[0].num_samples(), 6);
  EXPECT_EQ(last[0].num_earlier_samples(), 36);
  chain.insert(chain.end(), middle.begin(), middle.end());
  const auto tail = read_by(last);
  chain.insert(chain.end(), tail.begin(), tail.end());
  expect_each_once(chain, 48, "2 -> 3 -> 2");
}

TEST(StatefulDistributedSampler, ContinuationLeavesOutTheRemainderAndCountsStartIterFromItsStart) {
  // 2 replicas of 24, each read 13: 22 left over 3 replicas, 7 each; the last unread one
  // (replica 1's last sample) is read by none, as a fresh epoch leaves out N % R.
  const auto before = world(48, 2, {});
  auto after = world(48, 3, {{2, 13}});
  EXPECT_EQ(after[2].num_samples(), 7);
  std::set<int64_t> read;
  for (const int64_t i : first_of_each(before, 13)) {
    read.insert(i);
  }
  for (const int64_t i : read_by(after)) {
    EXPECT_TRUE(read.insert(i).second) << i << " read twice";
  }
  EXPECT_EQ(read.size(), 47U);
  EXPECT_EQ(read.count(before[1].epoch_indices().back()), 0U);
  // start_iter counts batches of the continuation.
  after[1].set_start_iter(1);
  const auto whole = after[1].epoch_indices();
  EXPECT_EQ(after[1].indices(), std::vector<int64_t>(whole.begin() + 4, whole.end()));
  // More consumed than a replica held counts as all of it.
  EXPECT_EQ(world(48, 3, {{2, 100}})[0].num_samples(), 0);
  EXPECT_TRUE(world(48, 3, {{2, 100}})[0].epoch_indices().empty());
}

TEST(StatefulDistributedSampler, EarlierStretchesRoundTripAndAreChecked) {
  auto sampler = world(48, 3, {{2, 12}})[1];
  sampler.set_start_iter(1);
  StatefulDistributedSampler resumed(48, 3, 1, 4, 7);
  resumed.load_state_dict(sampler.state_dict());
  EXPECT_EQ(resumed.indices(), sampler.indices());
  resumed.set_earlier_stretches({}); // back to a fresh epoch
  EXPECT_EQ(resumed.num_samples(), 16);
  EXPECT_EQ(resumed.num_earlier_samples(), 0);
  EXPECT_THROW(resumed.set_earlier_stretches({{0, 4}}), ConfigError);
  EXPECT_THROW(resumed.set_earlier_stretches({{2, -1}}), ConfigError);
}

} // namespace
} // namespace largo::data::sampler_test
