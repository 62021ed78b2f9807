// Pipeline parallelism as a mode of parallelize(): PipelineParallel's stages behind the
// ParallelModel interface, so the trainer's step, evaluation and checkpoints run it like any
// other mode. What differs: a micro-step is the whole schedule (forward_backward), evaluation
// forwards go through the pipeline and every rank gets the outputs, the data-parallel group
// is the stage's replicas, and model and optimizer states are the whole model's, gathered on
// pipeline rank 0. With ZeRO-1 each replica steps its shard of the stage's parameters; the
// checkpoint still holds the whole optimizer state (consolidated over the replicas, merged
// over the stages), so every layout reads it. With tensor parallelism (a pp x dp x tp mesh)
// each stage's planned layers are split over its "tp" group: a rank exchanges activations
// with the ranks of the next and previous stages that hold the same shards (its "pp" group),
// the gradient norm and the state are the unsharded model's (tensor_parallel_state.h), and
// found_inf is agreed over the "tp" group too. The "tp" dimension
// (tensor_parallel_dimension.h) makes each stage whole before the stages are merged.
#include "../parallel_modes.h"
#include "../tensor_parallel/tensor_parallel_dimension.h"

#include <largo/core/error.h>
#include <largo/models/module_device.h>
#include <largo/optim/grad_clipping.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>
#include <largo/parallel/mesh/device_mesh.h>
#include <largo/parallel/pipeline/pipeline_checkpoint.h>
#include <largo/precision/autocast.h>

#include <fmt/format.h>

#include <optional>
#include <unordered_set>

namespace largo::parallel {
namespace {

torch::Device blocks_device(const std::vector<PipelineBlock>& blocks) {
  for (const auto& block : blocks) {
    for (const auto& parameter : block.module.ptr()->parameters()) {
      return parameter.device();
    }
  }
  return torch::Device(torch::kCPU);
}

// The entries of `groups` whose tensors are `module`'s parameters (this rank's stages);
// groups left empty are dropped, as optim::build_param_groups drops them.
std::vector<optim::ParamGroup>
groups_of(std::vector<optim::ParamGroup> groups, const torch::nn::Module& module) {
  std::unordered_set<const void*> own;
  for (const auto& parameter : module.parameters()) {
    own.insert(parameter.unsafeGetTensorImpl());
  }
  std::vector<optim::ParamGroup> kept;
  for (auto& group : groups) {
    optim::ParamGroup part = group;
    part.params.clear();
    part.names.clear();
    for (size_t i = 0; i < group.params.size(); ++i) {
      if (own.count(group.params[i].unsafeGetTensorImpl()) > 0) {
        part.params.push_back(group.params[i]);
        part.names.push_back(group.names.at(i));
      }
    }
    if (!part.params.empty()) {
      kept.push_back(std::move(part));
    }
  }
  return kept;
}

// Empties every parameter and buffer of `blocks` that `own` (this rank's stages) does not
// hold, so that a rank keeps about 1/S of a model every rank built whole (the caller's
// model shares these tensors).
void empty_other_stages(
    const std::vector<std::shared_ptr<torch::nn::Module>>& blocks, const torch::nn::Module& own) {
  std::unordered_set<const void*> kept;
  for (const auto& tensor : own.parameters()) {
    kept.insert(tensor.unsafeGetTensorImpl());
  }
  for (const auto& tensor : own.buffers()) {
    kept.insert(tensor.unsafeGetTensorImpl());
  }
  torch::NoGradGuard no_grad;
  for (const auto& block : blocks) {
    for (auto tensor : block->parameters()) {
      if (kept.count(tensor.unsafeGetTensorImpl()) == 0) {
        tensor.set_data(at::empty({0}, tensor.options()));
      }
    }
    for (auto tensor : block->buffers()) {
      if (kept.count(tensor.unsafeGetTensorImpl()) == 0) {
        tensor.set_data(at::empty({0}, tensor.options()));
      }
    }
  }
}

// The leading rows of `batch` padded with zero rows to `rows`.
at::Tensor pad_rows(const at::Tensor& batch, int64_t rows) {
  std::vector<int64_t> shape = batch.sizes().vec();
  shape[0] = rows - batch.size(0);
  return at::cat({batch, at::zeros(shape, batch.options())});
}

// The "pp" dimension of the whole-state operation (../mesh/state_dimension.h): a rank's
// stages own their parameters (OwnedBy), so a whole state is the stages' parts merged on
// pipeline rank 0, and a whole state's part is the entries of this rank's stages.
class PipelineDimension : public StateDimension {
 public:
  explicit PipelineDimension(const PipelineParallel& pipeline) : pipeline_(pipeline) {}

  NamedTensors whole_values(NamedTensors part, int root, Elsewhere elsewhere) const override {
    if (root != 0) {
      throw OptionError(
          "model_state_dict's root",
          std::to_string(root),
          "0 with a pipeline (its rank 0 gathers the stages)");
    }
    c10::impl::GenericDict own(c10::StringType::get(), c10::TensorType::get());
    for (const auto& [name, tensor] : part) {
      own.insert(name, tensor);
    }
    const c10::impl::GenericDict full = pipeline_.full_state_dict(own);
    if (pipeline_.pipeline_rank() != 0) {
      return elsewhere == Elsewhere::kOwnPart ? part : NamedTensors{};
    }
    NamedTensors whole;
    for (const auto& item : full) {
      whole.emplace_back(item.key().toStringRef(), item.value().toTensor().cpu());
    }
    return whole;
  }
  // The module holds this rank's stages under the whole model's names: loading picks them.
  Values part_of_values(Values whole) const override {
    return whole;
  }
  Update update_of(const std::string& /*name*/, Update update) const override {
    return update;
  }
  // The stages' states merged on pipeline rank 0 (None elsewhere; a part-less pipeline, that
  // of another replica, gets None too).
  c10::IValue whole_optimizer_state(
      const c10::IValue& part, const std::vector<optim::ParamGroup>& /*groups*/) const override {
    const std::vector<c10::IValue> parts = gather_to_root(pipeline_.pipeline_group(), part);
    if (parts.empty() || parts.front().isNone()) {
      return {};
    }
    return merge_optimizer_state_dicts(parts, pipeline_.full_parameter_names());
  }
  c10::IValue part_of_optimizer_state(
      const c10::IValue& whole, const std::vector<optim::ParamGroup>& groups) const override {
    std::vector<std::string> names;
    for (const auto& group : groups) {
      names.insert(names.end(), group.names.begin(), group.names.end());
    }
    return select_optimizer_state(whole, names);
  }

 private:
  const PipelineParallel& pipeline_;
};

class PipelineModel : public ParallelModel {
 public:
  PipelineModel(
      std::shared_ptr<DeviceMesh> mesh,
      std::unique_ptr<PipelineParallel> pipeline,
      ParallelOptions options,
      std::unique_ptr<precision::MixedPrecision> precision,
      std::vector<optim::ParamGroup> param_groups,
      const OptimizerFactory& make_optimizer)
      : ParallelModel(
            pipeline->module(), std::move(mesh), std::move(options), std::move(precision)),
        pipeline_(std::move(pipeline)),
        stages_(*pipeline_) {
    auto own_groups = groups_of(std::move(param_groups), *module_);
    // LARC's and LAMB's norms: the unsharded parameters' (ZeRO-1: over the replicas, then
    // over the shards).
    const ParameterNormCompletion complete_norms = tensor_parallel_->parameter_norms();
    if (options_.data_parallelism == DataParallelism::kZero1) {
      ShardedOptimizerOptions zero;
      zero.make_base_optimizer = make_optimizer;
      zero.complete_parameter_norms = complete_norms;
      auto sharded = std::make_unique<ShardedOptimizer>(std::move(own_groups), replicas_, zero);
      sharded_ = sharded.get();
      set_optimizer(std::move(sharded));
    } else {
      set_optimizer(make_optimizer(std::move(own_groups)));
    }
    if (complete_norms && sharded_ == nullptr) {
      optimizer_->set_norm_reducer(complete_norms(optimizer_->param_groups()));
    }
  }

  // The schedule reads its loss on the host: it goes back to the device as a 0-d tensor.
  at::Tensor forward_backward_on_device(
      const at::Tensor& inputs,
      const at::Tensor& targets,
      const LossFunction& loss,
      int64_t loss_divisor) override {
    const precision::PrecisionPolicy& policy = precision_->policy();
    const bool autocast = policy.enabled && policy.autocast;
    const c10::DeviceType device_type = module_device().type();
    std::optional<precision::AutocastGuard> guard;
    if (autocast) {
      guard.emplace(device_type, policy.low_precision);
    }
    // The loss outside autocast, on outputs of a mixed-precision policy in float32, as the
    // other modes compute it (MixedPrecision::forward): a float64 model's stays float64.
    auto outside_autocast_loss = [&](const at::Tensor& output, const at::Tensor& target) {
      std::optional<precision::AutocastGuard> off;
      if (autocast) {
        off.emplace(device_type, policy.low_precision, /*enabled=*/false);
      }
      const bool to_float32 =
          policy.enabled && output.is_floating_point() && output.scalar_type() != at::kFloat;
      return loss(to_float32 ? output.to(at::kFloat) : output, target);
    };
    precision::GradScaler* scaler = precision_->grad_scaler();
    auto scale = [scaler, loss_divisor](const at::Tensor& weighted) {
      at::Tensor divided =
          loss_divisor > 1 ? weighted / static_cast<double>(loss_divisor) : weighted;
      return scaler != nullptr ? scaler->scale(divided) : divided;
    };
    const double value = pipeline_->forward_backward(inputs, targets, outside_autocast_loss, scale);
    return at::scalar_tensor(value, at::TensorOptions().dtype(at::kDouble).device(module_device()));
  }

  bool forward_communicates_without_grad() const override {
    return true; // every forward runs the pipeline
  }
  const PipelineParallel* pipeline() const override {
    return pipeline_.get();
  }
  std::vector<std::string> whole_model_names() const override {
    return pipeline_->full_model_names();
  }
  // This pipeline rank's stages' parameters (ZeRO-1: their optimizer state flat-sharded over
  // the stage's replicas; with tensor parallelism, the stages' slices).
  void place(StatePlacements& placements) const override {
    const Placement owned = Placement::owned_by(pipeline_->pipeline_rank());
    placements.place_all("pp", owned, owned);
    if (sharded_ != nullptr) {
      placements.place_all("dp", Placement::replicate(), Placement::flat_shard());
    }
  }

 protected:
  const StateDimension* state_dimension(const std::string& dimension) const override {
    return dimension == "pp" ? &stages_ : ParallelModel::state_dimension(dimension);
  }
  // ZeRO-1: the stage's optimizer state is consolidated over its replicas first.
  std::optional<OptimizerShard> optimizer_pieces() override {
    if (sharded_ == nullptr) {
      return std::nullopt;
    }
    return OptimizerShard{&sharded_->base(), sharded_->piece_ownership(), sharded_->type()};
  }
  void load_held_optimizer_state(const c10::IValue& state) override {
    if (sharded_ != nullptr) {
      sharded_->load_whole_state_dict(state);
    } else {
      optimizer_->load_state_dict(state);
    }
  }

  // Evaluation: every rank gets the outputs. A batch smaller than the number of
  // micro-batches (a test set's last) is padded with zero rows, which are dropped again.
  at::Tensor run_forward(const at::Tensor& input) override {
    const int64_t rows = input.size(0);
    const int64_t microbatches = pipeline_->options().num_microbatches();
    if (rows >= microbatches) {
      return pipeline_->forward(input, /*broadcast_outputs=*/true);
    }
    return pipeline_->forward(pad_rows(input, microbatches), /*broadcast_outputs=*/true)
        .narrow(0, 0, rows);
  }
  // The replicas' gradients averaged; with broadcast_buffers their buffers (BatchNorm's
  // running statistics) then become replica 0's, so that every replica evaluates and
  // checkpoints with the same ones (DDP broadcasts them before each forward instead; here a
  // step's micro-batches each update them).
  void reduce_gradients() override {
    pipeline_->reduce_gradients();
    if (options_.ddp.broadcast_buffers && mesh_->size("dp") > 1) {
      broadcast_coalesced(*replicas_, module_->buffers(), /*root=*/0);
    }
  }
  // ZeRO-1: only this replica's pieces are unscaled, checked and clipped; the pieces of all
  // ranks tile the whole model once, so their norms add up over the world.
  std::vector<at::Tensor> gradient_holders() const override {
    return sharded_ != nullptr ? sharded_->shard_parameters() : trained_parameters_;
  }
  // Without tensor parallelism ZeRO-1's pieces of all ranks tile the whole model once, so
  // their norms add up over the world. With it: each stage's norm completed over its shards
  // (ZeRO-1: its pieces' summed over the replicas first), then summed over the stages.
  double clip_gradients(double max_norm, double norm_type) override {
    if (!tensor_parallel_->enabled()) {
      return sharded_ != nullptr ? clip_grad_norm_of_pieces(
                                       sharded_->shard_parameters(), *group_, max_norm, norm_type)
                                 : pipeline_->clip_grad_norm(max_norm, norm_type);
    }
    const TensorParallelState& tp = tensor_parallel_->state();
    if (sharded_ != nullptr) {
      return optim::clip_grad_norm(
          sharded_->shard_parameters(),
          max_norm,
          norm_type,
          tp.piece_norm_reducer(
              sharded_->named_shard_parameters(), norm_type, replicas_, pipeline_->norm_reducer()));
    }
    const auto parameters = pipeline_->parameters();
    return optim::clip_grad_norm(
        parameters,
        max_norm,
        norm_type,
        tp.norm_reducer(parameters, norm_type, pipeline_->norm_reducer()));
  }
  std::string describe_mode() const override {
    return fmt::format(
        "pipeline: {}; {}{}",
        mesh_->describe(),
        pipeline_->describe(),
        sharded_ != nullptr ? "; ZeRO-1 over each stage's replicas" : "");
  }

 private:
  std::unique_ptr<PipelineParallel> pipeline_;
  ShardedOptimizer* sharded_ = nullptr; // optimizer_, with ZeRO-1
  PipelineDimension stages_;            // its "pp" dimension
};

} // namespace

std::unique_ptr<ParallelModel> make_pipeline_model(
    std::vector<PipelineBlock> blocks,
    std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options,
    std::vector<optim::ParamGroup> param_groups,
    const OptimizerFactory& make_optimizer) {
  const torch::Device device = blocks_device(blocks);
  std::vector<std::shared_ptr<torch::nn::Module>> all_blocks;
  for (const auto& block : blocks) {
    all_blocks.push_back(block.module.ptr());
  }
  PipelineParallelOptions stages = options.pipeline.stages;
  stages.data_parallel(options.ddp); // manual reduction is forced over the replicas
  auto pipeline = std::make_unique<PipelineParallel>(
      std::move(blocks), mesh->group("pp"), mesh->group("dp"), stages);
  empty_other_stages(all_blocks, *pipeline->module());
  // Every stage, replica and tensor-parallel shard skips (or stops) together.
  precision::GradScalerOptions scaler_options = options.grad_scaler;
  scaler_options.found_inf_reducer = pipeline->found_inf_reducer();
  if (tensor_parallel_enabled(options)) {
    auto stages_and_replicas = scaler_options.found_inf_reducer;
    auto shards = precision::found_inf_all_reduce(mesh->group("tp"));
    scaler_options.found_inf_reducer = [stages_and_replicas, shards](at::Tensor& found_inf) {
      stages_and_replicas(found_inf);
      shards(found_inf);
    };
  }
  auto precision = std::make_unique<precision::MixedPrecision>(
      options.precision, *pipeline->module(), device, scaler_options, options.check_finite);
  return std::make_unique<PipelineModel>(
      std::move(mesh),
      std::move(pipeline),
      std::move(options),
      std::move(precision),
      std::move(param_groups),
      make_optimizer);
}

} // namespace largo::parallel
