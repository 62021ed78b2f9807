// DeepCluster v2's memory and clustering as VISSL keeps them (vissl/losses/deepclusterv2_loss.py
// with vissl/hooks/deepclusterv2_hooks.py): each rank keeps, for the images it trains on in an
// epoch, the L2-normalised embeddings of the crops in `crops_for_mb` (one bank per crop) and
// the images' sample indexes. At each epoch's start a distributed spherical k-means clusters
// the banks, once per head of `num_clusters` (head h on bank h % banks):
//   - the initial centroids are K rows of rank 0's bank (a random permutation's first K),
//     broadcast to every rank;
//   - kmeans_iters times: each row goes to its nearest centroid (largest dot product), the
//     counts and sums of the rows per cluster are all-reduced, a cluster with rows gets their
//     mean as centroid, and every centroid is L2-normalised; a last assignment step then gives
//     each row its cluster;
//   - the assignments and sample indexes of every rank are gathered, so every rank holds each
//     image's cluster in each head ([heads, num_samples]; -100 for images no bank holds).
// The loss (deepclusterv2_loss.h) scores the batch against the centroids with those
// assignments as targets; each step then writes the batch's embeddings over the bank's next
// rows (the rows are rewritten in the epoch's order, from row 0 after each clustering). Before
// the first epoch, VISSL fills the banks with one pass over the data (init_memory): the same
// write() calls without a loss.
//
// Collective over `group`: cluster() (per head, in order: a broadcast, two all-reduces per
// k-means iteration, two all-gathers). Every rank calls it at the same point with banks of the
// same size. write(), targets() and the state dict are local.
#pragma once

#include <largo/comm/process_group.h>

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace largo::models {

// LOSS.deepclusterv2_loss's memory_params and clustering keys, with VISSL's defaults.
struct DeepClusterV2MemoryOptions {
  std::vector<int64_t> num_clusters = {3000, 3000, 3000}; // one k-means head per entry, each > 0
  int64_t kmeans_iters = 10;                              // >= 0
  std::vector<int64_t> crops_for_mb = {0};                // memory_params.crops_for_mb
  int64_t embedding_dim = 128;                            // memory_params.embedding_dim
  int64_t num_crops = 2;            // crops per image in a batch (the data's, as VISSL infers)
  int64_t num_samples = 0;          // images in the dataset (VISSL's num_train_samples)
  int64_t memory_size_per_rank = 0; // rows of each bank: deepclusterv2_memory_size(...)
};

// VISSL's bank size: the images a rank sees in an epoch, ceil(num_samples / world_size), less
// the last partial batch when the loader drops it.
int64_t deepclusterv2_memory_size(
    int64_t num_samples, int64_t world_size, int64_t batch_size, bool drop_last);

struct SphericalKmeansResult {
  at::Tensor centroids;   // [K, d], L2-normalised (rows without members keep their value)
  at::Tensor assignments; // [m] int64: each of this rank's rows' nearest centroid
};

// The k-means of VISSL's cluster_memory over `embeddings` [m, d] (this rank's rows) from
// `initial_centroids` [K, d] (the same on every rank): `iterations` steps of assignment and
// all-reduced means, then the final assignment. Collective: two all-reduces per iteration.
SphericalKmeansResult distributed_spherical_kmeans(
    const at::Tensor& embeddings,
    const at::Tensor& initial_centroids,
    int64_t iterations,
    comm::ProcessGroup& group);

class DeepClusterV2Memory {
 public:
  // Empty banks (zeros, sample index 0), no assignments (-100) and zero centroids, on `device`.
  // Throws OptionError for options out of range.
  explicit DeepClusterV2Memory(DeepClusterV2MemoryOptions options, c10::Device device = c10::kCPU);

  // `output` [num_crops * n, d]: the head's output for a batch, crop-major (crop c of image i
  // is row c * n + i, VISSL's multicrop_collator order); `sample_indexes` [n]: the images'
  // indexes in the dataset. Writes the normalised embeddings of crops_for_mb and the indexes
  // at the next n rows. Throws largo::Error when the bank has no n rows left (more images
  // than memory_size_per_rank since the last cluster()) or the shapes do not fit.
  void write(const at::Tensor& output, const at::Tensor& sample_indexes);

  // The epoch start's k-means (collective, see the top): every head's centroids and
  // assignments replaced, the write position back to row 0. `generator` draws the initial
  // centroids' permutation on rank 0 (the other ranks do not use it). Throws largo::Error when
  // rank 0's bank has fewer rows than a head's clusters.
  void cluster(comm::ProcessGroup& group, at::Generator generator);

  // [heads, num_crops * n]: the targets of a batch's rows for deepclusterv2_loss, each
  // image's assignment repeated for each of its crops (crop-major).
  at::Tensor targets(const at::Tensor& sample_indexes) const;

  const std::vector<at::Tensor>& centroids() const { // [K_h, d] per head
    return centroids_;
  }
  const at::Tensor& assignments() const { // [heads, num_samples] int64
    return assignments_;
  }
  const at::Tensor& embeddings() const { // [banks, memory_size_per_rank, d]
    return embeddings_;
  }
  const at::Tensor& sample_indexes() const { // [memory_size_per_rank] int64
    return sample_indexes_;
  }
  int64_t position() const { // the next row write() fills
    return position_;
  }
  const DeepClusterV2MemoryOptions& options() const {
    return options_;
  }

  // VISSL's buffer names ("local_memory_embeddings", "local_memory_index", "assignments",
  // "centroids<h>") and the write position ("start_idx"), on the CPU.
  std::map<std::string, at::Tensor> state_dict() const;
  // Throws CheckpointError when a tensor is missing or its shape differs.
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

 private:
  DeepClusterV2MemoryOptions options_;
  at::Tensor embeddings_;     // [banks, size, d]
  at::Tensor sample_indexes_; // [size]
  at::Tensor assignments_;    // [heads, num_samples]
  std::vector<at::Tensor> centroids_;
  int64_t position_ = 0;
};

} // namespace largo::models
