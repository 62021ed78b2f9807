// FSDP (ZeRO-3): parameters, gradients and optimizer state sharded over the ranks.
#include "parallel_modes.h"

#include <largo/core/memory_tracker.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::parallel {
namespace {

class FsdpModel : public ParallelModel {
 public:
  FsdpModel(torch::nn::AnyModule model, std::shared_ptr<comm::ProcessGroup> group,
            ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
            std::vector<optim::ParamGroup> param_groups, const OptimizerFactory& make_optimizer)
      : ParallelModel(model, std::move(group), std::move(options), std::move(precision)) {
    fsdp_ = std::make_unique<FullyShardedDataParallel>(std::move(model), group_, options_.fsdp);
    optimizer_ = fsdp_->make_optimizer(param_groups, make_optimizer);
    for (const auto& param_group : optimizer_->param_groups()) { // this rank's pieces
      trained_parameters_.insert(trained_parameters_.end(), param_group.params.begin(),
                                 param_group.params.end());
    }
  }

  std::vector<std::pair<std::string, at::Tensor>> model_state_dict(int root) override {
    return fsdp_->full_state_on_rank(root);
  }
  void load_model_state_dict(const std::unordered_map<std::string, at::Tensor>& state) override {
    fsdp_->load_full_state(state); // each rank keeps its shard of the whole values
  }
  void update_full_parameter(
      const std::string& name, const std::function<void(at::Tensor&)>& update) override {
    fsdp_->update_full_parameter(name, update);
  }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    std::map<std::string, at::Tensor> gathered;
    for (auto& [name, value] : fsdp_->full_parameters()) {
      gathered.emplace(name, std::move(value));
    }
    std::vector<std::pair<std::string, at::Tensor>> values;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      auto found = gathered.find(item.key()); // frozen ones are kept whole
      values.emplace_back(item.key(), found != gathered.end() ? found->second
                                                              : item.value().detach().clone());
    }
    return values;
  }
  // The optimizer's pieces (named like their parameters), then what is whole on every rank.
  torch::OrderedDict<std::string, at::Tensor> local_state() const override {
    torch::OrderedDict<std::string, at::Tensor> tensors;
    for (const auto& group : optimizer_->param_groups()) {
      for (size_t i = 0; i < group.params.size(); ++i) {
        tensors.insert(group.names.at(i), group.params[i]);
      }
    }
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      if (!item.value().requires_grad()) {
        tensors.insert(item.key(), item.value());
      }
    }
    for (const auto& buffer : module_->named_buffers()) {
      tensors.insert(buffer.key(), buffer.value());
    }
    return tensors;
  }
  std::optional<OptimizerShard> optimizer_shard() override {
    return OptimizerShard{optimizer_.get(), fsdp_->piece_ownership(), "fsdp"};
  }
  // The optimizer's groups hold 1-D pieces; the module keeps the shapes.
  std::map<std::string, std::vector<int64_t>> trained_parameter_shapes() const override {
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      if (item.value().requires_grad()) {
        shapes[item.key()] = item.value().sizes().vec();
      }
    }
    return shapes;
  }
  bool forward_communicates_without_grad() const override {
    return true; // units are gathered for evaluation too
  }
  bool module_holds_compute_copies() const override {
    return true; // gathered from the float32 shards, in compute_dtype when one is set
  }
  bool local_state_is_sharded() const override {
    return true;
  }

 protected:
  at::Tensor run_forward(const at::Tensor& input) override {
    return fsdp_->forward(input);
  }
  double clip_gradients(double max_norm, double norm_type) override {
    return fsdp_->clip_grad_norm(max_norm, norm_type);
  }
  std::string describe_mode() const override;
  void measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const override;

 private:
  std::unique_ptr<FullyShardedDataParallel> fsdp_;
};

std::string FsdpModel::describe_mode() const {
  std::vector<std::string> units;
  for (const auto& unit : fsdp_->units()) {
    units.push_back(fmt::format("{} ({} parameters)", unit.name, unit.layout.total_numel()));
  }
  const auto& options = fsdp_->options();
  const std::string compute =
      options.compute_dtype
      ? fmt::format("{} compute copies of float32 shards (BatchNorm in float32), gradients "
                    "reduced in {}",
                    c10::toString(*options.compute_dtype),
                    options.fp32_reduce_scatter ? "float32" : c10::toString(*options.compute_dtype))
      : std::string("compute in the parameters' dtype");
  return fmt::format("ZeRO stage 3 (FSDP): parameters, gradients and optimizer state sharded "
                     "over {} rank(s) ({}), {:.2f} MiB of parameter shards per rank; units ({}): "
                     "{}; reshard_after_forward {}, prefetch {}; {}",
                     group_->world_size(), group_->backend(),
                     static_cast<double>(fsdp_->shard_bytes()) / (1024.0 * 1024.0),
                     options.wrap_policy.describe(), fmt::join(units, ", "),
                     options.reshard_after_forward, options.prefetch, compute);
}

void FsdpModel::measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const {
  report.zero_stage = 3;
  report.measured = measure_model_state_bytes(*fsdp_, *optimizer_);
  report.peak_gathered_bytes = fsdp_->peak_gathered_bytes();
  if (!spec) {
    return;
  }
  MemoryEstimateOptions estimate;
  estimate.optimizer = *spec;
  estimate.world_size = group_->world_size();
  estimate.rank = group_->rank();
  estimate.stage = 3;
  std::vector<ParameterSize> sizes = parameter_sizes(*module_);
  if (fsdp_->options().compute_dtype) {
    // The module's parameters are views of the compute copies; the shards are float32.
    for (auto& size : sizes) {
      if (size.trained) {
        size.dtype = at::kFloat;
      }
    }
  }
  report.estimated = estimate_model_state_bytes(sizes, estimate);
}

} // namespace

std::unique_ptr<ParallelModel> make_fsdp_model(
    torch::nn::AnyModule model, std::shared_ptr<comm::ProcessGroup> group,
    ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups, const OptimizerFactory& make_optimizer) {
  return std::make_unique<FsdpModel>(std::move(model), std::move(group), std::move(options),
                                     std::move(precision), std::move(param_groups),
                                     make_optimizer);
}

} // namespace largo::parallel
