// Data parallelism over the mesh's "dp" group, its ZeRO stage a parameter (0-2; stage 3 is
// FSDP, fsdp_model.cpp): every rank holds the whole model, and
//   stage 0 (DDP): a whole optimizer on every rank, gradients all-reduced;
//   stage 1: the optimizer state sharded, full gradients all-reduced, each rank reads its part;
//   stage 2: the gradients reduced to their owner's shard as well.
// One process is stage 0 without a reducer (or a sharded optimizer of one shard).
#include "parallel_modes.h"

#include <largo/parallel/sharded_optimizer.h>

#include <fmt/format.h>

namespace largo::parallel {
namespace {

class DataParallelModel : public ParallelModel {
 public:
  DataParallelModel(torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
                    ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
                    std::vector<optim::ParamGroup> param_groups,
                    const OptimizerFactory& make_optimizer)
      : ParallelModel(std::move(model), std::move(mesh), std::move(options),
                      std::move(precision)),
        stage_(zero_stage(options_.data_parallelism)) {
    if (stage_ == 0) {
      set_optimizer(make_optimizer(std::move(param_groups)));
    } else {
      // The sharded optimizer moves the parameters into flat buffers first: stage 2's reducer
      // reduces into its gradient shards, DDP's buckets view the flattened parameters' grads.
      ShardedOptimizerOptions zero_options;
      zero_options.make_base_optimizer = make_optimizer;
      auto sharded =
          std::make_unique<ShardedOptimizer>(std::move(param_groups), replicas_, zero_options);
      sharded_ = sharded.get();
      set_optimizer(std::move(sharded));
    }
    if (replicas_->world_size() == 1) {
      return;
    }
    if (stage_ == 2) {
      sdp_ = std::make_unique<ShardedDataParallel>(module_, *sharded_, replicas_, options_.zero);
    } else { // broadcasts rank 0's weights
      ddp_ = std::make_unique<DistributedDataParallel>(module_, replicas_, options_.ddp);
    }
  }

  std::optional<OptimizerShard> optimizer_shard() override {
    if (sharded_ == nullptr) {
      return std::nullopt;
    }
    return OptimizerShard{&sharded_->base(), sharded_->piece_ownership(), "zero"};
  }

 protected:
  void before_forward() override {
    if (ddp_) {
      ddp_->before_forward();
    } else if (sdp_) {
      sdp_->before_forward();
    }
  }
  std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync() override {
    return ddp_ ? std::make_unique<DistributedDataParallel::NoSyncGuard>(*ddp_) : nullptr;
  }
  void reduce_gradients() override {
    if (ddp_ && options_.ddp.manual_reduction) {
      ddp_->reduce_gradients();
    }
  }
  // ZeRO: each rank unscales, checks and clips only the gradients its shard steps with.
  std::vector<at::Tensor> gradient_holders() const override {
    return sharded_ != nullptr ? sharded_->shard_parameters() : trained_parameters_;
  }
  double clip_gradients(double max_norm, double norm_type) override {
    return sharded_ != nullptr ? sharded_->clip_grad_norm(max_norm, norm_type)
                               : ParallelModel::clip_gradients(max_norm, norm_type);
  }
  std::string describe_mode() const override {
    if (stage_ == 0) {
      return ddp_ ? fmt::format("DDP over {} ranks ({}), {} gradient buckets",
                                replicas_->world_size(), replicas_->backend(), ddp_->num_buckets())
                  : "one process";
    }
    std::string text = fmt::format("ZeRO stage {}: optimizer state{} sharded over {} rank(s)",
                                   stage_, stage_ == 2 ? " and gradients" : "",
                                   replicas_->world_size());
    if (sdp_ || ddp_) {
      text += fmt::format(" ({}), {} gradient buckets", replicas_->backend(),
                          sdp_ ? sdp_->num_buckets() : ddp_->num_buckets());
    }
    return text;
  }
  void measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const override {
    if (sharded_ != nullptr) {
      report.zero_stage = sdp_ ? 2 : 1; // one rank: no gradient shards, stage 1's layout
    }
    ParallelModel::measure(report, spec);
  }

 private:
  int stage_ = 0;
  ShardedOptimizer* sharded_ = nullptr; // optimizer_, at stages 1 and 2
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<ShardedDataParallel> sdp_;
};

} // namespace

std::unique_ptr<ParallelModel> make_data_parallel_model(
    torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups, const OptimizerFactory& make_optimizer) {
  return std::make_unique<DataParallelModel>(std::move(model), std::move(mesh), std::move(options),
                                             std::move(precision), std::move(param_groups),
                                             make_optimizer);
}

} // namespace largo::parallel
