// Sizing work to the machine: the CPU cores and the memory this process may use, checks that
// refuse counts and sizes beyond them before any work starts (naming the key or component
// that asked), and a guard on the CPU allocator that turns an allocation larger than the
// memory left into a clear error instead of an out-of-memory kill or a libtorch stack trace.
//
// Why a guard: Linux overcommits, so malloc of more than is free usually succeeds and the
// process is killed later, when the pages are touched (initialising a 10^12-parameter layer).
// The guard checks every allocation of 64 MiB or more against the memory available now
// (MemAvailable + SwapFree, capped by the cgroup's limit) and throws ResourceError
//   "building the model (MODEL.TRUNK.*) needs 3725.3 GiB for one tensor; this machine has
//    12.1 GiB available"
// where the first words come from the innermost AllocationContext on the thread.
// No collectives.
#pragma once

#include <largo/core/error.h>

#include <cstdint>
#include <initializer_list>
#include <string>

namespace largo {

// Cores this process may run on: its CPU affinity mask, capped by a cgroup CPU quota.
int64_t available_cpu_cores();

// Bytes this process can still allocate without swapping to death: MemAvailable + SwapFree
// from /proc/meminfo, capped by the cgroup memory limit minus its usage.
uint64_t available_memory_bytes();

// Throws ResourceError "<what> needs N GiB; this machine has M GiB available" when `bytes`
// exceeds available_memory_bytes(). `what` names the key or component that asked.
void require_memory(uint64_t bytes, const std::string& what);

// require_memory for an allocation of `bytes`, naming the innermost AllocationContext on this
// thread (or "an allocation" outside any): what the allocation guard and
// AliasedCpuAllocation's scratch check.
void require_allocation_memory(uint64_t bytes);

// a * b (and a * b * c ...) in uint64, or UINT64_MAX when the product overflows: sizes from
// user input multiplied safely before they are compared with the machine.
uint64_t saturating_product(std::initializer_list<uint64_t> factors);

// While alive, names what the current thread is allocating for, in the guard's errors
// ("building the model (MODEL.TRUNK.*)"). Nests; the innermost one is named.
class AllocationContext {
 public:
  explicit AllocationContext(std::string what);
  ~AllocationContext();
  AllocationContext(const AllocationContext&) = delete;
  AllocationContext& operator=(const AllocationContext&) = delete;

  // The innermost context's description on this thread, or "" outside any.
  static std::string current();

 private:
  std::string what_;
  const AllocationContext* outer_;
};

// Wraps c10's CPU allocator in the guard described above. Idempotent and thread-safe; the
// largo program installs it at start-up, library users may.
void install_allocation_guard();
bool allocation_guard_installed();

} // namespace largo
