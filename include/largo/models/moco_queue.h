// MoCo's queue of negatives (VISSL's MoCoLoss buffers "queue" [d, K] and "queue_ptr"): the
// normalised keys of the last K images of the global batch, a column each. It starts as
// VISSL's: standard normal values, each column L2-normalised. Each step's keys are gathered
// from every rank of the data-parallel group (VISSL's concat_all_gather, rank order) and
// written over the oldest columns at the pointer, which then moves on round robin; so every
// rank that started from the same queue holds the same one.
//
// Collective: enqueue all-gathers over `group` (every rank calls it once per loss call, with
// keys of the same shape). state_dict / load_state_dict are local.
#pragma once

#include <largo/comm/process_group.h>

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <map>
#include <string>

namespace largo::models {

struct MocoQueueOptions {
  int64_t embedding_dim = 128; // the keys' width d
  int64_t size = 65536;        // K, the keys kept: a multiple of every enqueue's global batch
};

class MocoQueue {
 public:
  // Draws the initial queue from `generator` (torch.randn(d, K) then F.normalize(dim=0), in
  // VISSL's order) and keeps it on `device`. Throws OptionError for options out of range.
  MocoQueue(MocoQueueOptions options, at::Generator generator, c10::Device device = c10::kCPU);

  // [d, K]: the negatives moco_loss takes.
  const at::Tensor& keys() const {
    return queue_;
  }
  int64_t pointer() const {
    return pointer_;
  }
  // `key` [n, d] (this rank's normalised keys) gathered over `group` into [world * n, d] and
  // written at the pointer. Throws OptionError when K is not a multiple of world * n (VISSL's
  // assertion: a batch never wraps around the end).
  void enqueue(const at::Tensor& key, comm::ProcessGroup& group);

  // VISSL's names: "queue" [d, K] and "queue_ptr" [1] (int64), on the CPU.
  std::map<std::string, at::Tensor> state_dict() const;
  // Throws CheckpointError when a tensor is missing or its shape differs.
  void load_state_dict(const std::map<std::string, at::Tensor>& state);

 private:
  MocoQueueOptions options_;
  at::Tensor queue_; // [d, K]
  int64_t pointer_ = 0;
};

} // namespace largo::models
