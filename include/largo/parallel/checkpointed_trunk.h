// Activation checkpointing for Largo's trunk-of-blocks models, the way VISSL's
// MODEL.ACTIVATION_CHECKPOINTING switches it on: the trunk's blocks are cut into
// NUM_ACTIVATION_CHECKPOINTING_SPLITS contiguous segments and every segment but the last is
// checkpointed (parallel/activation_checkpoint.h); the head runs normally.
//
// Where to cut: by default at the boundaries that balance the *measured activation bytes*
// of the segments (a training forward on a small probe batch, block by block, counting the
// bytes each block leaves held for the backward). That is the quantity checkpointing saves,
// and a checkpointed backward holds one segment's activations at a time, so the peak is set
// by the largest segment. Parameter counts are a poor proxy: a ResNet's early blocks hold
// most of the activations and few of the parameters, its late blocks the reverse.
//
// Each segment runs model->forward_trunk_range(x, begin, end): the blocks' normal forward
// path, so units wrapped for ZeRO-3/FSDP gather their parameters again in the recompute;
// the segment's parameters and buffers are collected from its blocks at every forward.
// No collectives (the probes run only local forward/backward passes).
#pragma once

#include <largo/models/trunk_head_model.h>

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace largo::parallel {

// Runs trunk blocks [begin, end) on x: by default the model's forward_trunk_range;
// FullyShardedDataParallel's gathers each unit first.
using TrunkBlockRunner = std::function<at::Tensor(const at::Tensor& x, int64_t begin, int64_t end)>;

// What balances the segments.
enum class SegmentCost {
  kActivationBytes, // measured bytes each block holds for the backward (the default)
  kBlockCount,      // equal numbers of blocks, as torch.utils.checkpoint.checkpoint_sequential
};

struct TrunkCheckpointingOptions {
  // MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS: the number of
  // segments (>= 1, at most the number of trunk blocks); segments 1 .. n-1 are checkpointed,
  // so 1 checkpoints nothing.
  explicit TrunkCheckpointingOptions(int64_t num_splits) : num_splits_(num_splits) {}
  TORCH_ARG(int64_t, num_splits);
  TORCH_ARG(SegmentCost, cost) = SegmentCost::kActivationBytes;
  // Batch size of the probe forward that measures activation bytes (activations grow
  // linearly with the batch, so a small one gives the same proportions).
  TORCH_ARG(int64_t, probe_batch_size) = 2;
  TORCH_ARG(bool, preserve_rng_state) = true;
};

// Bytes of tensor storage each trunk block leaves held (for the backward, plus its output)
// in a training-mode forward of `probe_input` ([batch, C, H, W] on the model's device).
// nullopt when the model's device cannot be measured (MemoryTracker::supported). Leaves the
// model (parameters, gradients, BatchNorm statistics, train/eval mode) and the RNG state as
// they were.
std::optional<std::vector<int64_t>>
measure_trunk_block_activation_bytes(models::TrunkHeadModel& model, const at::Tensor& probe_input);

class CheckpointedTrunk {
 public:
  // Cuts the trunk at `boundaries` ({0, b_1, ..., num_trunk_blocks}, see
  // activation_checkpoint.h). Throws largo::Error for boundaries that do not fit the trunk.
  CheckpointedTrunk(
      models::TrunkHeadModel model,
      std::vector<int64_t> boundaries,
      bool preserve_rng_state = true);

  // Validates options (ConfigError naming NUM_ACTIVATION_CHECKPOINTING_SPLITS) and picks the
  // boundaries; for kActivationBytes it measures the blocks on a probe batch of zeros with
  // `sample_shape` ([C, H, W]), falling back to kBlockCount (with a warning) where the
  // device's memory cannot be measured.
  static CheckpointedTrunk plan(
      models::TrunkHeadModel model,
      const TrunkCheckpointingOptions& options,
      const std::vector<int64_t>& sample_shape);

  // The model's forward with the trunk's segments checkpointed: the same values (and, on
  // the CPU, bit for bit the same gradients) as model->forward(images).
  at::Tensor forward(at::Tensor images);
  // The trunk alone (images -> features), with every segment's blocks run by `run_blocks`,
  // in the forward and in the recompute (FSDP: its forward_blocks, so that the recompute
  // gathers each unit again).
  at::Tensor forward_trunk(at::Tensor images, const TrunkBlockRunner& run_blocks);

  models::TrunkHeadModel& model() {
    return model_;
  }
  const std::vector<int64_t>& boundaries() const {
    return boundaries_;
  }
  int64_t num_checkpointed_segments() const {
    return static_cast<int64_t>(boundaries_.size()) - 2;
  }
  // The per-block activation bytes plan() measured (empty otherwise).
  const std::vector<int64_t>& block_activation_bytes() const {
    return block_activation_bytes_;
  }
  // "trunk blocks [0, 4) [4, 9) [9, 18); the first 2 of 3 segments checkpointed; cut to ..."
  std::string describe() const;

 private:
  models::TrunkHeadModel model_;
  std::vector<int64_t> boundaries_;
  bool preserve_rng_state_;
  std::vector<int64_t> block_activation_bytes_;
  std::string cut_by_ = "cut at the given boundaries";
};

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

// Measures ActivationMemoryReport for `batch_size` samples of `sample_shape` ([C, H, W]) with
// MemoryTracker: probe steps (zeros in, loss = the sum of the outputs, gradients allocated
// beforehand) run with and without checkpointing at batch 2 and 4, and the peaks are
// extended linearly to batch_size (activations grow linearly with the batch); with
// batch_size <= 4 it measures batch_size itself. Leaves the model and the RNG state as they
// were. nullopt where the device cannot be measured.
std::optional<ActivationMemoryReport> measure_activation_memory(
    CheckpointedTrunk& trunk, const std::vector<int64_t>& sample_shape, int64_t batch_size);

} // namespace largo::parallel
