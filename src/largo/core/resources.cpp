#include <largo/core/byte_format.h>
#include <largo/core/resources.h>

#include <c10/core/CPUAllocator.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <sched.h>
#include <sstream>
#include <thread>

namespace largo {
namespace {

constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

// The first number in a small file (cgroup limits), or nullopt ("max", missing file).
std::optional<uint64_t> read_number(const char* path) {
  std::ifstream in(path);
  uint64_t value = 0;
  if (in >> value) {
    return value;
  }
  return std::nullopt;
}

// kB values of /proc/meminfo.
uint64_t meminfo_bytes(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream values(line.substr(field.size() + 1));
      uint64_t kib = 0;
      values >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

uint64_t cgroup_memory_left() {
  // cgroup v2, then v1 (whose "no limit" is a huge number, which is as good as none).
  if (auto limit = read_number("/sys/fs/cgroup/memory.max")) {
    const uint64_t used = read_number("/sys/fs/cgroup/memory.current").value_or(0);
    return *limit > used ? *limit - used : 0;
  }
  if (auto limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
    const uint64_t used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes").value_or(0);
    return *limit > used ? *limit - used : 0;
  }
  return kUnlimited;
}

thread_local const AllocationContext* innermost_context = nullptr;

// Serves every allocation from the allocator it wraps; refuses one larger than the memory
// available (checked only from kCheckedBytes up, so small allocations cost nothing).
class GuardedCpuAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kCheckedBytes = size_t{64} << 20;

  explicit GuardedCpuAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}

  c10::DataPtr allocate(size_t num_bytes) override {
    if (num_bytes >= kCheckedBytes) {
      require_allocation_memory(num_bytes);
    }
    return wrapped_->allocate(num_bytes);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return wrapped_->raw_deleter();
  }

  void copy_data(void* destination, const void* source, std::size_t count) const override {
    default_copy_data(destination, source, count);
  }

 private:
  c10::Allocator* wrapped_;
};

std::once_flag guard_once;
bool guard_installed = false;

} // namespace

int64_t available_cpu_cores() {
  int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    cores = std::max(1, CPU_COUNT(&mask));
  }
  // cgroup v2 cpu.max: "<quota> <period>" or "max <period>".
  std::ifstream cpu_max("/sys/fs/cgroup/cpu.max");
  uint64_t quota = 0;
  uint64_t period = 0;
  if (cpu_max >> quota >> period && period > 0) {
    cores = std::min<int64_t>(cores, std::max<uint64_t>(1, (quota + period - 1) / period));
  }
  return cores;
}

uint64_t available_memory_bytes() {
  const uint64_t system = meminfo_bytes("MemAvailable") + meminfo_bytes("SwapFree");
  return std::min(system, cgroup_memory_left());
}

void require_memory(uint64_t bytes, const std::string& what) {
  const uint64_t available = available_memory_bytes();
  if (bytes > available) {
    throw ResourceError(fmt::format(
        "{} needs {}{}; this machine has {} available. Use a smaller size, or a machine with "
        "more memory.",
        what,
        bytes == kUnlimited ? "more than 16 EiB" : format_bytes(bytes),
        bytes == kUnlimited ? "" : fmt::format(" ({} bytes)", bytes),
        format_bytes(available)));
  }
}

void require_allocation_memory(uint64_t bytes) {
  const std::string context = AllocationContext::current();
  require_memory(bytes, context.empty() ? "an allocation" : context);
}

uint64_t saturating_product(std::initializer_list<uint64_t> factors) {
  uint64_t product = 1;
  for (uint64_t factor : factors) {
    if (__builtin_mul_overflow(product, factor, &product)) {
      return kUnlimited;
    }
  }
  return product;
}

AllocationContext::AllocationContext(std::string what)
    : what_(std::move(what)), outer_(innermost_context) {
  innermost_context = this;
}

AllocationContext::~AllocationContext() {
  innermost_context = outer_;
}

std::string AllocationContext::current() {
  return innermost_context == nullptr ? std::string() : innermost_context->what_;
}

void install_allocation_guard() {
  std::call_once(guard_once, [] {
    // Never deleted: memory it served may be freed until the process ends. The highest
    // priority, as the memory counter (memory_tracker.h) uses, so either may wrap the other.
    auto* guard = new GuardedCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(guard, /*priority=*/UINT8_MAX);
    guard_installed = true;
  });
}

bool allocation_guard_installed() {
  return guard_installed;
}

} // namespace largo
