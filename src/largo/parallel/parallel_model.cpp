#include "tensor_parallel/tensor_parallel_dimension.h"

#include <largo/parallel/parallelize.h>

#include <largo/core/byte_format.h>
#include <largo/core/error.h>
#include <largo/core/memory_tracker.h>
#include <largo/models/module_device.h>
#include <largo/optim/grad_clipping.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace largo::parallel {

std::string to_string(DataParallelism mode) {
  switch (mode) {
  case DataParallelism::kDdp:
    return "DDP";
  case DataParallelism::kZero1:
    return "ZeRO-1";
  case DataParallelism::kZero2:
    return "ZeRO-2";
  case DataParallelism::kFsdp:
    return "FSDP (ZeRO-3)";
  }
  return "?";
}

int zero_stage(DataParallelism mode) {
  switch (mode) {
  case DataParallelism::kDdp:
    return 0;
  case DataParallelism::kZero1:
    return 1;
  case DataParallelism::kZero2:
    return 2;
  case DataParallelism::kFsdp:
    return 3;
  }
  return 0;
}

ParameterPlacement data_parallel_placement(DataParallelism mode) {
  const int stage = zero_stage(mode);
  const Placement value = stage >= 3 ? Placement::flat_shard() : Placement::replicate();
  const Placement state = stage >= 1 ? Placement::flat_shard() : Placement::replicate();
  return ParameterPlacement{"", {}, {{"dp", value}}, {{"dp", state}}};
}

std::string ModelStateReport::describe(int rank) const {
  constexpr double kMiB = 1024.0 * 1024.0;
  auto pair = [&](int64_t measured_bytes, std::optional<int64_t> estimated_bytes) {
    return estimated_bytes ? fmt::format("{:.2f} / {:.2f} MiB", measured_bytes / kMiB,
                                         *estimated_bytes / kMiB)
                           : fmt::format("{:.2f} MiB", measured_bytes / kMiB);
  };
  std::string text = fmt::format(
      "model state on rank {} (ZeRO stage {}), measured{}: parameters {}, gradients {}, "
      "optimizer state {}",
      rank, zero_stage, estimated ? " / estimated" : "",
      pair(measured.parameters, estimated ? std::optional(estimated->parameters) : std::nullopt),
      pair(measured.gradients, estimated ? std::optional(estimated->gradients) : std::nullopt),
      pair(measured.optimizer_state,
           estimated ? std::optional(estimated->optimizer_state) : std::nullopt));
  if (measured.host > 0 || (estimated && estimated->host > 0)) {
    text += fmt::format(
        "; in host memory (offloaded optimizer) {}",
        pair(measured.host, estimated ? std::optional(estimated->host) : std::nullopt));
  }
  if (zero_stage == 3) {
    text += fmt::format("; at most {} of full units gathered at once so far (transient, on top "
                        "of the model state)",
                        format_bytes(peak_gathered_bytes));
  }
  if (allocator_bytes) {
    text += fmt::format(
        "; CUDA allocator: {} allocated now, {} at the peak so far",
        format_bytes(*allocator_bytes),
        format_bytes(allocator_peak_bytes.value_or(0)));
  }
  return text;
}

ParallelModel::MicroStep::MicroStep(std::unique_ptr<DistributedDataParallel::NoSyncGuard> no_sync)
    : no_sync_(std::move(no_sync)) {}

ParallelModel::MicroStep::~MicroStep() = default;

ParallelModel::ParallelModel(
    torch::nn::AnyModule model,
    std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options,
    std::unique_ptr<precision::MixedPrecision> precision)
    : model_(std::move(model)),
      module_(model_.ptr()),
      mesh_(std::move(mesh)),
      group_(mesh_->world_group()),
      replicas_(mesh_->group("dp")),
      options_(std::move(options)),
      precision_(std::move(precision)),
      tensor_parallel_(std::make_unique<TensorParallelDimension>(*module_, *mesh_)) {}

ParallelModel::ParallelModel(
    std::shared_ptr<torch::nn::Module> module,
    std::shared_ptr<DeviceMesh> mesh,
    ParallelOptions options,
    std::unique_ptr<precision::MixedPrecision> precision)
    : module_(std::move(module)),
      mesh_(std::move(mesh)),
      group_(mesh_->world_group()),
      replicas_(mesh_->group("dp")),
      options_(std::move(options)),
      precision_(std::move(precision)),
      tensor_parallel_(std::make_unique<TensorParallelDimension>(*module_, *mesh_)) {}

ParallelModel::~ParallelModel() = default;

at::Tensor ParallelModel::forward(const at::Tensor& input) {
  return precision_->forward(
      [this](const at::Tensor& x) {
        if (torch::GradMode::is_enabled()) { // no buffer broadcast in evaluation
          before_forward();
        }
        return run_forward(x);
      },
      input);
}

at::Tensor ParallelModel::run_forward(const at::Tensor& input) {
  return model_.forward<at::Tensor>(input);
}

ParallelModel::MicroStep ParallelModel::micro_step(bool synchronize) {
  return MicroStep(synchronize ? nullptr : no_sync());
}

void ParallelModel::backward(const at::Tensor& loss) {
  precision_->backward(loss);
}

double ParallelModel::forward_backward(const at::Tensor& inputs, const at::Tensor& targets,
                                       const LossFunction& loss, int64_t loss_divisor) {
  return forward_backward_on_device(inputs, targets, loss, loss_divisor).item<double>();
}

at::Tensor ParallelModel::forward_backward_on_device(
    const at::Tensor& inputs,
    const at::Tensor& targets,
    const LossFunction& loss,
    int64_t loss_divisor) {
  const at::Tensor value = loss(forward(inputs), targets);
  backward(loss_divisor > 1 ? value / static_cast<double>(loss_divisor) : value);
  return value.detach();
}

bool ParallelModel::finish_backward(bool loss_is_finite) {
  reduce_gradients();
  return precision_->unscale_(gradient_holders(), loss_is_finite || !options_.check_finite);
}

at::Tensor ParallelModel::finish_backward_on_device(const at::Tensor& loss_non_finite) {
  reduce_gradients();
  return precision_->unscale_on_device(
      gradient_holders(), options_.check_finite ? loss_non_finite : at::Tensor());
}

double ParallelModel::clip_grad_norm(double max_norm, double norm_type) {
  return clip_gradients(max_norm, norm_type);
}

bool ParallelModel::step() {
  return precision_->step([this] { optimizer_->step(); });
}

void ParallelModel::zero_grad() {
  optimizer_->zero_grad();
}

void ParallelModel::drop_gradients(const std::vector<std::string>& names) {
  const std::vector<std::string> whole = whole_model_names();
  for (const std::string& name : names) {
    if (std::find(whole.begin(), whole.end(), name) == whole.end()) {
      throw Error(
          fmt::format("ParallelModel::drop_gradients: the model has no parameter {}", name));
    }
  }
  const std::set<std::string> dropped(names.begin(), names.end());
  // The optimizer's tensors (the parameters, O2's masters or the sharded modes' pieces, each
  // group naming them) lose their gradients, so that the optimizer skips them.
  for (auto& group : optimizer_->param_groups()) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      if (dropped.count(group.names.at(i)) != 0) {
        group.params[i].mutable_grad().reset();
      }
    }
  }
  drop_piece_gradients(dropped);
}

void ParallelModel::set_optimizer(std::unique_ptr<optim::Optimizer> optimizer) {
  optimizer_ = std::move(optimizer);
  trained_parameters_.clear();
  for (const auto& param_group : optimizer_->param_groups()) {
    trained_parameters_.insert(
        trained_parameters_.end(), param_group.params.begin(), param_group.params.end());
  }
}

std::vector<at::Tensor> ParallelModel::gradient_holders() const {
  return trained_parameters_;
}

double ParallelModel::clip_gradients(double max_norm, double norm_type) {
  return optim::clip_grad_norm(trained_parameters_, max_norm, norm_type);
}

std::string ParallelModel::describe() const {
  std::string text = describe_mode();
  if (tensor_parallel_->enabled()) {
    text += "; " + tensor_parallel_->describe();
  }
  if (options_.offload_optimizer) {
    text += "; optimizer state offloaded to host memory and stepped there";
  }
  text += fmt::format("; precision {}", precision_->policy().describe());
  if (checkpoint_plan_) {
    text += fmt::format("; activation checkpointing: {}",
                        checkpoint_plan_->describe(options_.activation_checkpointing.sequential));
  } else if (checkpointing_) {
    text += fmt::format("; activation checkpointing: {}", checkpointing_->describe());
  }
  return text;
}

void ParallelModel::measure(ModelStateReport& report, const optim::OptimizerSpec* spec) const {
  report.measured = measure_model_state_bytes(*module_, *optimizer_);
  if (!spec) {
    return;
  }
  MemoryEstimateOptions estimate;
  estimate.optimizer = *spec;
  estimate.world_size = data_parallel_group().world_size(); // what ZeRO shards over
  estimate.rank = data_parallel_group().rank();
  estimate.stage = report.zero_stage;
  estimate.offload_optimizer = options_.offload_optimizer;
  // O2: the optimizer's groups hold the float32 masters, which are not the module's tensors.
  const bool masters = precision_->master_weights() != nullptr;
  if (masters) {
    estimate.master_weights_dtype = at::kFloat;
  }
  report.estimated = estimate_model_state_bytes(
      masters ? parameter_sizes(*module_) : parameter_sizes(*module_, optimizer_->param_groups()),
      estimate);
}

ModelStateReport ParallelModel::memory_report(const optim::OptimizerSpec* spec) const {
  ModelStateReport report;
  report.zero_stage = zero_stage(options_.data_parallelism);
  measure(report, spec);
  // The optimizer's tensors are on the model's device in every mode (FSDP's too: its shards).
  const at::Device device =
      trained_parameters_.empty() ? at::Device(at::kCPU) : trained_parameters_.front().device();
  if (device.is_cuda() && MemoryTracker::supported(device)) {
    const MemoryTracker allocator(device);
    report.allocator_bytes = allocator.current_bytes();
    report.allocator_peak_bytes = allocator.peak_bytes();
  }
  return report;
}

// ---- the whole-state operation -------------------------------------------------------

std::vector<const StateDimension*> ParallelModel::dimensions_to_gather(bool optimizer_state) const {
  std::vector<const StateDimension*> dimensions;
  for (const std::string& name : placements().dimensions_to_gather(optimizer_state)) {
    dimensions.push_back(state_dimension(name));
  }
  return dimensions;
}

const StateDimension* ParallelModel::state_dimension(const std::string& dimension) const {
  if (dimension == "tp") {
    return tensor_parallel_.get();
  }
  throw Error(fmt::format(
      "ParallelModel: no strategy of the '{}' dimension makes its "
      "placements whole",
      dimension));
}

std::vector<std::pair<std::string, at::Tensor>> ParallelModel::model_state_dict(int root) {
  NamedTensors values = held_values(root);
  for (const StateDimension* dimension : dimensions_to_gather(/*optimizer_state=*/false)) {
    values = dimension->whole_values(std::move(values), root, StateDimension::Elsewhere::kNothing);
  }
  return values;
}

void ParallelModel::load_model_state_dict(const Values& whole) {
  Values values = whole;
  const auto dimensions = dimensions_to_gather(/*optimizer_state=*/false);
  for (auto dimension = dimensions.rbegin(); dimension != dimensions.rend(); ++dimension) {
    values = (*dimension)->part_of_values(std::move(values));
  }
  store_values(values);
}

std::vector<std::pair<std::string, at::Tensor>> ParallelModel::full_parameters() {
  NamedTensors values = held_parameters();
  for (const StateDimension* dimension : dimensions_to_gather(/*optimizer_state=*/false)) {
    values = dimension->whole_values(std::move(values), 0, StateDimension::Elsewhere::kOwnPart);
  }
  return values;
}

void ParallelModel::update_full_parameter(
    const std::string& name, const std::function<void(at::Tensor&)>& update) {
  StateDimension::Update through = update;
  const auto dimensions = dimensions_to_gather(/*optimizer_state=*/false);
  for (auto dimension = dimensions.rbegin(); dimension != dimensions.rend(); ++dimension) {
    through = (*dimension)->update_of(name, std::move(through));
  }
  update_held(name, through);
}

c10::IValue ParallelModel::optimizer_state_dict() {
  const std::vector<optim::ParamGroup> groups = held_parameter_groups();
  c10::IValue state = held_optimizer_state();
  for (const StateDimension* dimension : dimensions_to_gather(/*optimizer_state=*/true)) {
    state = dimension->whole_optimizer_state(state, groups);
  }
  return state;
}

void ParallelModel::load_optimizer_state_dict(const c10::IValue& whole) {
  const std::vector<optim::ParamGroup> groups = held_parameter_groups();
  c10::IValue state = whole;
  const auto dimensions = dimensions_to_gather(/*optimizer_state=*/true);
  for (auto dimension = dimensions.rbegin(); dimension != dimensions.rend(); ++dimension) {
    state = (*dimension)->part_of_optimizer_state(state, groups);
  }
  load_held_optimizer_state(state);
}

// ---- what a strategy holds (the module's and the optimizer's, unless it says otherwise) ----

ParallelModel::NamedTensors ParallelModel::held_values(int /*root*/) {
  NamedTensors state;
  auto to_cpu = [](const at::Tensor& tensor) { // the standard layout, whatever the module's
    return tensor.detach().to(
        at::kCPU, /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous);
  };
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    state.emplace_back(item.key(), to_cpu(item.value()));
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    state.emplace_back(item.key(), to_cpu(item.value()));
  }
  return state;
}

ParallelModel::NamedTensors ParallelModel::held_parameters() {
  NamedTensors values;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    values.emplace_back(item.key(), item.value().detach().clone());
  }
  return values;
}

void ParallelModel::store_values(const Values& state) {
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, at::Tensor& target) {
    auto found = state.find(name);
    if (found == state.end()) {
      throw Error(fmt::format("load_model_state_dict: the state has no entry for {}", name));
    }
    if (found->second.sizes() != target.sizes()) {
      throw Error(fmt::format("load_model_state_dict: {} has shape [{}] in the state but [{}] "
                              "in the module",
                              name, fmt::join(found->second.sizes(), ", "),
                              fmt::join(target.sizes(), ", ")));
    }
    target.copy_(found->second);
  };
  for (auto& item : module_->named_parameters(/*recurse=*/true)) {
    load(item.key(), item.value());
  }
  for (auto& item : module_->named_buffers(/*recurse=*/true)) {
    load(item.key(), item.value());
  }
  precision_->copy_model_to_masters(); // O2: the masters follow the loaded weights
}

void ParallelModel::update_held(
    const std::string& name, const std::function<void(at::Tensor&)>& update) {
  torch::NoGradGuard no_grad;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.key() == name) {
      at::Tensor value = item.value();
      update(value);
      return;
    }
  }
  throw Error(
      fmt::format("ParallelModel::update_full_parameter: the model has no parameter {}", name));
}

c10::IValue ParallelModel::held_optimizer_state() {
  if (optimizer_shard()) { // a checkpoint writes the pieces as they are
    return optimizer_->state_dict();
  }
  if (const std::optional<OptimizerShard> pieces = optimizer_pieces()) {
    return consolidate_on_first_rank(
        *pieces->optimizer, pieces->ownership, pieces->type, *replicas_, local_parameter_shapes());
  }
  return optimizer_->state_dict();
}

void ParallelModel::load_held_optimizer_state(const c10::IValue& state) {
  optimizer_->load_state_dict(state);
}

std::vector<optim::ParamGroup> ParallelModel::held_parameter_groups() const {
  return optimizer_->param_groups();
}

std::optional<OptimizerShard> ParallelModel::optimizer_shard() {
  // Pieces of slices or of one stage's parameters are consolidated instead
  // (optimizer_state_dict), so that a checkpoint holds the whole model's state.
  return placements().optimizer_state_in_flat_pieces() ? optimizer_pieces() : std::nullopt;
}

torch::OrderedDict<std::string, at::Tensor> ParallelModel::local_state() const {
  torch::OrderedDict<std::string, at::Tensor> tensors;
  for (const auto& parameter : module_->named_parameters()) {
    tensors.insert(parameter.key(), parameter.value());
  }
  for (const auto& buffer : module_->named_buffers()) {
    tensors.insert(buffer.key(), buffer.value());
  }
  return tensors;
}

std::vector<std::string> ParallelModel::whole_model_names() const {
  std::vector<std::string> names;
  for (const auto& parameter : module_->named_parameters()) {
    names.push_back(parameter.key());
  }
  for (const auto& buffer : module_->named_buffers()) {
    names.push_back(buffer.key());
  }
  return names;
}

void ParallelModel::match_evaluation_forwards(
    int64_t forwards_run, const std::vector<int64_t>& sample_shape, torch::Device device) {
  if (!forward_communicates_without_grad()) {
    return;
  }
  at::Tensor most = at::tensor({forwards_run}, at::kLong);
  group_->all_reduce(most, comm::ReduceOp::kMax);
  std::vector<int64_t> shape{1}; // [1, sample...]
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  for (int64_t i = forwards_run; i < most.item<int64_t>(); ++i) {
    forward(at::zeros(shape, at::TensorOptions().device(device)));
  }
}

StatePlacements ParallelModel::placements() const {
  std::vector<ParameterPlacement> parameters;
  for (auto& [name, shape] : trained_parameter_shapes()) {
    parameters.push_back({name, std::move(shape), {}, {}});
  }
  StatePlacements placements(std::move(parameters));
  place(placements);
  tensor_parallel_->place(placements);
  return placements;
}

std::map<std::string, std::vector<int64_t>> ParallelModel::trained_parameter_shapes() const {
  return tensor_parallel_->whole_shapes(local_parameter_shapes());
}

at::Device ParallelModel::module_device() const {
  return models::module_device(*module_);
}

std::map<std::string, std::vector<int64_t>> ParallelModel::local_parameter_shapes() const {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& group : optimizer_->param_groups()) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      shapes[group.names.at(i)] = group.params[i].sizes().vec();
    }
  }
  return shapes;
}

} // namespace largo::parallel
