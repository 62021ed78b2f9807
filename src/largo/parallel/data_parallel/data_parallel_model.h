// Data parallelism over the mesh's "dp" group, its ZeRO stage a parameter (0-2; stage 3 is
// FSDP, fsdp_model.cpp): every rank holds the whole model, and
//   stage 0 (DDP): a whole optimizer on every rank, gradients all-reduced;
//   stage 1: the optimizer state sharded, full gradients all-reduced, each rank reads its part;
//   stage 2: the gradients reduced to their owner's shard as well.
// One process is stage 0 without a reducer (or a sharded optimizer of one shard).
// With tensor parallelism (torchtitan's 2-D parallelism) the module holds this rank's slices
// of the split layers and the replicas are the ranks holding the same slices: they average
// (and ZeRO partitions) like with like, and what must see the unsharded model (the gradient
// norm, LARC's and LAMB's per-parameter norms, the state) is completed over the "tp"
// dimension (tensor_parallel_dimension.h). ZeRO's optimizer state is then consolidated over
// the replicas (as FairScale's OSS does on one rank) before its slices are gathered, so that
// a checkpoint holds no per-rank shard files. Private to the parallel layer.
#pragma once

#include "../parallel_modes.h"

#include <largo/parallel/data_parallel/sharded_optimizer.h>

namespace largo::parallel {

class DataParallelModel : public ParallelModel {
 public:
  DataParallelModel(
      torch::nn::AnyModule model,
      std::shared_ptr<DeviceMesh> mesh,
      ParallelOptions options,
      std::unique_ptr<precision::MixedPrecision> precision,
      std::vector<optim::ParamGroup> param_groups,
      const OptimizerFactory& make_optimizer);

  // With tensor parallelism and ZeRO: the unsharded model's, on the first replica only (None
  // on the others). Collective there (replicas, then shards).
  c10::IValue optimizer_state_dict() override;
  void load_optimizer_state_dict(const c10::IValue& state) override;

 protected:
  std::optional<OptimizerShard> optimizer_pieces() override;
  void before_forward() override;
  std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync() override;
  void reduce_gradients() override;
  void drop_piece_gradients(const std::set<std::string>& names) override;
  std::vector<at::Tensor> gradient_holders() const override;
  double clip_gradients(double max_norm, double norm_type) override;
  std::string describe_mode() const override;
  // Stages 1 and 2: the optimizer state flat-sharded over "dp", the values replicated.
  void place(StatePlacements& placements) const override;
  void measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const override;

  int stage_ = 0;
  ShardedOptimizer* sharded_ = nullptr; // optimizer_, at stages 1 and 2
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<ShardedDataParallel> sdp_;
};

} // namespace largo::parallel
