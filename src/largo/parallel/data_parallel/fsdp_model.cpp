// FSDP (ZeRO-3): parameters, gradients and optimizer state sharded over the mesh's "dp"
// group; with tensor parallelism (torchtitan's 2-D FSDP x TP), over the replicas of a module
// whose layers are split over the "tp" group: FSDP flattens and shards each rank's slices,
// and what must see the unsharded model (the gradient norm, LARC's and LAMB's per-parameter
// norms, the model and optimizer state) is completed over the "tp" dimension after FSDP's own
// gathers (tensor_parallel_dimension.h).
#include "../parallel_modes.h"
#include "../tensor_parallel/tensor_parallel_dimension.h"

#include <largo/core/memory_tracker.h>
#include <largo/optim/grad_clipping.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>
#include <largo/parallel/mesh/device_mesh.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace largo::parallel {
namespace {

class FsdpModel : public ParallelModel {
 public:
  FsdpModel(torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
            ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
            std::vector<optim::ParamGroup> param_groups, const OptimizerFactory& make_optimizer)
      : ParallelModel(model, std::move(mesh), std::move(options), std::move(precision)) {
    // FSDP shards over the mesh's "dp" group (replicas_), of the "tp" group's slices.
    fsdp_ = std::make_unique<FullyShardedDataParallel>(std::move(model), replicas_, options_.fsdp);
    // Over this rank's pieces.
    set_optimizer(
        fsdp_->make_optimizer(param_groups, make_optimizer, tensor_parallel_->parameter_norms()));
  }

  // On the first replica, with tensor parallelism: its ranks are each other's shards.
  std::vector<std::pair<std::string, at::Tensor>> model_state_dict(int root) override {
    return tensor_parallel_->whole(fsdp_->full_state_on_rank(root), module_device());
  }
  void load_model_state_dict(const std::unordered_map<std::string, at::Tensor>& state) override {
    fsdp_->load_full_state(tensor_parallel_->slices(state)); // each rank keeps its shard
  }
  void update_full_parameter(
      const std::string& name, const std::function<void(at::Tensor&)>& update) override {
    fsdp_->update_full_parameter(name, tensor_parallel_->update_of(name, update));
  }
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    return tensor_parallel_->whole(fsdp_parameters(), module_device());
  }

  // Without tensor parallelism the checkpoint writes this rank's pieces (optimizer_pieces());
  // with it, the unsharded model's, consolidated over the replicas on the first one (None on
  // the others), then gathered over the shards. Collective.
  c10::IValue optimizer_state_dict() override {
    if (optimizer_shard()) {
      return ParallelModel::optimizer_state_dict();
    }
    const c10::IValue own = consolidate_on_first_rank(
        *optimizer_,
        fsdp_->piece_ownership(),
        "fsdp",
        fsdp_->process_group(),
        local_parameter_shapes());
    return tensor_parallel_->optimizer_state(own, module_parameter_groups(), /*gather=*/true);
  }
  void load_optimizer_state_dict(const c10::IValue& state) override {
    if (optimizer_shard()) {
      ParallelModel::load_optimizer_state_dict(state);
      return;
    }
    const c10::IValue own =
        tensor_parallel_->optimizer_state(state, module_parameter_groups(), /*gather=*/false);
    const auto shapes = local_parameter_shapes();
    load_resharded_piece_state(*optimizer_, fsdp_->piece_ownership(), 1, [&](int) {
      return whole_state_as_single_shard(own, shapes);
    });
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
  bool forward_communicates_without_grad() const override {
    return true; // units are gathered for evaluation too
  }

 protected:
  at::Tensor run_forward(const at::Tensor& input) override {
    return fsdp_->forward(input);
  }
  std::optional<OptimizerShard> optimizer_pieces() override {
    return OptimizerShard{optimizer_.get(), fsdp_->piece_ownership(), "fsdp"};
  }
  // The optimizer's groups hold 1-D pieces; the module keeps the shapes (this rank's slices
  // with tensor parallelism).
  std::map<std::string, std::vector<int64_t>> local_parameter_shapes() const override {
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      if (item.value().requires_grad()) {
        shapes[item.key()] = item.value().sizes().vec();
      }
    }
    return shapes;
  }
  // Flat shards over "dp", gathered into the module as compute copies (in compute_dtype when
  // one is set).
  void place(StatePlacements& placements) const override {
    const ParameterPlacement planned = data_parallel_placement(DataParallelism::kFsdp);
    placements.place_all("dp", planned.value.at("dp"), planned.optimizer_state.at("dp"));
  }
  // With tensor parallelism the pieces' partial norms are summed over the replicas, then
  // completed over the shards.
  double clip_gradients(double max_norm, double norm_type) override {
    if (!tensor_parallel_->enabled()) {
      return fsdp_->clip_grad_norm(max_norm, norm_type);
    }
    const std::vector<at::Tensor> pieces = fsdp_->shard_parameters(); // gradients attached
    TensorParallelDimension::NamedTensors named;
    for (const auto& group : optimizer_->param_groups()) { // the same pieces, by name
      for (size_t i = 0; i < group.params.size(); ++i) {
        named.emplace_back(group.names.at(i), group.params[i]);
      }
    }
    return optim::clip_grad_norm(
        pieces,
        max_norm,
        norm_type,
        tensor_parallel_->state().piece_norm_reducer(named, norm_type, replicas_));
  }
  std::string describe_mode() const override;
  void measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const override;

 private:
  // Every parameter's value as FSDP holds it whole (this rank's slices with tensor
  // parallelism), frozen ones included, in the module's order. Collective.
  std::vector<std::pair<std::string, at::Tensor>> fsdp_parameters() {
    std::map<std::string, at::Tensor> gathered;
    for (auto& [name, value] : fsdp_->full_parameters()) {
      gathered.emplace(name, std::move(value));
    }
    std::vector<std::pair<std::string, at::Tensor>> values;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      auto found = gathered.find(item.key()); // frozen ones are kept whole
      values.emplace_back(
          item.key(), found != gathered.end() ? found->second : item.value().detach().clone());
    }
    return values;
  }
  // The module's trained parameters as one group (their names and shapes), for
  // TensorParallelState::map_optimizer_state, which the optimizer's pieces cannot serve.
  std::vector<optim::ParamGroup> module_parameter_groups() const {
    optim::ParamGroup group;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      if (item.value().requires_grad()) {
        group.params.push_back(item.value());
        group.names.push_back(item.key());
      }
    }
    return {group};
  }
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
          ? fmt::format(
                "{} compute copies of float32 shards (BatchNorm in float32), gradients "
                "reduced in {}",
                c10::toString(*options.compute_dtype),
                options.fp32_reduce_scatter ? "float32" : c10::toString(*options.compute_dtype))
          : std::string("compute in the parameters' dtype");
  return fmt::format(
      "ZeRO stage 3 (FSDP): parameters, gradients and optimizer state sharded "
      "over {} rank(s) ({}), {:.2f} MiB of parameter shards per rank; units ({}): "
      "{}; reshard_after_forward {}, prefetch {}; {}",
      replicas_->world_size(),
      replicas_->backend(),
      static_cast<double>(fsdp_->shard_bytes()) / (1024.0 * 1024.0),
      options.wrap_policy.describe(),
      fmt::join(units, ", "),
      options.reshard_after_forward,
      options.prefetch,
      compute);
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
  estimate.world_size = replicas_->world_size();
  estimate.rank = replicas_->rank();
  estimate.stage = 3;
  estimate.offload_optimizer = options_.offload_optimizer;
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
    torch::nn::AnyModule model, std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options, std::unique_ptr<precision::MixedPrecision> precision,
    std::vector<optim::ParamGroup> param_groups, const OptimizerFactory& make_optimizer) {
  return std::make_unique<FsdpModel>(std::move(model), std::move(mesh), std::move(options),
                                     std::move(precision), std::move(param_groups),
                                     make_optimizer);
}

} // namespace largo::parallel
