// Data parallelism over the mesh's "dp" group, its ZeRO stage a parameter (0-2; stage 3 is
// FSDP, fsdp_model.cpp): every rank holds the whole model, and
//   stage 0 (DDP): a whole optimizer on every rank, gradients all-reduced;
//   stage 1: the optimizer state sharded, full gradients all-reduced, each rank reads its part;
//   stage 2: the gradients reduced to their owner's shard as well.
// One process is stage 0 without a reducer (or a sharded optimizer of one shard).
// Private to the parallel layer: tensor_parallel_model.cpp composes tensor parallelism over it.
#pragma once

#include "../parallel_modes.h"

#include <largo/parallel/data_parallel/sharded_optimizer.h>

namespace largo::parallel {

class DataParallelModel : public ParallelModel {
 public:
  // `complete_norms`, when given, completes the optimizer's per-parameter norms (LARC's,
  // LAMB's) beyond this rank's tensors (tensor parallelism's shards).
  DataParallelModel(torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
                    ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
                    std::vector<optim::ParamGroup> param_groups,
                    const OptimizerFactory& make_optimizer,
                    const ParameterNormCompletion& complete_norms = {});

  std::optional<OptimizerShard> optimizer_shard() override;

 protected:
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
