// The loader's threads. Each worker owns the batches k with k % num_workers == its id and
// builds them in increasing order into its own bounded queue; the consumer takes batch k
// from queue k % num_workers, so delivery is in order without any reordering buffer.
#include "largo/data/data_loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "largo/core/channels_last.h"
#include "largo/core/error.h"
#include "largo/core/torch_compat.h"
#include "largo/data/hash.h"

namespace largo::data {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// out[b, c, ...] = table[c][images[b, c, ...]]: the elementwise tail applied to a uint8
// batch through a per-channel table of its 256 possible outputs.
at::Tensor lookup(const at::Tensor& images, const at::Tensor& table) {
  const at::Tensor input = images.contiguous();
  at::Tensor out = at::empty(input.sizes(), at::kFloat);
  const int64_t batch = input.size(0);
  const int64_t channels = input.size(1);
  const int64_t plane = input.numel() / std::max<int64_t>(batch * channels, 1);
  const auto* in = input.data_ptr<uint8_t>();
  auto* dst = out.data_ptr<float>();
  const auto* values = table.data_ptr<float>(); // [channels, 256]
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t c = 0; c < channels; ++c) {
      const float* row = values + c * 256;
      const int64_t offset = (b * channels + c) * plane;
      for (int64_t i = 0; i < plane; ++i) {
        dst[offset + i] = row[in[offset + i]];
      }
    }
  }
  return out;
}

} // namespace

double LoaderStats::images_per_second() const {
  return build_seconds > 0.0 ? static_cast<double>(num_images) / build_seconds *
                                   static_cast<double>(std::max<int64_t>(num_workers, 1))
                             : 0.0;
}

double LoaderStats::wait_fraction() const {
  return elapsed_seconds > 0.0 ? wait_seconds / elapsed_seconds : 0.0;
}

LoaderStats LoaderStats::operator-(const LoaderStats& earlier) const {
  LoaderStats delta = *this;
  delta.num_batches -= earlier.num_batches;
  delta.num_images -= earlier.num_images;
  delta.num_bad_samples -= earlier.num_bad_samples;
  delta.build_seconds -= earlier.build_seconds;
  delta.wait_seconds -= earlier.wait_seconds;
  delta.elapsed_seconds -= earlier.elapsed_seconds;
  return delta;
}

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
  if (!options_.device.is_cpu() && !options_.device.is_cuda()) {
    throw ConfigError(
        fmt::format("DataLoader: device must be cpu or cuda, got {}", options_.device.str()));
  }
  // The elementwise tail (ToTensor, Normalize) is split off to be fused or run on the device.
  const auto& transforms = options_.transforms.transforms();
  size_t tail = transforms.size();
  while (tail > 0 && transforms[tail - 1]->elementwise()) {
    --tail;
  }
  host_transforms_ = TransformPipeline(
      {transforms.begin(), transforms.begin() + static_cast<std::ptrdiff_t>(tail)});
  elementwise_transforms_ =
      TransformPipeline({transforms.begin() + static_cast<std::ptrdiff_t>(tail), transforms.end()});
  multi_view_ = !dataset_->view_shapes().empty();
  for (const auto& transform : host_transforms_.transforms()) {
    if (multi_view_ && !transform->elementwise()) {
      throw ConfigError(fmt::format(
          "DataLoader: the dataset makes several views per sample, but transforms holds the "
          "batch-level {}; only elementwise transforms (ToTensor, Normalize) apply to each "
          "view's batch",
          transform->name()));
    }
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
  stats_ = LoaderStats{};
  stats_.num_workers = options_.num_workers;
  epoch_start_ = Clock::now();

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
  const Clock::time_point asked = Clock::now();
  if (options_.num_workers == 0) {
    try {
      Batch batch = build_batch(batch_index, consumer_buffer_);
      const double built = seconds_since(asked);
      ++next_batch_;
      account(batch, built, built);
      return finish_on_device(std::move(batch));
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
  account(*slot.batch, slot.build_seconds, seconds_since(asked));
  return finish_on_device(std::move(*slot.batch));
}

void DataLoader::account(const Batch& batch, double build_seconds, double waited_seconds) {
  stats_.num_batches += 1;
  stats_.num_images += batch.labels.size(0);
  stats_.num_bad_samples += batch.num_bad_samples;
  stats_.build_seconds += build_seconds;
  stats_.wait_seconds += waited_seconds;
}

LoaderStats DataLoader::stats() const {
  LoaderStats stats = stats_;
  stats.elapsed_seconds = seconds_since(epoch_start_);
  return stats;
}

bool DataLoader::delivers_to_cuda() const {
  return options_.device.is_cuda();
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

Batch DataLoader::build_batch(int64_t batch_index, at::Tensor& buffer) const {
  const int64_t begin = batch_index * options_.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + options_.batch_size, static_cast<int64_t>(indices_.size()));
  BatchRequest request;
  request.indices.assign(indices_.begin() + begin, indices_.begin() + end);
  request.seed = options_.sample_seed.value_or(options_.seed);
  request.epoch = epoch_;
  if (multi_view_) {
    return build_views(std::move(request));
  }
  std::vector<int64_t> shape{options_.batch_size};
  const std::vector<int64_t> sample_shape = dataset_->sample_shape();
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  if (delivers_to_cuda()) {
    // Each batch travels on its own: the caching host allocator reuses a pinned block only
    // once the copy out of it has finished, which a hand-reused buffer could not know.
    const bool pin = options_.pin_memory && compat::cuda_available();
    request.images_buffer = at::empty(shape, at::TensorOptions(at::kByte).pinned_memory(pin));
  } else {
    if (!buffer.defined() || buffer.sizes() != at::IntArrayRef(shape)) {
      buffer = at::empty(shape, at::kByte);
    }
    request.images_buffer = buffer;
  }
  Batch batch = dataset_->load_batch(request);
  at::Generator gen =
      at::make_generator<at::CPUGeneratorImpl>(batch_seed(options_.seed, epoch_, batch_index));
  batch.images = host_transforms_.apply(batch.images, gen);
  const bool pin = delivers_to_cuda() && options_.pin_memory && compat::cuda_available();
  if (!delivers_to_cuda()) {
    batch.images = finish_on_host(batch.images);
  }
  if (options_.channels_last && batch.images.dim() == 4) {
    batch.images = to_channels_last(batch.images, pin); // one copy, pinned when it must be
  } else if (pin && !batch.images.is_pinned()) {
    batch.images = batch.images.pin_memory(); // a host transform made a new tensor
  }
  return batch;
}

Batch DataLoader::build_views(const BatchRequest& request) const {
  // Each view's batch is allocated by the dataset (no reused buffer: their shapes differ)
  // and finished on its own: one fused pass per view.
  Batch batch = dataset_->load_batch(request);
  const bool pin = delivers_to_cuda() && options_.pin_memory && compat::cuda_available();
  for (at::Tensor& view : batch.views) {
    if (!delivers_to_cuda()) {
      view = finish_on_host(view);
    } else if (pin) {
      view = view.pin_memory();
    }
  }
  return batch;
}

at::Tensor DataLoader::finish_on_host(const at::Tensor& images) const {
  at::Generator unused = at::make_generator<at::CPUGeneratorImpl>(0); // elementwise: no draws
  if (images.scalar_type() == at::kByte && images.dim() == 4) {
    // The tail applied to every possible value of every channel: [1, C, 1, 256].
    const int64_t channels = images.size(1);
    const at::Tensor probe =
        at::arange(256, at::kByte).view({1, 1, 1, 256}).expand({1, channels, 1, 256}).contiguous();
    at::Tensor table = elementwise_transforms_.apply(probe, unused);
    if (!table.is_floating_point()) {
      table = to_unit_float(table); // as ToTensor
    }
    return lookup(images, table.to(at::kFloat).contiguous());
  }
  at::Tensor result = elementwise_transforms_.apply(images, unused);
  if (!result.is_floating_point()) {
    result = to_unit_float(result); // as ToTensor
  } else if (result.scalar_type() != at::kFloat) {
    result = result.to(at::kFloat);
  }
  return result.contiguous();
}

Batch DataLoader::finish_on_device(Batch batch) const {
  if (!delivers_to_cuda()) {
    return batch;
  }
  const bool non_blocking = options_.non_blocking;
  at::Generator unused = at::make_generator<at::CPUGeneratorImpl>(0);
  auto finish = [&](const at::Tensor& host) {
    at::Tensor images = host.to(options_.device, /*non_blocking=*/non_blocking);
    images = elementwise_transforms_.apply(images, unused);
    if (!images.is_floating_point()) {
      images = to_unit_float(images); // as ToTensor
    } else if (images.scalar_type() != at::kFloat) {
      images = images.to(at::kFloat);
    }
    return images;
  };
  if (batch.images.defined()) {
    batch.images = finish(batch.images);
  }
  for (at::Tensor& view : batch.views) {
    view = finish(view);
  }
  batch.labels = batch.labels.to(options_.device, non_blocking);
  return batch;
}

void DataLoader::worker_loop(int64_t worker_id, int64_t start_batch) {
  const int64_t stride = options_.num_workers;
  // The first batch this worker owns at or after the start batch.
  int64_t batch_index = start_batch + ((worker_id - start_batch % stride) + stride) % stride;
  auto& queue = ready_[static_cast<size_t>(worker_id)];
  at::Tensor buffer; // this worker's reusable uint8 batch buffer
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
    const Clock::time_point started = Clock::now();
    try {
      slot.batch = build_batch(batch_index, buffer);
    } catch (...) {
      slot.error = std::current_exception();
    }
    slot.build_seconds = seconds_since(started);
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
