// ZeRO-1 and ZeRO-2: the optimizer state (and with stage 2 the gradients) sharded over the
// ranks, the parameters whole on every rank.
#include "parallel_modes.h"

#include <largo/parallel/sharded_optimizer.h>

#include <fmt/format.h>

namespace largo::parallel {
namespace {

class ZeroModel : public ParallelModel {
 public:
  ZeroModel(torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
            ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
            std::vector<optim::ParamGroup> param_groups, const OptimizerFactory& make_optimizer)
      : ParallelModel(std::move(model), std::move(mesh), std::move(options),
                      std::move(precision)) {
    // The sharded optimizer moves the parameters into flat buffers first: stage 2's reducer
    // reduces into its gradient shards, DDP's buckets view the flattened parameters' grads.
    ShardedOptimizerOptions zero_options;
    zero_options.make_base_optimizer = make_optimizer;
    auto sharded =
        std::make_unique<ShardedOptimizer>(std::move(param_groups), replicas_, zero_options);
    sharded_ = sharded.get();
    optimizer_ = std::move(sharded);
    for (const auto& param_group : optimizer_->param_groups()) {
      trained_parameters_.insert(trained_parameters_.end(), param_group.params.begin(),
                                 param_group.params.end());
    }
    if (replicas_->world_size() == 1) {
      return;
    }
    if (options_.data_parallelism == DataParallelism::kZero2) {
      sdp_ = std::make_unique<ShardedDataParallel>(module_, *sharded_, replicas_, options_.zero);
    } else { // stage 1: full gradients all-reduced, each rank reads its part
      ddp_ = std::make_unique<DistributedDataParallel>(module_, replicas_, options_.ddp);
    }
  }

  std::optional<OptimizerShard> optimizer_shard() override {
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
  // Each rank unscales, checks and clips only the gradients its shard steps with.
  std::vector<at::Tensor> gradient_holders() const override {
    return sharded_->shard_parameters();
  }
  double clip_gradients(double max_norm, double norm_type) override {
    return sharded_->clip_grad_norm(max_norm, norm_type);
  }
  std::string describe_mode() const override {
    const int stage = sdp_ || options_.data_parallelism == DataParallelism::kZero2 ? 2 : 1;
    std::string text = fmt::format("ZeRO stage {}: optimizer state{} sharded over {} rank(s)",
                                   stage, stage == 2 ? " and gradients" : "",
                                   replicas_->world_size());
    if (sdp_ || ddp_) {
      text += fmt::format(" ({}), {} gradient buckets", replicas_->backend(),
                          sdp_ ? sdp_->num_buckets() : ddp_->num_buckets());
    }
    return text;
  }
  void measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const override {
    report.zero_stage = sdp_ ? 2 : 1; // one rank: no gradient shards, stage 1's layout
    ParallelModel::measure(report, spec);
  }

 private:
  ShardedOptimizer* sharded_ = nullptr; // optimizer_
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<ShardedDataParallel> sdp_;
};

} // namespace

std::unique_ptr<ParallelModel> make_zero_model(
    torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups, const OptimizerFactory& make_optimizer) {
  return std::make_unique<ZeroModel>(std::move(model), std::move(mesh), std::move(options),
                                     std::move(precision), std::move(param_groups),
                                     make_optimizer);
}

} // namespace largo::parallel
