// The data side of a training run: both splits loaded, DATA_LIMIT subsets, this rank's
// share of each epoch (PyTorch's DistributedSampler, VISSL's StatefulDistributedSampler, or
// for DATA_SOURCES [webdataset] the shard streams of data::WebDatasetSampler, one per loader
// thread) and of the test set, and the loaders that turn them into batches. The number of
// batches and optimizer steps per epoch is derived here, once.
//
// Every rank reads the same number of samples per epoch (the samplers pad or drop to make
// it so), hence takes the same number of steps, so the collectives of the steps stay paired.
// No collectives.
#pragma once

#include <largo/checkpoint/training_state.h>
#include <largo/data/data_loader.h>
#include <largo/data/dataset.h>
#include <largo/data/sampler.h>
#include <largo/data/webdataset_sampler.h>
#include <largo/train/trainer_options.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace largo::train {

class TrainingData {
 public:
  // Opens both splits (data/dataset_factory.h; DataError naming the file for missing or bad
  // data) and builds the loaders for `rank` of `world_size`, delivering batches on `device`.
  // An evaluation-only run (TEST_ONLY) opens DATA.TEST alone: the training split is empty,
  // with no loader and no iterations; a self-supervised run without TEST_MODEL opens
  // DATA.TRAIN alone (TrainerOptions::reads_test_split). Throws ConfigError when an epoch would
  // have no optimizer step.
  TrainingData(const TrainerOptions& options, int rank, int world_size,
               torch::Device device = torch::kCPU);

  // This rank's dataset indices for training epoch `epoch`, in order; with `earlier`
  // stretches (an epoch continued at another world size; the stateful sampler only), its
  // share of the samples they left unread (data::StatefulDistributedSampler).
  std::vector<int64_t>
  train_epoch_order(int64_t epoch, const std::vector<checkpoint::ReadStretch>& earlier = {}) const;
  // How far through the epoch `earlier` stretches read, as a fraction of its samples.
  double fraction_read(const std::vector<checkpoint::ReadStretch>& earlier) const;
  // Optimizer steps that read `samples_per_rank` samples: batches (DATA.TRAIN.DROP_LAST
  // drops a short last one), gradient_accumulation_steps at a time.
  int64_t iterations_for(int64_t samples_per_rank) const;
  // How the training order is drawn, for the checkpoint's train_sampler entry.
  checkpoint::SamplerDescription sampler_description() const;
  // This rank's share of the test set: every world_size-th sample from its rank on, with no
  // padding, so each sample is evaluated exactly once and the summed counts are exact.
  std::vector<int64_t> test_order() const;
  // The same share of the training set, unshuffled: each training sample read once over the
  // ranks (feature extraction, train/feature_extraction.h).
  std::vector<int64_t> train_order() const;

  data::DataLoader& train_loader(); // not in an evaluation-only run
  data::DataLoader& test_loader() { // not when the run reads no test split
    TORCH_INTERNAL_ASSERT(test_loader_, "this run reads no test split (reads_test_split)");
    return *test_loader_;
  }
  // [channels, h, w] of the samples each split's loader delivers.
  const std::vector<int64_t>& train_sample_shape() const {
    return train_shape_;
  }
  const std::vector<int64_t>& test_sample_shape() const {
    return test_shape_;
  }
  // A multi-view training split (ImgPilToMultiCrop, ImgReplicatePil): [channels, h, w] of
  // each view, in view order, as the loader delivers them in Batch::views; train_sample_shape
  // is view 0's. Empty for one image per sample (and in an evaluation-only run).
  const std::vector<std::vector<int64_t>>& train_view_shapes() const {
    return train_view_shapes_;
  }
  int64_t num_train_samples() const {
    return static_cast<int64_t>(train_subset_.size());
  }
  // The images of the training dataset the subset is drawn from: every sample index is below.
  int64_t train_dataset_size() const {
    return train_data_ ? train_data_->size() : 0;
  }
  // The samples a rank reads in a whole epoch: its share, less a short last batch that
  // DATA.TRAIN.DROP_LAST drops.
  int64_t train_samples_per_epoch() const;
  int64_t num_test_samples() const {
    return static_cast<int64_t>(test_subset_.size());
  }
  // Optimizer steps per epoch: this rank's batches, gradient_accumulation_steps at a time
  // (the last step takes what is left).
  int64_t iterations_per_epoch() const {
    return iterations_per_epoch_;
  }

 private:
  void open_train_split(torch::Device device);
  data::StatefulDistributedSampler
  stateful_sampler(int64_t epoch, const std::vector<checkpoint::ReadStretch>& earlier) const;
  bool streams_webdataset() const;
  // DATA_SOURCES [webdataset]: its streaming order at `epoch` (ConfigError naming the keys
  // when the shards cannot feed every rank's loader threads).
  data::WebDatasetSampler webdataset_sampler(int64_t epoch) const;

  TrainerOptions options_;
  int rank_;
  int world_size_;
  std::shared_ptr<const data::Dataset> train_data_;
  std::shared_ptr<const data::Dataset> test_data_;
  std::vector<int64_t> train_shape_;
  std::vector<int64_t> test_shape_;
  std::vector<std::vector<int64_t>> train_view_shapes_;
  std::vector<int64_t> train_subset_; // dataset indices the sampler's positions map to
  std::vector<int64_t> train_shard_sizes_; // webdataset: samples per shard
  std::vector<int64_t> test_subset_;
  std::unique_ptr<data::DataLoader> train_loader_;
  std::unique_ptr<data::DataLoader> test_loader_;
  int64_t iterations_per_epoch_ = 0;
};

} // namespace largo::train
