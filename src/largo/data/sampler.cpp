// Distributed samplers; the index arithmetic follows the PyTorch and VISSL sources
// line by line (see /work/shared/reference/ANCHORS.md), since bit-compatible order is
// the point.
#include "largo/data/sampler.h"

#include <numeric>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "largo/core/error.h"

namespace largo::data {
namespace {

void check_partition(const char* who, int64_t dataset_size, int64_t num_replicas, int64_t rank) {
  if (dataset_size < 0) {
    throw ConfigError(fmt::format("{}: dataset_size must be >= 0, got {}", who, dataset_size));
  }
  if (num_replicas < 1) {
    throw ConfigError(fmt::format("{}: num_replicas must be >= 1, got {}", who, num_replicas));
  }
  if (rank < 0 || rank >= num_replicas) {
    throw ConfigError(fmt::format("{}: rank must be in [0, {}), got {}", who, num_replicas, rank));
  }
}

using Orders = std::vector<std::vector<int64_t>>; // one order per replica

// VISSL's fresh epoch over `num_replicas`: replica r reads its block [r*n, (r+1)*n), each
// block reordered by the same permutation.
Orders fresh_orders(int64_t dataset_size, int64_t num_replicas, uint64_t seed) {
  const int64_t n = (dataset_size - dataset_size % num_replicas) / num_replicas;
  const std::vector<int64_t> perm = seeded_randperm(n, seed);
  Orders orders(static_cast<size_t>(num_replicas));
  for (int64_t r = 0; r < num_replicas; ++r) {
    for (const int64_t p : perm) {
      orders[static_cast<size_t>(r)].push_back(r * n + p);
    }
  }
  return orders;
}

// What `orders` leave unread once each replica has consumed `consumed` of its order: each
// replica's tail, replica after replica.
std::vector<int64_t> unread_tails(const Orders& orders, int64_t consumed) {
  std::vector<int64_t> unread;
  for (const auto& order : orders) {
    const auto skip = std::min<size_t>(static_cast<size_t>(consumed), order.size());
    unread.insert(unread.end(), order.begin() + static_cast<std::ptrdiff_t>(skip), order.end());
  }
  return unread;
}

// `positions` in `num_replicas` contiguous blocks of floor(M / R); the last M % R are left
// out, so every replica reads as many samples (and steps as often) as every other.
Orders contiguous_blocks(const std::vector<int64_t>& positions, int64_t num_replicas) {
  const auto n = static_cast<std::ptrdiff_t>(positions.size()) / num_replicas;
  Orders blocks;
  for (std::ptrdiff_t r = 0; r < num_replicas; ++r) {
    blocks.emplace_back(positions.begin() + r * n, positions.begin() + (r + 1) * n);
  }
  return blocks;
}

} // namespace

std::vector<int64_t> seeded_randperm(int64_t n, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Tensor perm = at::randperm(n, gen, at::kLong);
  const auto* values = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(values, values + n);
}

// ---- DistributedSampler ----------------------------------------------------------------

DistributedSampler::DistributedSampler(
    int64_t dataset_size,
    int64_t num_replicas,
    int64_t rank,
    bool shuffle,
    uint64_t seed,
    bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  check_partition("DistributedSampler", dataset_size, num_replicas, rank);
  if (drop_last_ && dataset_size_ % num_replicas_ != 0) {
    // ceil((N - R) / R): drop the tail so every rank gets the same count.
    num_samples_ = (dataset_size_ - num_replicas_ + num_replicas_ - 1) / num_replicas_;
    num_samples_ = std::max<int64_t>(num_samples_, 0);
  } else {
    num_samples_ = (dataset_size_ + num_replicas_ - 1) / num_replicas_;
  }
}

void DistributedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
}

int64_t DistributedSampler::epoch() const {
  return epoch_;
}

int64_t DistributedSampler::num_samples() const {
  return num_samples_;
}

int64_t DistributedSampler::total_size() const {
  return num_samples_ * num_replicas_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (shuffle_) {
    all = seeded_randperm(dataset_size_, seed_ + static_cast<uint64_t>(epoch_));
  } else {
    all.resize(static_cast<size_t>(dataset_size_));
    std::iota(all.begin(), all.end(), int64_t{0});
  }
  const auto total = static_cast<size_t>(total_size());
  if (!drop_last_) {
    // Pad by repeating the head (the whole list several times if it is very short).
    const size_t original = all.size();
    for (size_t i = 0; all.size() < total && original > 0; ++i) {
      all.push_back(all[i % original]);
    }
  } else {
    all.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < total; i += static_cast<size_t>(num_replicas_)) {
    mine.push_back(all[i]);
  }
  return mine;
}

// ---- StatefulDistributedSampler --------------------------------------------------------

StatefulDistributedSampler::StatefulDistributedSampler(
    int64_t dataset_size, int64_t num_replicas, int64_t rank, int64_t batch_size, uint64_t seed)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      batch_size_(batch_size),
      seed_(seed) {
  check_partition("StatefulDistributedSampler", dataset_size, num_replicas, rank);
  if (batch_size_ < 1) {
    throw ConfigError(
        fmt::format("StatefulDistributedSampler: batch_size must be >= 1, got {}", batch_size_));
  }
  num_samples_ = (dataset_size - dataset_size % num_replicas_) / num_replicas_;
}

void StatefulDistributedSampler::set_epoch(int64_t epoch) {
  epoch_ = epoch;
}

void StatefulDistributedSampler::set_start_iter(int64_t start_iter) {
  if (start_iter < 0) {
    throw ConfigError(
        fmt::format("StatefulDistributedSampler: start_iter must be >= 0, got {}", start_iter));
  }
  start_iter_ = start_iter;
}

void StatefulDistributedSampler::set_start_iter(int64_t start_iter, int64_t batch_size) {
  if (batch_size < 1) {
    throw ConfigError(
        fmt::format("StatefulDistributedSampler: batch_size must be >= 1, got {}", batch_size));
  }
  set_start_iter(start_iter);
  batch_size_ = batch_size;
}

int64_t StatefulDistributedSampler::epoch() const {
  return epoch_;
}

int64_t StatefulDistributedSampler::start_iter() const {
  return start_iter_;
}

int64_t StatefulDistributedSampler::batch_size() const {
  return batch_size_;
}

void StatefulDistributedSampler::set_earlier_stretches(std::vector<Stretch> stretches) {
  for (const Stretch& stretch : stretches) {
    if (stretch.num_replicas < 1 || stretch.samples_per_replica < 0) {
      throw ConfigError(fmt::format(
          "StatefulDistributedSampler: an earlier stretch needs num_replicas >= 1 and "
          "samples_per_replica >= 0, got {} and {}",
          stretch.num_replicas,
          stretch.samples_per_replica));
    }
  }
  earlier_stretches_ = std::move(stretches);
  num_samples_ = stretch_lengths().back();
}

// The block lengths follow from the counts alone: no permutation is drawn.
std::vector<int64_t> StatefulDistributedSampler::stretch_lengths() const {
  const std::vector<Stretch>& earlier = earlier_stretches_;
  const int64_t first_replicas = earlier.empty() ? num_replicas_ : earlier[0].num_replicas;
  std::vector<int64_t> lengths{(dataset_size_ - dataset_size_ % first_replicas) / first_replicas};
  for (size_t k = 0; k < earlier.size(); ++k) {
    const int64_t length = lengths.back();
    const int64_t unread =
        earlier[k].num_replicas * (length - std::min(earlier[k].samples_per_replica, length));
    const int64_t next_replicas =
        k + 1 < earlier.size() ? earlier[k + 1].num_replicas : num_replicas_;
    lengths.push_back(unread / next_replicas);
  }
  return lengths;
}

StatefulDistributedSampler::State StatefulDistributedSampler::state_dict() const {
  return State{epoch_, start_iter_, earlier_stretches_};
}

void StatefulDistributedSampler::load_state_dict(const State& state) {
  set_epoch(state.epoch);
  set_start_iter(state.start_iter);
  set_earlier_stretches(state.earlier_stretches);
}

int64_t StatefulDistributedSampler::num_samples() const {
  return num_samples_;
}

int64_t StatefulDistributedSampler::epoch_size() const {
  const int64_t replicas =
      earlier_stretches_.empty() ? num_replicas_ : earlier_stretches_[0].num_replicas;
  return dataset_size_ - dataset_size_ % replicas;
}

int64_t StatefulDistributedSampler::num_earlier_samples() const {
  const std::vector<int64_t> lengths = stretch_lengths();
  int64_t read = 0;
  for (size_t k = 0; k < earlier_stretches_.size(); ++k) {
    const Stretch& stretch = earlier_stretches_[k];
    read += stretch.num_replicas * std::min(stretch.samples_per_replica, lengths[k]);
  }
  return read;
}

std::vector<std::vector<int64_t>> StatefulDistributedSampler::continuation_orders() const {
  const std::vector<Stretch>& stretches = earlier_stretches_;
  const uint64_t seed = seed_ + static_cast<uint64_t>(epoch_);
  Orders orders = fresh_orders(
      dataset_size_, stretches.empty() ? num_replicas_ : stretches[0].num_replicas, seed);
  for (size_t k = 0; k < stretches.size(); ++k) {
    const int64_t next_replicas =
        k + 1 < stretches.size() ? stretches[k + 1].num_replicas : num_replicas_;
    orders =
        contiguous_blocks(unread_tails(orders, stretches[k].samples_per_replica), next_replicas);
  }
  return orders;
}

std::vector<int64_t> StatefulDistributedSampler::epoch_indices() const {
  if (!earlier_stretches_.empty()) {
    return continuation_orders()[static_cast<size_t>(rank_)];
  }
  const std::vector<int64_t> perm =
      seeded_randperm(num_samples_, seed_ + static_cast<uint64_t>(epoch_));
  const int64_t block_start = rank_ * num_samples_;
  std::vector<int64_t> mine(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    mine[i] = block_start + perm[i];
  }
  return mine;
}

std::vector<int64_t> StatefulDistributedSampler::indices() const {
  std::vector<int64_t> all = epoch_indices();
  const int64_t start = std::min<int64_t>(start_iter_ * batch_size_, num_samples_);
  return std::vector<int64_t>(all.begin() + start, all.end());
}

} // namespace largo::data
