// Which sample indices each rank reads in an epoch.
//
// DistributedSampler reproduces torch.utils.data.DistributedSampler exactly (same
// permutation for the same seed and epoch: libtorch's randperm is the one Python calls),
// so a Largo run and a PyTorch run see the data in the same order.
// StatefulDistributedSampler reproduces VISSL's sampler of the same name: a contiguous
// block per rank, and a start iteration so a resumed run continues mid-epoch without
// replaying or skipping samples.
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
  // What a checkpoint saves to resume the sampler.
  struct State {
    int64_t epoch = 0;
    int64_t start_iter = 0;
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

  int64_t epoch() const;
  int64_t start_iter() const;
  int64_t batch_size() const;
  State state_dict() const;
  void load_state_dict(const State& state);

  // The whole epoch for this rank: its contiguous block [rank*n, (rank+1)*n) of the
  // N - N % R leading samples, reordered by randperm(n) seeded with seed + epoch.
  std::vector<int64_t> epoch_indices() const;
  // What VISSL's __iter__ yields: epoch_indices() from start_iter * batch_size on
  // (empty if that is past the end).
  std::vector<int64_t> indices() const;
  // n = (N - N % R) / R, the length of the whole epoch for one rank (VISSL's __len__).
  int64_t num_samples() const;

 private:
  int64_t num_replicas_;
  int64_t rank_;
  int64_t batch_size_;
  uint64_t seed_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
  int64_t start_iter_ = 0;
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)), as int64 values.
std::vector<int64_t> seeded_randperm(int64_t n, uint64_t seed);

} // namespace largo::data
