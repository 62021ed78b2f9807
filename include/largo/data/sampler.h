// Which sample indices each rank reads in an epoch.
//
// DistributedSampler reproduces torch.utils.data.DistributedSampler exactly (same
// permutation for the same seed and epoch: libtorch's randperm is the one Python calls),
// so a Largo run and a PyTorch run see the data in the same order.
// StatefulDistributedSampler reproduces VISSL's sampler of the same name: a contiguous
// block per rank, and a start iteration so a resumed run continues mid-epoch without
// replaying or skipping samples. It also continues an epoch that other numbers of replicas
// began (a mid-epoch resume at another world size): see set_earlier_stretches.
// Both are pure functions of their arguments and the epoch: no collectives.
#pragma once

#include <cstdint>
#include <vector>

namespace largo::data {

class DistributedSampler {
 public:
  // Throws ConfigError unless dataset_size >= 0, num_replicas >= 1 and
  // 0 <= rank < num_replicas.
  explicit DistributedSampler(
      int64_t dataset_size,
      int64_t num_replicas = 1,
      int64_t rank = 0,
      bool shuffle = true,
      uint64_t seed = 0,
      bool drop_last = false);

  // Call before each epoch: the shuffle is seeded with seed + epoch.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;

  // This rank's indices for the current epoch, num_samples() of them. Without drop_last
  // the list is padded by repeating its head so every rank gets the same count; with
  // drop_last the tail that does not divide evenly is dropped.
  std::vector<int64_t> indices() const;
  // ceil(N / R), or with drop_last and N % R != 0, ceil((N - R) / R).
  int64_t num_samples() const;
  // num_samples() * num_replicas.
  int64_t total_size() const;

 private:
  int64_t dataset_size_;
  int64_t num_replicas_;
  int64_t rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

class StatefulDistributedSampler {
 public:
  // A stretch of the current epoch that an earlier run read with another number of replicas
  // before it was checkpointed: how many replicas read it, and how many samples of its order
  // each had consumed (start_iter * batch_size; more than its order holds counts as all).
  struct Stretch {
    int64_t num_replicas = 1;
    int64_t samples_per_replica = 0;
  };

  // What a checkpoint saves to resume the sampler.
  struct State {
    int64_t epoch = 0;
    int64_t start_iter = 0;
    std::vector<Stretch> earlier_stretches; // oldest first; see set_earlier_stretches
  };

  // Throws ConfigError unless dataset_size >= 0, num_replicas >= 1,
  // 0 <= rank < num_replicas and batch_size >= 1.
  StatefulDistributedSampler(
      int64_t dataset_size,
      int64_t num_replicas,
      int64_t rank,
      int64_t batch_size,
      uint64_t seed = 0);

  // On resume, call set_epoch and then set_start_iter (set_epoch does not reset it).
  void set_epoch(int64_t epoch);
  // The next iteration (batch) to read in this epoch; throws ConfigError if negative.
  void set_start_iter(int64_t start_iter);
  // Also replaces the batch size the start iteration is counted in.
  void set_start_iter(int64_t start_iter, int64_t batch_size);
  // The stretches of the current epoch read before this sampler's, oldest first (the first
  // began the epoch afresh). Non-empty, the epoch's order is a continuation: the samples they
  // left unread (each replica's unread tail, replica after replica, in the order it would
  // have read them) split into num_replicas contiguous blocks of floor(M / num_replicas);
  // the last M % num_replicas unread samples are read by no replica this epoch, as a fresh
  // epoch leaves out the last N % R. start_iter then counts from the continuation's start.
  // set_epoch leaves them alone. Throws ConfigError for a stretch with num_replicas < 1 or
  // samples_per_replica < 0.
  void set_earlier_stretches(std::vector<Stretch> stretches);

  int64_t epoch() const;
  int64_t start_iter() const;
  int64_t batch_size() const;
  State state_dict() const;
  void load_state_dict(const State& state);

  // The whole epoch for this rank: its contiguous block [rank*n, (rank+1)*n) of the
  // N - N % R leading samples, reordered by randperm(n) seeded with seed + epoch; or its
  // block of the continuation (set_earlier_stretches).
  std::vector<int64_t> epoch_indices() const;
  // What VISSL's __iter__ yields: epoch_indices() from start_iter * batch_size on
  // (empty if that is past the end).
  std::vector<int64_t> indices() const;
  // n = (N - N % R) / R, the length of the whole epoch for one rank (VISSL's __len__); in a
  // continuation, the length of this rank's block of it.
  int64_t num_samples() const;
  // The samples the earlier stretches read, over all their replicas (0 without any), and
  // what the whole epoch serves: N - N % R of the replicas that began it. Their ratio is how
  // far through the epoch the continuation starts.
  int64_t num_earlier_samples() const;
  int64_t epoch_size() const;

 private:
  // Each of this sampler's replicas' order in the continuation of earlier_stretches_.
  std::vector<std::vector<int64_t>> continuation_orders() const;
  // The length of one replica's order in each earlier stretch, then in this sampler's.
  std::vector<int64_t> stretch_lengths() const;

  int64_t dataset_size_;
  int64_t num_replicas_;
  int64_t rank_;
  int64_t batch_size_;
  uint64_t seed_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
  int64_t start_iter_ = 0;
  std::vector<Stretch> earlier_stretches_;
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)), as int64 values.
std::vector<int64_t> seeded_randperm(int64_t n, uint64_t seed);

} // namespace largo::data
