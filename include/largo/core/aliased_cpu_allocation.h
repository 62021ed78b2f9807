// Building a model only to read its shapes: while an AliasedCpuAllocation is alive, every CPU
// tensor allocated (on any thread) is a view of one shared scratch file, so a model of tens
// of GB can be constructed, initialised and cast on a machine of a few GiB, the memory it takes
// being its largest tensor. The tensors' values are garbage (every tensor writes over every
// other); their shapes, dtypes, names and counts are right.
//
// Why: `largo estimate` sizes a run from the model's parameters, and SEER's 10B RegNet holds
// 36 GiB of float32 values the estimate never reads. libtorch's C++ modules have no meta-device
// construction (Python's `torch.device("meta")` context is a TorchFunctionMode), so the
// allocation is what is made cheap: each allocation maps the first bytes of one memfd
// (MAP_SHARED), grown to the largest request, and its deleter unmaps it. Each live tensor is
// one mapping: the kernel's vm.max_map_count (65,530 by default) bounds how many live at once.
//
// Only for work whose results depend on shapes alone (parallel::estimate_memory without a
// pipeline): no training, no forward (a value read as an index, a label, would be garbage),
// no checkpoint, no comparison. Tensors from the scope stay valid (aliased) after it ends.
// The allocator in place before comes back when it ends; one installed inside it (the memory
// counter) wraps the scratch allocator for good, which then forwards to the allocator the
// first scope replaced. A memory counter installed before the scope does not see the
// scope's allocations. Not nestable.
#pragma once

#include <cstdint>

namespace c10 {
struct Allocator;
}

namespace largo {

class AliasedCpuAllocation {
 public:
  // Throws largo::Error when the scratch file cannot be made (memfd_create) or another
  // AliasedCpuAllocation is alive.
  AliasedCpuAllocation();
  ~AliasedCpuAllocation();
  AliasedCpuAllocation(const AliasedCpuAllocation&) = delete;
  AliasedCpuAllocation& operator=(const AliasedCpuAllocation&) = delete;

  // The scratch file's size: the largest allocation so far, rounded up to a page.
  int64_t scratch_bytes() const;

 private:
  c10::Allocator* previous_;
};

} // namespace largo
