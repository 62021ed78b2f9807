// Turns an epoch's sample order into transformed float batches, built ahead of use by
// worker threads.
//
// Reproducibility contract: batch k of an epoch is a pure function of (dataset, the
// epoch's index order, batch_size, drop_last, transforms, seed, epoch, k). Its transform
// generator is seeded with batch_seed(seed, epoch, k), so the output is bit-identical for
// any num_workers and when an epoch is restarted at start_batch = k (mid-epoch resume).
//
// Typical use:
//   sampler.set_epoch(epoch);
//   loader.start_epoch(sampler.indices(), epoch);
//   while (auto batch = loader.next()) { ... }
// On resume, pass the full epoch order and the batch to continue from
// (StatefulDistributedSampler::epoch_indices() and start_iter()).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "largo/data/dataset.h"
#include "largo/data/transforms.h"

namespace largo::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  // Threads that build batches ahead; 0 builds each batch in next(), on the calling thread.
  int64_t num_workers = 0;
  // Batches each worker may hold ready ahead of the consumer.
  int64_t prefetch_batches = 2;
  // Drop the last batch when it would be smaller than batch_size.
  bool drop_last = false;
  // Applied to every batch; images still uint8 afterwards are converted as ToTensor does.
  TransformPipeline transforms;
  // Seeds the per-batch transform generators (see batch_seed).
  uint64_t seed = 0;
};

// The seed of batch `batch_index`'s transform generator in `epoch`. Stable by contract.
uint64_t batch_seed(uint64_t seed, int64_t epoch, int64_t batch_index);

class DataLoader {
 public:
  // Throws ConfigError for a null dataset, batch_size < 1, num_workers < 0 or
  // prefetch_batches < 1.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  // Stops and joins the workers (batches not yet taken are discarded).
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Begins an epoch that reads `indices` in order, starting at batch `start_batch`
  // (0 <= start_batch <= num_batches()). An epoch still running is stopped first.
  // Throws DataError for an index outside the dataset, ConfigError for a bad start_batch.
  void start_epoch(const std::vector<int64_t>& indices, int64_t epoch, int64_t start_batch = 0);

  // The next batch of the epoch (images float32 [batch, channels, h, w], labels int64
  // [batch]), or nullopt when the epoch is done. An exception thrown while building a batch
  // (by the dataset or a transform) is rethrown here, in batch order, and again on every
  // later call until the next start_epoch.
  std::optional<Batch> next();

  // Batches in the current epoch, counting from batch 0 (not from start_batch).
  int64_t num_batches() const;
  // The index of the batch next() returns next.
  int64_t next_batch_index() const;
  const DataLoaderOptions& options() const;

 private:
  // A built batch or the exception that stopped its building.
  struct Slot {
    int64_t batch_index;
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  Batch build_batch(int64_t batch_index) const;
  void worker_loop(int64_t worker_id, int64_t start_batch);
  void stop_workers();

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;

  // The current epoch (written only by start_epoch, while no worker runs).
  std::vector<int64_t> indices_;
  int64_t epoch_ = 0;
  int64_t num_batches_ = 0;
  int64_t next_batch_ = 0;    // consumer side
  std::exception_ptr failed_; // set once a batch failed; rethrown by next()

  // Worker state, guarded by mutex_. Worker w builds batches k with k % W == w, in order,
  // and appends them to ready_[w]; the consumer takes batch k from the front of ready_[k % W].
  std::mutex mutex_;
  std::condition_variable batch_ready_; // a worker appended to its queue
  std::condition_variable slot_free_;   // the consumer took a batch, or stop was requested
  std::vector<std::deque<Slot>> ready_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

} // namespace largo::data
