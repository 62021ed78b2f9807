// Data parallelism over a process group: every rank holds the whole model, runs its own
// batch, and the gradients are averaged over the ranks before the optimizer step, so N
// ranks with batch B train like one process with batch N * B.
//
// How (as PyTorch's DDP does it):
// - At construction, rank 0's parameters and buffers are broadcast, so every rank starts
//   from the same model.
// - Gradients live in flat buckets (about bucket_cap_bytes each; the first bucket is small,
//   so communication starts early); each parameter's .grad is a view into its bucket, so
//   nothing is copied. Buckets take the parameters in reverse registration order, the
//   order in which backward produces their gradients.
// - A post-hook on each parameter's gradient accumulator marks it ready; a bucket whose
//   parameters are all ready is all-reduced at once, while backward goes on computing the
//   rest (overlap). Buckets are launched in index order on every rank, so the collectives
//   pair up across ranks even when gradients become ready in a different order.
// - At the end of backward (a callback queued on the autograd engine) every bucket is waited
//   for and divided by the world size. No call after backward is needed.
//
// Modes: delay_allreduce (Apex: no overlap, all buckets after backward), manual_reduction
// (VISSL's MANUAL_GRADIENT_REDUCTION: no hooks; call reduce_gradients() after backward),
// no_sync() (gradient accumulation: gradients accumulate locally, the next synchronized
// backward reduces the sum), find_unused_parameters (parameters that got no gradient count
// as zero instead of being an error).
//
// Collectives: the constructor (broadcasts), before_forward() when broadcast_buffers is on
// (a broadcast), every synchronized backward (one all-reduce per bucket) and
// reduce_gradients(). Every rank must make the same calls in the same order.
#pragma once

#include <largo/comm/process_group.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace largo::parallel {

struct DistributedDataParallelOptions {
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;      // DATA.DDP_BUCKET_CAP_MB
  int64_t first_bucket_cap_bytes = 1024 * 1024;     // PyTorch's first-bucket size
  bool broadcast_buffers = true;                    // DISTRIBUTED.BROADCAST_BUFFERS
  bool delay_allreduce = false;                     // Apex DDP's delay_allreduce
  bool manual_reduction = false;                    // DISTRIBUTED.MANUAL_GRADIENT_REDUCTION
  bool find_unused_parameters = false;
};

class DistributedDataParallel {
 public:
  // Broadcasts rank 0's parameters and buffers (a collective) and sets up the buckets and
  // hooks for `module`'s parameters that require grad. Throws ConfigError for a
  // non-positive bucket cap.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<comm::ProcessGroup> group,
                          DistributedDataParallelOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Call before each forward: broadcasts rank 0's buffers (BatchNorm statistics) when
  // broadcast_buffers is on. Collective when it broadcasts.
  void before_forward();

  // Convenience: before_forward(), then `module->forward(args...)`.
  template <typename ModuleHolder, typename... Args>
  auto forward(ModuleHolder& module, Args&&... args) {
    before_forward();
    return module->forward(std::forward<Args>(args)...);
  }

  // While a guard lives, backward passes only accumulate gradients locally (no
  // communication); the first synchronized backward after it reduces the accumulated sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() {
    return NoSyncGuard(*this);
  }

  // manual_reduction mode: all-reduce every gradient (bucketed, all launched before any is
  // waited for) and average. Parameters without a gradient get zeros. Collective.
  void reduce_gradients();

  // Sets every gradient to zero in place (one fill per bucket) and keeps them as bucket
  // views; cheaper than freeing them, and the next backward accumulates in place.
  void zero_grad();

  const std::shared_ptr<torch::nn::Module>& module() const;
  comm::ProcessGroup& process_group() const;
  const DistributedDataParallelOptions& options() const;

  int64_t num_buckets() const;
  // Bytes of the flat gradient buckets (the gradients themselves; for memory accounting).
  int64_t gradient_bucket_bytes() const;

 private:
  struct Reducer;
  std::unique_ptr<Reducer> reducer_;
};

// Broadcasts `tensors` from `root` (a collective), coalesced into one flat tensor per dtype
// so there is one collective per dtype rather than one per tensor.
void broadcast_coalesced(comm::ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                         int root = 0);

} // namespace largo::parallel
