// WebDatasetSampler: whole shards per (rank, stream), a bounded shuffle buffer, the same
// count for every rank, a new order every epoch -- as pure functions of the shard sizes.
#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "largo/core/error.h"
#include "largo/data/webdataset_sampler.h"

namespace largo::data::webdataset_sampler_test {
namespace {

WebDatasetSamplerOptions options(
    int64_t replicas,
    int64_t rank,
    int64_t streams,
    int64_t batch,
    int64_t buffer,
    uint64_t seed = 7) {
  WebDatasetSamplerOptions o;
  o.num_replicas = replicas;
  o.rank = rank;
  o.streams_per_replica = streams;
  o.batch_size = batch;
  o.shuffle_buffer = buffer;
  o.seed = seed;
  return o;
}

// The shard each sample belongs to, for shards of `sizes`.
std::vector<int64_t> shard_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> owner;
  for (size_t j = 0; j < sizes.size(); ++j) {
    owner.insert(owner.end(), static_cast<size_t>(sizes[j]), static_cast<int64_t>(j));
  }
  return owner;
}

TEST(WebDatasetSampler, TwoRanksOfTwoStreamsReadEverySampleExactlyOnceAnEpoch) {
  const std::vector<int64_t> sizes(8, 10); // 80 samples, 2 shards per stream
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> all;
    for (int64_t rank = 0; rank < 2; ++rank) {
      WebDatasetSampler sampler(sizes, options(2, rank, 2, 4, 6));
      sampler.set_epoch(epoch);
      const std::vector<int64_t> order = sampler.indices();
      EXPECT_EQ(static_cast<int64_t>(order.size()), sampler.num_samples());
      EXPECT_EQ(sampler.num_samples(), 40);
      all.insert(all.end(), order.begin(), order.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected(80);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(all, expected) << "epoch " << epoch;
  }
}

TEST(WebDatasetSampler, StreamsReadWholeShardsAndBatchKIsStreamKModW) {
  const std::vector<int64_t> sizes(12, 9);
  const std::vector<int64_t> owner = shard_of(sizes);
  WebDatasetSampler sampler(sizes, options(2, 1, 3, 4, 5));
  sampler.set_epoch(2);
  std::set<int64_t> seen_shards;
  for (int64_t w = 0; w < 3; ++w) {
    const std::vector<int64_t> shards = sampler.stream_shards(1, w);
    EXPECT_EQ(shards.size(), 2u);
    for (int64_t shard : shards) {
      EXPECT_TRUE(seen_shards.insert(shard).second) << "shard " << shard << " in two streams";
    }
    for (int64_t sample : sampler.stream_samples(1, w)) {
      EXPECT_TRUE(std::count(shards.begin(), shards.end(), owner[sample]) == 1)
          << "stream " << w << " emitted a sample of another stream's shard";
    }
  }
  // 18 samples per stream in batches of 4: 4 rounds of 3 batches, then 3 tails of 2.
  const std::vector<int64_t> order = sampler.indices();
  ASSERT_EQ(order.size(), 54u);
  for (int64_t k = 0; k < 12; ++k) {
    const std::vector<int64_t> stream = sampler.stream_samples(1, k % 3);
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(order[k * 4 + i], stream[(k / 3) * 4 + i]) << "batch " << k;
    }
  }
}

TEST(WebDatasetSampler, TheShuffleBufferIsBoundedAndOneReadsInTarOrder) {
  const std::vector<int64_t> sizes(4, 50);
  for (int64_t buffer : {1, 7, 1000}) {
    WebDatasetSampler sampler(sizes, options(1, 0, 2, 8, buffer));
    sampler.set_epoch(1);
    for (int64_t w = 0; w < 2; ++w) {
      const std::vector<int64_t> reads = sampler.stream_reads(0, w);
      const std::vector<int64_t> emitted = sampler.stream_samples(0, w);
      std::map<int64_t, int64_t> read_position;
      for (size_t p = 0; p < reads.size(); ++p) {
        read_position[reads[p]] = static_cast<int64_t>(p);
      }
      int64_t max_lead = 0;
      for (size_t t = 0; t < emitted.size(); ++t) {
        const int64_t lead = read_position.at(emitted[t]) - static_cast<int64_t>(t);
        EXPECT_LE(lead, buffer - 1) << "emitted before it could have been read, buffer " << buffer;
        max_lead = std::max(max_lead, lead);
      }
      if (buffer == 1) {
        EXPECT_EQ(emitted, reads);
      } else {
        EXPECT_NE(emitted, reads) << "buffer " << buffer << " did not shuffle";
        EXPECT_GT(max_lead, 0);
      }
    }
  }
}

TEST(WebDatasetSampler, EveryEpochHasAnotherOrderAndTheSameEpochTheSame) {
  const std::vector<int64_t> sizes(6, 20);
  WebDatasetSampler a(sizes, options(1, 0, 2, 4, 16));
  WebDatasetSampler b(sizes, options(1, 0, 2, 4, 16));
  a.set_epoch(0);
  const std::vector<int64_t> epoch0 = a.indices();
  a.set_epoch(1);
  const std::vector<int64_t> epoch1 = a.indices();
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(a.stream_shards(0, 0), (b.set_epoch(0), b.stream_shards(0, 0)))
      << "the shard order changes too (6 shards: a repeat has probability 1/360)";
  b.set_epoch(1);
  EXPECT_EQ(b.indices(), epoch1);
  WebDatasetSampler other_seed(sizes, options(1, 0, 2, 4, 16, /*seed=*/8));
  other_seed.set_epoch(1);
  EXPECT_NE(other_seed.indices(), epoch1);
}

// Shards of unequal size: every rank still reads L samples per stream, L the smallest
// shards' sum a stream can be dealt, and no sample twice.
TEST(WebDatasetSampler, UnequalShardsGiveEveryRankTheSameCountAndNoRepeats) {
  const std::vector<int64_t> sizes = {10, 10, 10, 10, 10, 3, 10}; // 63 samples, 7 shards
  WebDatasetSampler r0(sizes, options(2, 0, 1, 4, 4));
  EXPECT_EQ(r0.samples_per_stream(), 3 + 10 + 10); // floor(7 / 2) = 3 smallest shards
  EXPECT_EQ(r0.num_unread_per_epoch(), 63 - 2 * 23);
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    std::set<int64_t> seen;
    for (int64_t rank = 0; rank < 2; ++rank) {
      WebDatasetSampler sampler(sizes, options(2, rank, 1, 4, 4));
      sampler.set_epoch(epoch);
      const std::vector<int64_t> order = sampler.indices();
      EXPECT_EQ(order.size(), 23u);
      for (int64_t sample : order) {
        EXPECT_TRUE(seen.insert(sample).second) << "sample " << sample << " read twice";
      }
    }
  }
}

TEST(WebDatasetSampler, FewerShardsThanStreamsIsRefusedNamingTheOption) {
  try {
    WebDatasetSampler(std::vector<int64_t>(3, 5), options(2, 0, 2, 4, 4));
    FAIL() << "3 shards cannot feed 2 x 2 streams";
  } catch (const OptionError& error) {
    EXPECT_EQ(error.option(), "WebDatasetSamplerOptions::streams_per_replica");
    EXPECT_NE(
        std::string(error.what()).find("at most 1 with 2 replica(s) and 3 shards"),
        std::string::npos)
        << error.what();
  }
  EXPECT_THROW(WebDatasetSampler({0, 0, 5}, options(1, 0, 2, 4, 4)), OptionError);
  EXPECT_THROW(WebDatasetSampler({5}, options(1, 0, 1, 4, 0)), OptionError);
}

} // namespace
} // namespace largo::data::webdataset_sampler_test
