// Where to cut a torch::nn::Sequential into activation-checkpointed segments, and what that
// saves: the measuring half of MODEL.ACTIVATION_CHECKPOINTING (checkpointed_segments.h
// installs the cut).
//
// The default cut balances the *measured activation bytes* of the segments (a training
// forward on a small probe batch of zeros, element by element, counting the bytes each
// element leaves held for the backward). That is the quantity checkpointing saves, and a
// checkpointed backward holds one segment's activations at a time, so the peak is set by the
// largest segment. Parameter counts are a poor proxy: a ResNet's early blocks hold most of
// the activations and few of the parameters, its late blocks the reverse.
//
// The Sequential may sit anywhere in the module: its input is captured on the way through
// the module's own forward. The probes leave the module (parameters, gradients, buffers,
// train/eval mode) and the RNG state as they were, and must run before any gradient hook
// (DDP, FSDP) is installed. No collectives.
#pragma once

#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>

#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace largo::parallel {

// What balances the segments.
enum class SegmentCost {
  kActivationBytes, // measured bytes each element holds for the backward (the default)
  kBlockCount,      // equal numbers of elements, as torch.utils.checkpoint.checkpoint_sequential
};

struct SequentialCheckpointPlan {
  std::vector<int64_t> boundaries;    // {0, b_1, ..., size}; segment s is [b_s, b_{s+1})
  std::vector<int64_t> element_bytes; // per element, when measured
  std::string cut_by;                 // how the cut was chosen, for logs
  // "trunk[0, 4) trunk[4, 9) trunk[9, 18); the first 2 of 3 segments checkpointed; cut to ..."
  std::string describe(const std::string& container_name) const;
};

// Bytes of tensor storage each element of `container` leaves held (for the backward, plus
// its output) in a training-mode forward of `model` on `probe_input` ([batch, ...] on the
// model's device). nullopt when the device cannot be measured (MemoryTracker::supported).
std::optional<std::vector<int64_t>> measure_sequential_activation_bytes(
    torch::nn::AnyModule model, torch::nn::SequentialImpl& container,
    const at::Tensor& probe_input);

// Cuts `container` (named `container_name` in messages) into `num_splits` segments. With
// kActivationBytes and a probe input shape ([C, H, W] for the model's input), the cut
// balances the measured bytes on a probe batch of `probe_batch_size` zeros, falling back to
// equal counts (with a warning) where memory cannot be measured. Throws OptionError unless
// 1 <= num_splits <= the container's size.
SequentialCheckpointPlan plan_sequential_checkpointing(
    torch::nn::AnyModule model, torch::nn::SequentialImpl& container,
    const std::string& container_name, int64_t num_splits, SegmentCost cost,
    const std::vector<int64_t>& probe_input_shape, int64_t probe_batch_size = 2);

// Peak activation memory of one training step, with and without checkpointing: the peak of
// the bytes allocated during the step (forward, a scalar loss, backward) above those live
// before it, with the parameter gradients already allocated — what autograd holds for the
// backward plus the step's temporaries. (A step that frees its gradients beforehand, as
// zero_grad(set_to_none) does, also allocates `gradient_bytes` during its backward.)
struct ActivationMemoryReport {
  int64_t batch_size = 0;
  int64_t peak_bytes_without = 0;
  int64_t peak_bytes_with = 0;
  int64_t gradient_bytes = 0; // the parameter gradients' bytes
  std::string how;            // how the figures were obtained, for the log
  double saved_fraction() const {
    return peak_bytes_without > 0 ? 1.0 - static_cast<double>(peak_bytes_with) /
                                              static_cast<double>(peak_bytes_without)
                                  : 0.0;
  }
  // "peak activation memory of a training step at batch 128: 1.20 GiB without
  // checkpointing, 512.0 MiB with it (58 % saved; projected linearly from ...); ..."
  std::string describe() const;
};

// Measures ActivationMemoryReport for `batch_size` samples of `sample_shape` with the
// segments `boundaries` of `container` checkpointed: probe steps (zeros in, loss = the sum
// of the outputs, gradients allocated beforehand) with and without, at batch 2 and 4, the
// peaks extended linearly to batch_size (activations grow linearly with the batch); with
// batch_size <= 4 it measures batch_size itself. nullopt where the device cannot be measured.
std::optional<ActivationMemoryReport> measure_activation_memory(
    torch::nn::AnyModule model, torch::nn::Sequential container,
    const std::vector<int64_t>& boundaries, const std::vector<int64_t>& sample_shape,
    int64_t batch_size, bool preserve_rng_state = true);

} // namespace largo::parallel
