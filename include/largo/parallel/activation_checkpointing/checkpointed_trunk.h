// Activation checkpointing for Largo's trunk-of-blocks models, the way VISSL's
// MODEL.ACTIVATION_CHECKPOINTING switches it on: the trunk's blocks are cut into
// NUM_ACTIVATION_CHECKPOINTING_SPLITS contiguous segments and every segment but the last is
// checkpointed (parallel/activation_checkpointing/activation_checkpoint.h); the head runs normally. The trunk case of
// sequential_checkpoint_plan.h (where to cut, what it saves) and checkpointed_segments.h
// (installing the cut in the model).
//
// Each segment runs the blocks' normal forward path; the segment's parameters and buffers
// are collected from its blocks at every forward. No collectives (the probes run only local
// forward/backward passes).
#pragma once

#include <largo/models/trunk_head_model.h>
#include <largo/parallel/activation_checkpointing/checkpointed_segments.h>
#include <largo/parallel/activation_checkpointing/sequential_checkpoint_plan.h>

#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace largo::parallel {


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
  // Installs the segments in the model itself (checkpointed_segments.h), so that its own
  // forward checkpoints them; composes with FullyShardedDataParallel when installed after it.
  // The segments are removed again when the returned object is destroyed.
  std::unique_ptr<CheckpointedSegments> install() const;

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

// Measures ActivationMemoryReport for `batch_size` samples of `sample_shape` ([C, H, W]) with
// MemoryTracker: probe steps (zeros in, loss = the sum of the outputs, gradients allocated
// beforehand) run with and without checkpointing at batch 2 and 4, and the peaks are
// extended linearly to batch_size (activations grow linearly with the batch); with
// batch_size <= 4 it measures batch_size itself. Leaves the model and the RNG state as they
// were. nullopt where the device cannot be measured.
std::optional<ActivationMemoryReport> measure_activation_memory(
    CheckpointedTrunk& trunk, const std::vector<int64_t>& sample_shape, int64_t batch_size);

} // namespace largo::parallel
