// ZeRO stage 2 (FairScale's ShardedDataParallel, VISSL's MODEL.SHARDED_DDP_SETUP.USE_SDP):
// data parallelism in which each gradient is reduced only to the rank that owns it in the
// ShardedOptimizer's flat layout, and nobody keeps a full gradient.
//
// As backward produces gradients, they are gathered into buckets (about
// reduce_buffer_bytes, consecutive parameters of the flat layout in backward order); a full
// bucket is divided by the world size and reduced to the owner(s) of its range (one reduce
// per owner; a bucket straddles at most a shard boundary or two), and the parameters'
// .grad tensors are freed. At most two buckets are in flight: before a third is launched,
// the oldest is waited for and its owned part added into this rank's gradient shard, so
// gradient memory stays at the shard plus two buckets. Every backward reduces, so gradient
// accumulation needs no full-size buffer: micro-steps add into the shards, which the
// optimizer's zero_grad() clears.
//
// Collectives: the constructor (a broadcast of rank 0's parameters and buffers),
// before_forward() with broadcast_buffers, and each backward (reduces). Every rank must make
// the same calls in the same order.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>

#include <torch/nn/module.h>

#include <memory>

namespace largo::parallel {

struct ShardedDataParallelOptions {
  // MODEL.SHARDED_DDP_SETUP.reduce_buffer_size is in elements (FairScale's unit); -1 there
  // means FairScale's default, 2^23 elements.
  int64_t reduce_buffer_bytes = (int64_t{1} << 23) * 4;
  bool broadcast_buffers = true;       // DISTRIBUTED.BROADCAST_BUFFERS
  bool find_unused_parameters = false; // DISTRIBUTED.FIND_UNUSED_PARAMETERS
};

class ShardedDataParallel {
 public:
  // `optimizer` must hold `module`'s trainable parameters; it is switched to gradient
  // shards. Broadcasts rank 0's parameters and buffers (a collective).
  ShardedDataParallel(std::shared_ptr<torch::nn::Module> module, ShardedOptimizer& optimizer,
                      std::shared_ptr<comm::ProcessGroup> group,
                      ShardedDataParallelOptions options = {});
  ~ShardedDataParallel();
  ShardedDataParallel(const ShardedDataParallel&) = delete;
  ShardedDataParallel& operator=(const ShardedDataParallel&) = delete;

  // Broadcasts rank 0's buffers when broadcast_buffers is on (a collective).
  void before_forward();

  template <typename ModuleHolder, typename... Args>
  auto forward(ModuleHolder& module, Args&&... args) {
    before_forward();
    return module->forward(std::forward<Args>(args)...);
  }

  int64_t num_buckets() const;

 private:
  struct Reducer;
  std::unique_ptr<Reducer> reducer_;
};

} // namespace largo::parallel
