// The order in which a rank reads a WebDataset (webdataset_index.h) in one epoch: WebDataset's
// streaming order -- whole shards, each read front to back through a bounded shuffle buffer
// -- computed from the shards' sample counts, so that it is a pure function of (seed,
// epoch, rank) like the other samplers and a resumed epoch continues where it stopped.
//
// Epoch e, for R replicas with W streams each (a stream is a loader thread: DataLoader's
// worker w builds batches k with k % W == w, so pass W = max(1, num_workers)):
//   1. the shard list is permuted, randperm(J) seeded with hash(seed, e);
//   2. the i-th shard of that order goes to stream g = i % (R * W), which is replica g % R's
//      stream g / R;
//   3. a stream reads its shards in that order, each front to back, through a buffer of
//      shuffle_buffer samples: once full, it emits a uniformly drawn entry and refills the
//      slot from the read position (draws from a generator seeded by hash(seed, e, g));
//      a sample thus leaves at most shuffle_buffer - 1 places before it was read;
//   4. every stream emits the same number of samples, L = the sum of the floor(J / (R * W))
//      smallest shard sizes -- what the stream with the fewest and smallest shards holds in
//      any epoch -- and its samples past L are not read that epoch (others are dropped in
//      other epochs, as the shard order changes). So every replica reads W * L samples, the
//      same number in every epoch, and the collectives of the steps stay paired;
//   5. a replica's batches: round q takes batch q of stream 0, then of stream 1, ... (batch
//      k of the epoch is stream k % W's), each batch_size samples of its stream in emission
//      order; the streams' last L % batch_size samples follow, stream by stream.
// Every sample is read at most once per epoch over all replicas and streams; with shards of
// equal size and J a multiple of R * W, exactly once.
// No collectives.
#pragma once

#include <cstdint>
#include <vector>

namespace largo::data {

struct WebDatasetSamplerOptions {
  int64_t num_replicas = 1;
  int64_t rank = 0;
  // Streams per replica: the loader's threads, max(1, DataLoaderOptions::num_workers).
  int64_t streams_per_replica = 1;
  int64_t batch_size = 1;
  // Samples a stream holds to shuffle; 1 reads each shard in tar order.
  int64_t shuffle_buffer = 1000;
  uint64_t seed = 0;
};

class WebDatasetSampler {
 public:
  // shard_sizes: samples of each shard, in dataset index order (WebDatasetShards). Throws
  // OptionError for bad options, fewer shards than num_replicas * streams_per_replica, or
  // streams left without a sample (L = 0).
  WebDatasetSampler(std::vector<int64_t> shard_sizes, WebDatasetSamplerOptions options);

  void set_epoch(int64_t epoch);
  int64_t epoch() const;

  // This replica's epoch: its streams' samples (dataset indices) in batch order, as above.
  std::vector<int64_t> indices() const;
  // W * L, the same for every replica and epoch.
  int64_t num_samples() const;
  // L.
  int64_t samples_per_stream() const;
  // Samples no replica reads in an epoch: all of them minus R * W * L.
  int64_t num_unread_per_epoch() const;

  // Stream `stream` of replica `rank` in the current epoch: its shards in reading order, the
  // samples as it reads them (before the buffer), and as it emits them (L of them).
  std::vector<int64_t> stream_shards(int64_t rank, int64_t stream) const;
  std::vector<int64_t> stream_reads(int64_t rank, int64_t stream) const;
  std::vector<int64_t> stream_samples(int64_t rank, int64_t stream) const;

 private:
  std::vector<int64_t> shard_sizes_;
  std::vector<int64_t> shard_starts_; // dataset index of each shard's first sample
  WebDatasetSamplerOptions options_;
  int64_t samples_per_stream_ = 0;
  int64_t epoch_ = 0;
};

} // namespace largo::data
