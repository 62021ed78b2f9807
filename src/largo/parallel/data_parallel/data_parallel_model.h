// Data parallelism over the mesh's "dp" group, its ZeRO stage a parameter (0-3):
//   stage 0 (DDP): every rank holds the whole model and a whole optimizer, gradients
//     all-reduced;
//   stage 1: the optimizer state sharded, full gradients all-reduced, each rank reads its part;
//   stage 2: the gradients reduced to their owner's shard as well;
//   stage 3 (FSDP, fully_sharded_data_parallel.h): the parameters too, flattened unit by unit
//     and sharded, each unit gathered for its forward and its backward. The module then holds
//     gathered compute copies, so the whole-state calls (the state dicts, full_parameters, a
//     parameter's update) go through FSDP's gathers and scatters.
// One process is stage 0 without a reducer (or a sharded optimizer of one shard, or FSDP of
// one shard). With tensor parallelism (torchtitan's 2-D parallelism) the module holds this
// rank's slices of the split layers and the replicas are the ranks holding the same slices:
// they average (and shard) like with like, and what must see the unsharded model (the
// gradient norm, LARC's and LAMB's per-parameter norms, the state) is completed over the
// "tp" dimension (tensor_parallel_dimension.h) after this strategy's own gathers. ZeRO's and
// FSDP's optimizer state is then consolidated over the replicas (as FairScale's OSS does on
// one rank) before its slices are gathered, so that a checkpoint holds no per-rank shard
// files. Private to the parallel layer.
#pragma once

#include "../parallel_modes.h"
#include "../tensor_parallel/tensor_parallel_dimension.h"

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

  // Stage 3: the optimizer's pieces (named like their parameters), then what is whole on
  // every rank.
  torch::OrderedDict<std::string, at::Tensor> local_state() const override;
  bool forward_communicates_without_grad() const override {
    return fsdp_ != nullptr; // FSDP's units are gathered for evaluation too
  }

 protected:
  at::Tensor run_forward(const at::Tensor& input) override;
  std::optional<OptimizerShard> optimizer_pieces() override;
  void before_forward() override;
  std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync() override;
  void reduce_gradients() override;
  void drop_piece_gradients(const std::set<std::string>& names) override;
  std::vector<at::Tensor> gradient_holders() const override;
  double clip_gradients(double max_norm, double norm_type) override;
  std::string describe_mode() const override;
  // Stages 1 and 2: the optimizer state flat-sharded over "dp", the values replicated; stage
  // 3: both flat-sharded (the module holds gathered compute copies).
  void place(StatePlacements& placements) const override;
  void measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const override;
  // Stage 3: the module's (this rank's slices with tensor parallelism); its optimizer holds
  // 1-D pieces.
  std::map<std::string, std::vector<int64_t>> local_parameter_shapes() const override;
  // Stage 3, where the module holds compute copies gathered for a forward only: the values
  // come from (and go to) FSDP's flat shards, gathered unit by unit (held_values on `root`,
  // held_parameters on every rank); the optimizer state is its pieces', consolidated (or
  // loaded) over the module's parameters by name. The other stages: the module's.
  NamedTensors held_values(int root) override;
  NamedTensors held_parameters() override;
  void store_values(const Values& values) override;
  void
  update_held(const std::string& name, const std::function<void(at::Tensor&)>& update) override;
  // Stages 1-2 (when not written as pieces): the whole state cut into this rank's pieces.
  void load_held_optimizer_state(const c10::IValue& state) override;
  std::vector<optim::ParamGroup> held_parameter_groups() const override;

 private:
  // Stages 1-3: this rank's pieces of the optimizer state's parameters, by name.
  TensorParallelDimension::NamedTensors named_pieces() const;
  std::string describe_fully_sharded() const;
  void measure_fully_sharded(ModelStateReport& report, const optim::OptimizerSpec* spec) const;

  int stage_ = 0;
  ShardedOptimizer* sharded_ = nullptr;            // optimizer_, at stages 1 and 2
  std::unique_ptr<DistributedDataParallel> ddp_;   // stages 0 and 1, over more than one rank
  std::unique_ptr<ShardedDataParallel> sdp_;       // stage 2, over more than one rank
  std::unique_ptr<FullyShardedDataParallel> fsdp_; // stage 3
};

} // namespace largo::parallel
