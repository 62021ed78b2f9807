// WebDataset's streaming order as a pure function of the epoch.
#include "largo/data/webdataset_sampler.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "largo/core/error.h"
#include "largo/data/hash.h"
#include "largo/data/sampler.h"

namespace largo::data {
namespace {

// Tags the generators of this sampler apart from the loader's seeds of the same numbers.
constexpr uint64_t kShardOrderTag = 0x5744'5348'4152'4453ULL;    // "WDSHARDS"
constexpr uint64_t kShuffleBufferTag = 0x5744'4255'4646'4552ULL; // "WDBUFFER"

// Uniform in [0, n) from one 64-bit draw (Lemire's multiply-shift; the bias, n / 2^64, is
// nil for any buffer size).
int64_t draw_below(uint64_t& state, int64_t n) {
  const auto wide =
      static_cast<unsigned __int128>(splitmix64_next(state)) * static_cast<uint64_t>(n);
  return static_cast<int64_t>(wide >> 64);
}

std::string int_text(int64_t value) {
  return std::to_string(value);
}

} // namespace

WebDatasetSampler::WebDatasetSampler(
    std::vector<int64_t> shard_sizes, WebDatasetSamplerOptions options)
    : shard_sizes_(std::move(shard_sizes)), options_(options) {
  const std::string name = "WebDatasetSamplerOptions::";
  require_option(
      options_.num_replicas >= 1,
      name + "num_replicas",
      int_text(options_.num_replicas),
      "an integer >= 1");
  require_option(
      options_.rank >= 0 && options_.rank < options_.num_replicas,
      name + "rank",
      int_text(options_.rank),
      fmt::format("in [0, {})", options_.num_replicas));
  require_option(
      options_.streams_per_replica >= 1,
      name + "streams_per_replica",
      int_text(options_.streams_per_replica),
      "an integer >= 1");
  require_option(
      options_.batch_size >= 1,
      name + "batch_size",
      int_text(options_.batch_size),
      "an integer >= 1");
  require_option(
      options_.shuffle_buffer >= 1,
      name + "shuffle_buffer",
      int_text(options_.shuffle_buffer),
      "a sample count >= 1 (1: no shuffling)");
  const auto num_shards = static_cast<int64_t>(shard_sizes_.size());
  const int64_t num_streams = options_.num_replicas * options_.streams_per_replica;
  require_option(
      num_shards >= num_streams,
      name + "streams_per_replica",
      int_text(options_.streams_per_replica),
      fmt::format(
          "at most {} with {} replica(s) and {} shards: each of the replicas x streams reads "
          "whole shards, so there must be at least as many shards as streams; use fewer loader "
          "threads or replicas, or pack smaller shards",
          num_shards / options_.num_replicas,
          options_.num_replicas,
          num_shards));
  shard_starts_.resize(shard_sizes_.size());
  std::exclusive_scan(shard_sizes_.begin(), shard_sizes_.end(), shard_starts_.begin(), int64_t{0});
  // The stream with the fewest shards holds floor(J / G) of them; at worst the smallest.
  std::vector<int64_t> sorted = shard_sizes_;
  std::sort(sorted.begin(), sorted.end());
  samples_per_stream_ =
      std::accumulate(sorted.begin(), sorted.begin() + num_shards / num_streams, int64_t{0});
  require_option(
      samples_per_stream_ > 0,
      name + "streams_per_replica",
      int_text(options_.streams_per_replica),
      fmt::format(
          "streams that can each read a sample; the smallest {} shards are empty",
          num_shards / num_streams));
}

void WebDatasetSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
}

int64_t WebDatasetSampler::epoch() const {
  return epoch_;
}

int64_t WebDatasetSampler::samples_per_stream() const {
  return samples_per_stream_;
}

int64_t WebDatasetSampler::num_samples() const {
  return options_.streams_per_replica * samples_per_stream_;
}

int64_t WebDatasetSampler::num_unread_per_epoch() const {
  const int64_t total = std::accumulate(shard_sizes_.begin(), shard_sizes_.end(), int64_t{0});
  return total - options_.num_replicas * num_samples();
}

std::vector<int64_t> WebDatasetSampler::stream_shards(int64_t rank, int64_t stream) const {
  const int64_t num_streams = options_.num_replicas * options_.streams_per_replica;
  const int64_t g = stream * options_.num_replicas + rank;
  const std::vector<int64_t> order = seeded_randperm(
      static_cast<int64_t>(shard_sizes_.size()),
      hash_combine(hash_combine(options_.seed, kShardOrderTag), static_cast<uint64_t>(epoch_)));
  std::vector<int64_t> shards;
  for (size_t i = static_cast<size_t>(g); i < order.size(); i += static_cast<size_t>(num_streams)) {
    shards.push_back(order[i]);
  }
  return shards;
}

std::vector<int64_t> WebDatasetSampler::stream_reads(int64_t rank, int64_t stream) const {
  std::vector<int64_t> reads;
  for (const int64_t shard : stream_shards(rank, stream)) {
    const int64_t start = shard_starts_[static_cast<size_t>(shard)];
    for (int64_t k = 0; k < shard_sizes_[static_cast<size_t>(shard)]; ++k) {
      reads.push_back(start + k);
    }
  }
  return reads;
}

std::vector<int64_t> WebDatasetSampler::stream_samples(int64_t rank, int64_t stream) const {
  const std::vector<int64_t> reads = stream_reads(rank, stream);
  const uint64_t g = static_cast<uint64_t>(stream * options_.num_replicas + rank);
  uint64_t state = hash_combine(
      hash_combine(hash_combine(options_.seed, kShuffleBufferTag), static_cast<uint64_t>(epoch_)),
      g);
  std::vector<int64_t> buffer;
  buffer.reserve(static_cast<size_t>(std::min<int64_t>(options_.shuffle_buffer, reads.size())));
  std::vector<int64_t> emitted;
  emitted.reserve(static_cast<size_t>(samples_per_stream_));
  size_t next_read = 0;
  while (static_cast<int64_t>(emitted.size()) < samples_per_stream_) {
    while (static_cast<int64_t>(buffer.size()) < options_.shuffle_buffer &&
           next_read < reads.size()) {
      buffer.push_back(reads[next_read++]);
    }
    // L never exceeds what a stream reads, so the buffer is not empty here.
    const auto pick = static_cast<size_t>(draw_below(state, static_cast<int64_t>(buffer.size())));
    emitted.push_back(buffer[pick]);
    buffer[pick] = buffer.back();
    buffer.pop_back();
  }
  return emitted;
}

std::vector<int64_t> WebDatasetSampler::indices() const {
  const int64_t num_streams = options_.streams_per_replica;
  const int64_t batch = options_.batch_size;
  std::vector<std::vector<int64_t>> streams;
  for (int64_t w = 0; w < num_streams; ++w) {
    streams.push_back(stream_samples(options_.rank, w));
  }
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(num_samples()));
  const int64_t full_rounds = samples_per_stream_ / batch;
  for (int64_t q = 0; q < full_rounds; ++q) {
    for (const std::vector<int64_t>& stream : streams) {
      order.insert(order.end(), stream.begin() + q * batch, stream.begin() + (q + 1) * batch);
    }
  }
  for (const std::vector<int64_t>& stream : streams) {
    order.insert(order.end(), stream.begin() + full_rounds * batch, stream.end());
  }
  return order;
}

} // namespace largo::data
