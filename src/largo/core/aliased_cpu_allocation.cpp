#include <largo/core/aliased_cpu_allocation.h>

#include <largo/core/error.h>
#include <largo/core/resources.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

namespace largo {
namespace {

size_t round_to_pages(size_t bytes) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// One instance for the process, never deleted: a StorageImpl keeps its allocator to grow
// (resize_), and an allocator installed during a scope (the memory counter) wraps this one
// for good, so after the scope it forwards to the allocator the first scope replaced. Its
// DataPtrs have the data pointer as their context, as c10's raw interface (oneDNN's scratch
// buffers) requires; the mapping's length is looked up when it is freed.
class ScratchAllocator final : public c10::Allocator {
 public:
  // The fallback is the allocator the first scope replaced: a later scope's predecessor may
  // be a wrapper of this one (the counter), and forwarding to it would loop.
  void begin(int fd, c10::Allocator* previous) {
    std::lock_guard<std::mutex> lock(mutex_);
    fd_ = fd;
    size_ = 0;
    if (fallback_ == nullptr) {
      fallback_ = previous;
    }
  }

  // Closing the file leaves the mappings alive; its pages go with the last one.
  void end() {
    std::lock_guard<std::mutex> lock(mutex_);
    close(fd_);
    fd_ = -1;
  }

  bool active() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return fd_ >= 0;
  }

  int64_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(size_);
  }

  c10::DataPtr allocate(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (fd_ < 0) {
      return fallback_->allocate(bytes);
    }
    if (bytes == 0) {
      return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
    }
    const size_t length = round_to_pages(bytes);
    grow(length);
    void* address = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (address == MAP_FAILED) {
      throw Error(fmt::format(
          "AliasedCpuAllocation: mapping {} bytes of the scratch file failed: {}",
          length,
          std::strerror(errno)));
    }
    lengths_.emplace(address, length);
    return c10::DataPtr(address, address, &free_any, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_any;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  // The scratch's pages are real once written: a tensor larger than the memory left is
  // refused here as the allocation guard refuses it (resources.h).
  void grow(size_t length) {
    if (length <= size_) {
      return;
    }
    require_allocation_memory(length - size_);
    if (ftruncate(fd_, static_cast<off_t>(length)) != 0) {
      throw Error(fmt::format(
          "AliasedCpuAllocation: growing the scratch file to {} bytes failed: {}",
          length,
          std::strerror(errno)));
    }
    size_ = length;
  }

  // A mapping this allocator made, or memory its fallback served (through the raw interface).
  static void free_any(void* data);

  mutable std::mutex mutex_;
  int fd_ = -1;
  size_t size_ = 0;
  c10::Allocator* fallback_ = nullptr;
  std::unordered_map<void*, size_t> lengths_;
};

ScratchAllocator& scratch_allocator() {
  static auto* allocator = new ScratchAllocator();
  return *allocator;
}

void ScratchAllocator::free_any(void* data) {
  ScratchAllocator& self = scratch_allocator();
  size_t length = 0;
  c10::DeleterFnPtr fallback_delete = nullptr;
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    const auto found = self.lengths_.find(data);
    if (found != self.lengths_.end()) {
      length = found->second;
      self.lengths_.erase(found);
    } else {
      fallback_delete = self.fallback_->raw_deleter();
    }
  }
  if (length > 0) {
    munmap(data, length);
    return;
  }
  TORCH_INTERNAL_ASSERT(fallback_delete != nullptr, "freeing memory no CPU allocator served");
  fallback_delete(data);
}

} // namespace

// The highest priority, which the memory counter and the allocation guard install theirs
// with: a lower one would not replace them.
AliasedCpuAllocation::AliasedCpuAllocation() : previous_(c10::GetCPUAllocator()) {
  ScratchAllocator& scratch = scratch_allocator();
  if (scratch.active()) {
    throw Error("AliasedCpuAllocation: another one is alive; they do not nest");
  }
  const int fd = memfd_create("largo-aliased-cpu-allocation", MFD_CLOEXEC);
  if (fd < 0) {
    throw Error(fmt::format("AliasedCpuAllocation: memfd_create failed: {}", std::strerror(errno)));
  }
  scratch.begin(fd, previous_);
  c10::SetCPUAllocator(&scratch, /*priority=*/UINT8_MAX);
}

// An allocator installed during the scope wraps the scratch one: it stays, and the scratch
// forwards to the allocator the first scope replaced.
AliasedCpuAllocation::~AliasedCpuAllocation() {
  if (c10::GetCPUAllocator() == &scratch_allocator()) {
    c10::SetCPUAllocator(previous_, /*priority=*/UINT8_MAX);
  }
  scratch_allocator().end();
}

int64_t AliasedCpuAllocation::scratch_bytes() const {
  return scratch_allocator().size();
}

} // namespace largo
