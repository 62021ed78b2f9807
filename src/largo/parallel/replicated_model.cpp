// Local (one process) and DDP: every rank holds the whole model and optimizer state.
#include "parallel_modes.h"

#include <fmt/format.h>

namespace largo::parallel {
namespace {

class ReplicatedModel : public ParallelModel {
 public:
  ReplicatedModel(torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
                  ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
                  std::vector<optim::ParamGroup> param_groups,
                  const OptimizerFactory& make_optimizer)
      : ParallelModel(std::move(model), std::move(mesh), std::move(options),
                      std::move(precision)) {
    optimizer_ = make_optimizer(std::move(param_groups));
    for (const auto& param_group : optimizer_->param_groups()) {
      trained_parameters_.insert(trained_parameters_.end(), param_group.params.begin(),
                                 param_group.params.end());
    }
    if (replicas_->world_size() > 1) { // broadcasts rank 0's weights
      ddp_ = std::make_unique<DistributedDataParallel>(module_, replicas_, options_.ddp);
    }
  }

 protected:
  void before_forward() override {
    if (ddp_) {
      ddp_->before_forward();
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
  std::string describe_mode() const override {
    if (!ddp_) {
      return "one process";
    }
    return fmt::format("DDP over {} ranks ({}), {} gradient buckets", replicas_->world_size(),
                       replicas_->backend(), ddp_->num_buckets());
  }

 private:
  std::unique_ptr<DistributedDataParallel> ddp_;
};

} // namespace

std::unique_ptr<ParallelModel> make_replicated_model(
    torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups, const OptimizerFactory& make_optimizer) {
  return std::make_unique<ReplicatedModel>(std::move(model), std::move(mesh), std::move(options),
                                           std::move(precision), std::move(param_groups),
                                           make_optimizer);
}

} // namespace largo::parallel
