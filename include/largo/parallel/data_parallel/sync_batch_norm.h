// Synchronized BatchNorm (torch.nn.SyncBatchNorm, VISSL's MODEL.SYNC_BN_CONFIG): in training
// mode the batch statistics are those of the batches of all ranks of a group together, so N
// ranks with batch B normalize like one process with batch N * B.
//
// How (as torch.nn.SyncBatchNorm does it):
// - forward: each rank computes, per channel, the sum and the sum of squares of its values
//   and its count (in float64, from a local mean and variance so nothing cancels); these
//   2C+1 numbers are all-reduced over the group; mean = sum / n and the biased variance
//   normalize the input; the running statistics are updated with the unbiased variance
//   var * n / (n - 1), so they are identical on every rank of the group.
// - backward: the per-channel sums of dy and of dy * (x - mean) are all-reduced, which
//   carries every rank's share of the loss into each rank's input gradient. The weight and
//   bias gradients stay local: DistributedDataParallel averages them like any other, which
//   makes them those of one process on the global batch (with a loss averaged per rank).
// - evaluation mode uses the running statistics: no collective. With group_size 1 (or one
//   process) every rank runs torch's batch_norm.
//
// Groups: group_size 0 (or >= the world size) synchronizes all ranks of the process group;
// N > 0 synchronizes groups of N consecutive ranks ({0..N-1}, {N..2N-1}, ...; the last
// group may be smaller), as VISSL's GROUP_SIZE. The process group has no sub-groups, so a
// group's sums are exchanged through one all-reduce over the whole process group, of a
// [num_groups, 2C+1] buffer in which each rank fills only its group's row.
//
// The module has BatchNorm2d's parameters, buffers and names (weight, bias, running_mean,
// running_var, num_batches_tracked) and derives from torch::nn::BatchNorm2dImpl, so code that
// recognizes BatchNorm (keep_batchnorm_fp32, FSDP's float32 units, the optimizer's
// regularize_bn groups, LARC's exclusions) treats it as one. It accepts inputs of 2 or more
// dimensions ([b, c, ...]) in any floating dtype; reduced-precision inputs (autocast) are
// normalized in float32 and returned in their own dtype.
//
// Composition: build it (or convert_sync_batchnorm) before wrapping the model in
// DistributedDataParallel / ZeRO / FSDP and before building the optimizer (the converted
// layers are new modules, sharing the old ones' storage). Under activation checkpointing
// (parallel/activation_checkpointing/activation_checkpoint.h) the recompute issues the same all-reduce on the same
// values, so it reproduces the forward exactly; the checkpoint restores the running
// statistics after it (they are module buffers), so they are updated once per step.
//
// Collectives: every training-mode forward (one all-reduce) and every backward that needs
// the input's gradient (one all-reduce), on the whole process group whatever group_size is
// (none with group_size 1).
// Every rank must run the same SyncBatchNorm layers in the same order, forward and backward,
// in training mode on all ranks or on none.
#pragma once

#include <largo/comm/process_group.h>

#include <torch/nn/modules/batchnorm.h>

#include <cstdint>
#include <memory>
#include <ostream>

namespace largo::parallel {

class SyncBatchNormImpl : public torch::nn::BatchNorm2dImpl {
 public:
  // group_size: 0 = all ranks of `group`; N > 0 = groups of N consecutive ranks.
  // Throws ConfigError for a negative group_size (named MODEL.SYNC_BN_CONFIG.GROUP_SIZE).
  SyncBatchNormImpl(
      const torch::nn::BatchNormOptions& options,
      std::shared_ptr<comm::ProcessGroup> group,
      int64_t group_size = 0);

  at::Tensor forward(const at::Tensor& input);

  // The ranks this rank's statistics are shared with: [first, first + size).
  int64_t group_first_rank() const;
  int64_t group_num_ranks() const;

  void pretty_print(std::ostream& stream) const override;

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  int64_t group_size_;
};
TORCH_MODULE(SyncBatchNorm);

// Replaces every torch::nn::BatchNorm2d and BatchNorm1d in `module`'s tree (as
// torch.nn.SyncBatchNorm.convert_sync_batchnorm, which VISSL runs: a head's BatchNorm1d too)
// by a SyncBatchNorm with the same options, training mode, requires_grad flags and state (its
// tensors share the old ones' storage). Swapping works where Largo's models call their norms
// (models/module_swap.h); a BatchNorm held by a parent that cannot swap it is an error naming
// its path. Returns the root (a SyncBatchNorm when `module` is itself a BatchNorm). Other
// norms (GroupNorm, LayerNorm) are left as they are.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    const std::shared_ptr<torch::nn::Module>& module,
    std::shared_ptr<comm::ProcessGroup> group,
    int64_t group_size = 0);

// VISSL's MODEL.SYNC_BN_CONFIG.GROUP_SIZE as a group_size above: -1 = the ranks of one
// machine (num_proc_per_node), 0 = all ranks, N > 0 = N (at most the world size).
// Throws ConfigError naming the key for values below -1.
int64_t
sync_bn_group_size(int64_t config_group_size, int64_t num_proc_per_node, int64_t world_size);

} // namespace largo::parallel
