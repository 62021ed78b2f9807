// Turns an epoch's sample order into transformed float batches, built ahead of use by
// worker threads.
//
// Reproducibility contract: batch k of an epoch is a pure function of (dataset, the
// epoch's index order, batch_size, drop_last, transforms, seed, epoch, k). Its transform
// generator is seeded with batch_seed(seed, epoch, k), and a dataset's per-sample draws
// with sample_seed(seed, epoch, index) (dataset.h), so the output is bit-identical for
// any num_workers and when an epoch is restarted at start_batch = k (mid-epoch resume).
//
// Multi-view datasets (Dataset::view_shapes, e.g. an ImageDataset with a MultiViewPipeline)
// deliver Batch::views, one float32 tensor [batch, channels, h_k, w_k] per view, each with
// the elementwise tail applied; the batch-level RandomHorizontalFlip/RandomCrop do not
// apply to them (the constructor refuses).
//
// Memory: each worker decodes into one reused uint8 batch buffer and holds at most
// prefetch_batches finished batches. The trailing elementwise transforms (ToTensor,
// Normalize) run fused, as one table lookup per value, on the CPU; for a CUDA device they
// run there instead, after a copy of the uint8 batch (4x fewer bytes) from pinned memory.
//
// Typical use:
//   sampler.set_epoch(epoch);
//   loader.start_epoch(sampler.indices(), epoch);
//   while (auto batch = loader.next()) { ... }
// On resume, pass the full epoch order and the batch to continue from
// (StatefulDistributedSampler::epoch_indices() and start_iter()).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "largo/data/dataset.h"
#include "largo/data/transforms.h"

namespace largo::data {

// What one epoch's loading cost so far (DataLoader::stats). Take differences of two
// snapshots for an interval.
struct LoaderStats {
  int64_t num_batches = 0;     // delivered by next()
  int64_t num_images = 0;      // in those batches
  int64_t num_bad_samples = 0; // replaced (ImageDataset's skip_bad_samples)
  // Thread time spent building the delivered batches (read, decode, transform), summed
  // over the workers (the consumer's own time with num_workers = 0).
  double build_seconds = 0.0;
  // Time the consumer spent inside next() waiting for a batch: a step starved by data.
  double wait_seconds = 0.0;
  // Wall time since start_epoch.
  double elapsed_seconds = 0.0;
  int64_t num_workers = 0;

  // The rate the loader sustains with all its threads busy: images per building second,
  // times the threads (at least 1).
  double images_per_second() const;
  // wait_seconds / elapsed_seconds.
  double wait_fraction() const;
  LoaderStats operator-(const LoaderStats& earlier) const;
};

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
  // Seeds the per-batch transform generators (see batch_seed) and, unless sample_seed is
  // set, the dataset's per-sample ones (sample_seed()).
  uint64_t seed = 0;
  // The per-sample seed when it must differ from `seed`: a data-parallel run gives each rank
  // its own batch seed (batch k of every rank would draw alike otherwise) but one sample seed,
  // so a sample is augmented alike at any world size (sample draws are keyed by its index).
  std::optional<uint64_t> sample_seed;
  // Where next() delivers batches (DATA.* keys in a config). On a CUDA device the uint8
  // batch is copied there and the trailing elementwise transforms run there.
  at::Device device = at::kCPU;
  // CUDA only: build batches in page-locked host memory (DATA.PIN_MEMORY), and copy them
  // with non_blocking=true so the host goes on while they travel
  // (DATA.ENABLE_ASYNC_GPU_COPY; needs pinned memory to be asynchronous).
  bool pin_memory = true;
  bool non_blocking = true;
  // Deliver [batch, C, H, W] images in the channels-last layout (core/channels_last.h), made
  // on the host by the workers (uint8 before a CUDA copy, which keeps the strides), for a
  // model whose convolutions run channels-last. Multi-view batches are left as they are
  // (pack_views flattens them; the model's first convolution makes its own layout).
  bool channels_last = false;
};

// The seed of batch `batch_index`'s transform generator in `epoch`. Stable by contract.
uint64_t batch_seed(uint64_t seed, int64_t epoch, int64_t batch_index);

class DataLoader {
 public:
  // Throws ConfigError for a null dataset, batch_size < 1, num_workers < 0 or
  // prefetch_batches < 1, and for batch-level host transforms with a multi-view dataset.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  // Stops and joins the workers (batches not yet taken are discarded).
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Begins an epoch that reads `indices` in order, starting at batch `start_batch`
  // (0 <= start_batch <= num_batches()). An epoch still running is stopped first.
  // Throws DataError for an index outside the dataset, ConfigError for a bad start_batch.
  void start_epoch(const std::vector<int64_t>& indices, int64_t epoch, int64_t start_batch = 0);

  // The next batch of the epoch (images float32 [batch, channels, h, w], or views, labels
  // int64 [batch]), or nullopt when the epoch is done. An exception thrown while building a batch
  // (by the dataset or a transform) is rethrown here, in batch order, and again on every
  // later call until the next start_epoch.
  std::optional<Batch> next();

  // Batches in the current epoch, counting from batch 0 (not from start_batch).
  int64_t num_batches() const;
  // The index of the batch next() returns next.
  int64_t next_batch_index() const;
  const DataLoaderOptions& options() const;
  // This epoch's loading so far.
  LoaderStats stats() const;

 private:
  // A built batch or the exception that stopped its building.
  struct Slot {
    int64_t batch_index;
    std::optional<Batch> batch;
    std::exception_ptr error;
    double build_seconds = 0.0;
  };

  // Builds batch `batch_index` on the host; `buffer` is the calling thread's reusable uint8
  // batch buffer (allocated on first use).
  Batch build_batch(int64_t batch_index, at::Tensor& buffer) const;
  // A multi-view dataset's batch: each view finished (fused) on the host, or pinned.
  Batch build_views(const BatchRequest& request) const;
  // The trailing elementwise transforms (ToTensor, Normalize) of a host-built batch: fused
  // on the CPU, or on the device after the copy.
  at::Tensor finish_on_host(const at::Tensor& images) const;
  Batch finish_on_device(Batch batch) const;
  bool delivers_to_cuda() const;
  // Adds a delivered batch to this epoch's statistics.
  void account(const Batch& batch, double build_seconds, double waited_seconds);
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

  // options_.transforms split: run on the host by the workers / elementwise tail.
  TransformPipeline host_transforms_;
  TransformPipeline elementwise_transforms_;
  bool multi_view_ = false;    // the dataset delivers Batch::views
  at::Tensor consumer_buffer_; // num_workers == 0: the consumer's reusable batch buffer

  LoaderStats stats_;
  std::chrono::steady_clock::time_point epoch_start_;

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
