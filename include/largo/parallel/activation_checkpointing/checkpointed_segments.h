// Activation checkpointing applied to a module in place (PyTorch's
// apply_activation_checkpointing / checkpoint_wrapper, torchtitan's per-block checkpointing):
// chosen elements of torch::nn::Sequential containers, or consecutive runs of them, become
// checkpointed segments (activation_checkpoint.h), so the module's own forward no longer
// keeps their activations and recomputes them in the backward.
//
// The elements are intercepted where their Sequential calls them (sequential_interception.h):
// parameter names, state dicts and the module's type stay as they were. A segment runs what
// each element ran before it was installed, so applied after FullyShardedDataParallel wraps
// the same elements, the recompute gathers each unit again. Its parameters and BatchNorm
// buffers are collected from the elements at every forward. Destroying the object puts the
// elements' previous forwards back. No collectives.
#pragma once

#include <largo/parallel/wrap_policy.h>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace largo::parallel {

class CheckpointedSegments {
 public:
  // Every Sequential element of `root` that `policy` selects runs as a segment of its own.
  static std::unique_ptr<CheckpointedSegments> wrap_modules(
      const std::shared_ptr<torch::nn::Module>& root, const WrapPolicy& policy,
      bool preserve_rng_state = true);

  // The elements of `container` (registered as `container_name`, for describe()) cut at
  // `boundaries` ({0, b_1, ..., container->size()}): every segment but the last is
  // checkpointed, as torch.utils.checkpoint.checkpoint_sequential does. Throws largo::Error for
  // boundaries that do not cut it into non-empty segments.
  static std::unique_ptr<CheckpointedSegments> split_sequential(
      torch::nn::Sequential container, const std::string& container_name,
      std::vector<int64_t> boundaries, bool preserve_rng_state = true);

  ~CheckpointedSegments();
  CheckpointedSegments(const CheckpointedSegments&) = delete;
  CheckpointedSegments& operator=(const CheckpointedSegments&) = delete;

  int64_t num_segments() const {
    return static_cast<int64_t>(segments_.size());
  }
  // "trunk.[0, 4) trunk.[4, 9)" or "blocks.0, blocks.1, ...": what runs checkpointed.
  std::string describe() const;

 private:
  struct Segment {
    torch::nn::Sequential container{nullptr};
    std::string label; // "trunk.3" or "trunk[0, 4)"
    size_t begin = 0;  // elements [begin, end) of the container
    size_t end = 0;
  };
  CheckpointedSegments() = default;
  void install(Segment segment, bool preserve_rng_state);

  std::vector<Segment> segments_;
  // What each intercepted element ran before, to put back: (container, index, forward).
  struct Replaced {
    torch::nn::Sequential container{nullptr};
    size_t index = 0;
    torch::nn::AnyModule forward;
  };
  std::vector<Replaced> replaced_;
};

} // namespace largo::parallel
