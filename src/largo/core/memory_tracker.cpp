#include <largo/core/memory_tracker.h>

#include <largo/core/error.h>
#include <largo/core/torch_compat.h>

#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>

#include <ATen/DeviceAccelerator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace largo {
namespace {

// Serves every CPU allocation from the allocator it wraps and counts the bytes. The
// DataPtr it returns has the data pointer as its context (so the raw allocate/deallocate
// interface keeps working) and a deleter that looks the allocation up, uncounts it and
// lets the wrapped allocator's own DataPtr free it.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t num_bytes) override {
    c10::DataPtr inner = wrapped_->allocate(num_bytes);
    void* data = inner.get();
    if (data == nullptr) {
      return inner; // zero bytes: nothing to count, nothing to free
    }
    const c10::Device device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(data, Allocation{static_cast<int64_t>(num_bytes), std::move(inner)});
      const int64_t now =
          current_.fetch_add(static_cast<int64_t>(num_bytes)) + static_cast<int64_t>(num_bytes);
      if (now > peak_.load()) {
        peak_.store(now); // writers hold the mutex, so no update is lost
      }
    }
    return {data, data, &delete_counted, device};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &delete_counted;
  }

  void copy_data(void* destination, const void* source, std::size_t count) const override {
    default_copy_data(destination, source, count);
  }

  int64_t current() const {
    return current_.load();
  }
  int64_t peak() const {
    return peak_.load();
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_.store(current_.load());
  }

  static CountingCpuAllocator* instance; // set once by install_cpu_memory_counter()

 private:
  struct Allocation {
    int64_t num_bytes;
    c10::DataPtr inner; // frees the memory through the wrapped allocator when destroyed
  };

  static void delete_counted(void* data) {
    CountingCpuAllocator* self = instance;
    c10::DataPtr inner;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto it = self->live_.find(data);
      if (it == self->live_.end()) {
        // Memory the wrapped allocator served before the counter was installed, given back
        // through the raw interface of whichever allocator is current now (oneDNN does
        // this with its scratch buffers): the wrapped allocator frees it, uncounted.
        c10::DeleterFnPtr wrapped_delete = self->wrapped_->raw_deleter();
        TORCH_INTERNAL_ASSERT(wrapped_delete != nullptr, "freeing memory no CPU allocator served");
        wrapped_delete(data);
        return;
      }
      self->current_.fetch_sub(it->second.num_bytes);
      inner = std::move(it->second.inner);
      self->live_.erase(it);
    }
    // `inner` frees the memory here, outside the lock.
  }

  c10::Allocator* wrapped_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Allocation> live_;
  mutable std::atomic<int64_t> current_{0};
  mutable std::atomic<int64_t> peak_{0};
};

CountingCpuAllocator* CountingCpuAllocator::instance = nullptr;

std::once_flag install_once;

bool is_cpu(const torch::Device& device) {
  return device.type() == c10::DeviceType::CPU;
}

constexpr size_t kAggregate = 0; // StatType::AGGREGATE: every pool together
c10::DeviceIndex cuda_index(const torch::Device& device) {
  return device.has_index() ? device.index() : at::accelerator::getDeviceIndex();
}

} // namespace

void install_cpu_memory_counter() {
  std::call_once(install_once, [] {
    // Never deleted: memory it served may be freed at any time until the process ends.
    auto* counter = new CountingCpuAllocator(c10::GetCPUAllocator());
    CountingCpuAllocator::instance = counter;
    // The highest priority, so that a later SetCPUAllocator of default priority does not
    // silently bypass the counter.
    c10::SetCPUAllocator(counter, /*priority=*/UINT8_MAX);
  });
}

bool cpu_memory_counter_installed() {
  return CountingCpuAllocator::instance != nullptr;
}

bool MemoryTracker::supported(const torch::Device& device) {
  if (is_cpu(device)) {
    return true;
  }
  return device.is_cuda() && compat::cuda_available();
}

MemoryTracker::MemoryTracker(torch::Device device) : device_(device) {
  if (!supported(device_)) {
    throw Error(fmt::format(
        "cannot measure the memory of device {}: no such device is visible to this process "
        "(CUDA memory is measured on a visible GPU with a CUDA build of libtorch)",
        device_.str()));
  }
  if (is_cpu(device_)) {
    install_cpu_memory_counter();
  } else {
    // The caching allocator starts lazily, at the first allocation on the device, and
    // refuses queries for a device it has not started; one tiny allocation starts it.
    at::empty({1}, at::TensorOptions().device(device_));
  }
  window_start_bytes_ = current_bytes();
}

int64_t MemoryTracker::current_bytes() const {
  if (is_cpu(device_)) {
    return CountingCpuAllocator::instance->current();
  }
  return at::accelerator::getDeviceStats(cuda_index(device_)).allocated_bytes[kAggregate].current;
}

int64_t MemoryTracker::peak_bytes() const {
  if (is_cpu(device_)) {
    return CountingCpuAllocator::instance->peak();
  }
  return at::accelerator::getDeviceStats(cuda_index(device_)).allocated_bytes[kAggregate].peak;
}

void MemoryTracker::start_window() {
  if (is_cpu(device_)) {
    CountingCpuAllocator::instance->reset_peak();
  } else {
    at::accelerator::resetPeakStats(cuda_index(device_));
  }
  window_start_bytes_ = current_bytes();
}

int64_t MemoryTracker::window_peak_bytes() const {
  return std::max<int64_t>(0, peak_bytes() - window_start_bytes_);
}

int64_t MemoryTracker::window_current_bytes() const {
  return current_bytes() - window_start_bytes_;
}

} // namespace largo
