// The loader's threads. Each worker owns the batches k with k % num_workers == its id and
// builds them in increasing order into its own bounded queue; the consumer takes batch k
// from queue k % num_workers, so delivery is in order without any reordering buffer.
#include "largo/data/data_loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "largo/core/error.h"
#include "largo/data/hash.h"

namespace largo::data {

uint64_t batch_seed(uint64_t seed, int64_t epoch, int64_t batch_index) {
  return hash_combine(
      hash_combine(seed, static_cast<uint64_t>(epoch)), static_cast<uint64_t>(batch_index));
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  if (dataset_ == nullptr) {
    throw ConfigError("DataLoader: dataset is null");
  }
  if (options_.batch_size < 1) {
    throw ConfigError(
        fmt::format("DataLoader: batch_size must be >= 1, got {}", options_.batch_size));
  }
  if (options_.num_workers < 0) {
    throw ConfigError(
        fmt::format("DataLoader: num_workers must be >= 0, got {}", options_.num_workers));
  }
  if (options_.prefetch_batches < 1) {
    throw ConfigError(fmt::format(
        "DataLoader: prefetch_batches must be >= 1, got {}", options_.prefetch_batches));
  }
}

DataLoader::~DataLoader() {
  stop_workers();
}

void DataLoader::start_epoch(
    const std::vector<int64_t>& indices, int64_t epoch, int64_t start_batch) {
  stop_workers();
  // Until the new epoch is validated, the loader is an empty epoch (not the stopped one).
  num_batches_ = 0;
  next_batch_ = 0;
  failed_ = nullptr;
  check_indices(indices, dataset_->size(), "the loader's dataset");
  const auto num_indices = static_cast<int64_t>(indices.size());
  const int64_t num_batches = options_.drop_last
                                  ? num_indices / options_.batch_size
                                  : (num_indices + options_.batch_size - 1) / options_.batch_size;
  if (start_batch < 0 || start_batch > num_batches) {
    throw ConfigError(fmt::format(
        "DataLoader: start_batch must be in [0, {}] for {} indices in "
        "batches of {}, got {}",
        num_batches,
        num_indices,
        options_.batch_size,
        start_batch));
  }
  indices_ = indices;
  epoch_ = epoch;
  num_batches_ = num_batches;
  next_batch_ = start_batch;

  const int64_t num_workers = options_.num_workers;
  if (num_workers == 0 || start_batch == num_batches) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = false;
    ready_.assign(static_cast<size_t>(num_workers), {});
  }
  workers_.reserve(static_cast<size_t>(num_workers));
  for (int64_t w = 0; w < num_workers; ++w) {
    workers_.emplace_back([this, w, start_batch] { worker_loop(w, start_batch); });
  }
}

std::optional<Batch> DataLoader::next() {
  if (failed_) {
    std::rethrow_exception(failed_);
  }
  if (next_batch_ >= num_batches_) {
    stop_workers(); // the workers are done; join them now rather than at the next epoch
    return std::nullopt;
  }
  const int64_t batch_index = next_batch_;
  if (options_.num_workers == 0) {
    try {
      Batch batch = build_batch(batch_index);
      ++next_batch_;
      return batch;
    } catch (...) {
      failed_ = std::current_exception();
      throw;
    }
  }

  Slot slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto& queue = ready_[static_cast<size_t>(batch_index % options_.num_workers)];
    batch_ready_.wait(lock, [&] { return !queue.empty(); });
    slot = std::move(queue.front());
    queue.pop_front();
  }
  slot_free_.notify_all();
  TORCH_INTERNAL_ASSERT(
      slot.batch_index == batch_index,
      "DataLoader: worker delivered batch ",
      slot.batch_index,
      " where ",
      batch_index,
      " was expected");
  if (slot.error) {
    failed_ = slot.error;
    stop_workers();
    std::rethrow_exception(failed_);
  }
  ++next_batch_;
  return std::move(slot.batch);
}

int64_t DataLoader::num_batches() const {
  return num_batches_;
}

int64_t DataLoader::next_batch_index() const {
  return next_batch_;
}

const DataLoaderOptions& DataLoader::options() const {
  return options_;
}

Batch DataLoader::build_batch(int64_t batch_index) const {
  const int64_t begin = batch_index * options_.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(indices_.size()));
  const std::vector<int64_t> batch_indices(indices_.begin() + begin, indices_.begin() + end);
  Batch batch = dataset_->get_batch(batch_indices);
  at::Generator gen =
      at::make_generator<at::CPUGeneratorImpl>(batch_seed(options_.seed, epoch_, batch_index));
  at::Tensor images = options_.transforms.apply(batch.images, gen);
  if (!images.is_floating_point()) {
    images = images.to(at::kFloat).div_(255.0); // as ToTensor
  } else if (images.scalar_type() != at::kFloat) {
    images = images.to(at::kFloat);
  }
  return Batch{images.contiguous(), batch.labels};
}

void DataLoader::worker_loop(int64_t worker_id, int64_t start_batch) {
  const int64_t stride = options_.num_workers;
  // The first batch this worker owns at or after the start batch.
  int64_t batch_index = start_batch + ((worker_id - start_batch % stride) + stride) % stride;
  auto& queue = ready_[static_cast<size_t>(worker_id)];
  for (; batch_index < num_batches_; batch_index += stride) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      slot_free_.wait(lock, [&] {
        return stop_ || static_cast<int64_t>(queue.size()) < options_.prefetch_batches;
      });
      if (stop_) {
        return;
      }
    }
    Slot slot{batch_index, std::nullopt, nullptr};
    try {
      slot.batch = build_batch(batch_index);
    } catch (...) {
      slot.error = std::current_exception();
    }
    const bool failed = slot.error != nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) {
        return;
      }
      queue.push_back(std::move(slot));
    }
    batch_ready_.notify_all();
    if (failed) {
      return; // the consumer rethrows when it reaches this batch and stops the others
    }
  }
}

void DataLoader::stop_workers() {
  if (workers_.empty()) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  slot_free_.notify_all();
  for (std::thread& worker : workers_) {
    worker.join();
  }
  workers_.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  ready_.clear();
  stop_ = false;
}

} // namespace largo::data
