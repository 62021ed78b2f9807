#include <largo/parallel/data_parallel/fully_sharded_data_parallel.h>

#include <largo/core/error.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>
#include <largo/parallel/activation_checkpointing/sequential_interception.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/data_parallel/grad_ready_hooks.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>

#include <c10/core/StorageImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace largo::parallel {

namespace {

// Gives `tensor`'s storage `nbytes` bytes, in place: every tensor that shares the storage
// (the parameters, the views autograd saved of them) sees the new memory. 0 frees it; a
// new size allocates fresh, uninitialized memory from the storage's own allocator (the
// caching allocator on CUDA). Values are not kept.
void resize_storage(const at::Tensor& tensor, size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  if (storage->nbytes() == nbytes) {
    return;
  }
  if (nbytes == 0) {
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  } else {
    TORCH_CHECK(
        storage->allocator() != nullptr, "FSDP: the flat parameter's storage has no allocator");
    storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  }
  storage->set_nbytes(nbytes);
}

int64_t full_bytes(const FullyShardedDataParallel::Unit& unit) {
  return unit.layout.padded_numel() * static_cast<int64_t>(unit.full.element_size());
}


// The parameter names of the modules kept in float32 (with compute copies only).
std::unordered_set<std::string> float32_parameter_names(
    torch::nn::Module& model, const FullyShardedDataParallelOptions& options) {
  std::unordered_set<std::string> names;
  if (!options.compute_dtype || !options.keeps_fp32) {
    return names;
  }
  for (const auto& item : model.named_modules()) {
    if (!options.keeps_fp32(*item.value())) {
      continue;
    }
    for (const auto& param : item.value()->named_parameters(/*recurse=*/false)) {
      names.insert(item.key().empty() ? param.key() : item.key() + "." + param.key());
    }
  }
  return names;
}

} // namespace

std::vector<FsdpUnitPlan> plan_fsdp_units(const std::shared_ptr<torch::nn::Module>& model,
                                           const FullyShardedDataParallelOptions& options) {
  // With compute copies, the parameters of the modules kept in float32 go to a unit of
  // their own, wherever they are.
  const std::unordered_set<std::string> float32_names = float32_parameter_names(*model, options);
  std::vector<FsdpUnitPlan> units;
  std::vector<std::string> unit_prefixes;
  for (const WrapTarget& target : find_wrap_targets(model, options.wrap_policy)) {
    units.emplace_back();
    units.back().name = target.name;
    units.back().position = static_cast<int64_t>(unit_prefixes.size());
    unit_prefixes.push_back(target.name + ".");
  }
  const size_t root = units.size();
  units.emplace_back();
  units.back().name = "root";
  const size_t float32 = units.size();
  units.emplace_back();
  units.back().name = "float32";
  std::unordered_set<const c10::TensorImpl*> seen; // a shared parameter belongs to one unit
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    const at::Tensor& param = item.value();
    if (!param.requires_grad() || !seen.insert(param.unsafeGetTensorImpl()).second) {
      continue;
    }
    size_t unit = float32_names.count(item.key()) > 0 ? float32 : root;
    for (size_t u = 0; unit == root && u < unit_prefixes.size(); ++u) {
      if (item.key().rfind(unit_prefixes[u], 0) == 0) {
        unit = u;
      }
    }
    units[unit].param_names.push_back(item.key());
    units[unit].params.push_back(param);
    units[unit].numel += param.numel();
  }
  for (size_t u = 0; u < units.size(); ++u) {
    if (!units[u].params.empty()) {
      units[u].gathered_dtype = u == float32 || !options.compute_dtype
          ? units[u].params.front().scalar_type()
          : *options.compute_dtype;
    }
  }
  // A wrapped module whose trainable parameters all went to the float32 unit is no unit.
  units.erase(std::remove_if(units.begin(), units.end(),
                             [](const FsdpUnitPlan& unit) { return unit.params.empty(); }),
              units.end());
  int64_t position = 0;
  for (FsdpUnitPlan& unit : units) {
    if (unit.position >= 0) {
      unit.position = position++;
    }
  }
  return units;
}

struct FullyShardedDataParallel::Hooks {
  std::unique_ptr<GradReadyHooks> grad_ready;
};

namespace {

void check_options(const FullyShardedDataParallelOptions& options, comm::ProcessGroup* group) {
  if (group == nullptr) {
    throw ConfigError("FullyShardedDataParallel needs a process group (got none)");
  }
}

// With compute copies, a frozen parameter stays whole in its own dtype; outside the float32
// modules it would meet low-precision inputs.
void check_frozen_parameters(torch::nn::Module& model, at::ScalarType compute_dtype,
                             const std::vector<FsdpUnitPlan>& plans) {
  std::unordered_set<const c10::TensorImpl*> sharded;
  for (const FsdpUnitPlan& plan : plans) {
    for (const at::Tensor& param : plan.params) {
      sharded.insert(param.unsafeGetTensorImpl());
    }
  }
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (sharded.count(item.value().unsafeGetTensorImpl()) == 0 &&
        item.value().is_floating_point() && item.value().scalar_type() != compute_dtype) {
      throw Error(fmt::format(
          "FullyShardedDataParallel with {} compute copies: the frozen parameter {} is not "
          "sharded and stays {}, which would meet {} inputs; make it trainable or cast it",
          c10::toString(compute_dtype), item.key(), c10::toString(item.value().scalar_type()),
          c10::toString(compute_dtype)));
    }
  }
}

void check_unit_parameters(const FsdpUnitPlan& plan) {
  const at::Tensor& first = plan.params.front();
  for (size_t i = 0; i < plan.params.size(); ++i) {
    const at::Tensor& param = plan.params[i];
    if (!param.is_floating_point() || param.scalar_type() != first.scalar_type() ||
        param.device() != first.device()) {
      throw Error(fmt::format(
          "FullyShardedDataParallel: the parameters of unit {} must be floating point and "
          "share one dtype and device; {} is {} on {} but {} is {} on {}",
          plan.name, plan.param_names[i], c10::toString(param.scalar_type()),
          param.device().str(), plan.param_names.front(), c10::toString(first.scalar_type()),
          first.device().str()));
    }
  }
}

} // namespace

FullyShardedDataParallel::FullyShardedDataParallel(
    torch::nn::AnyModule model,
    std::shared_ptr<comm::ProcessGroup> group,
    FullyShardedDataParallelOptions options)
    : model_(std::move(model)),
      module_(model_.ptr()),
      group_(std::move(group)),
      options_(std::move(options)),
      hooks_(std::make_unique<Hooks>()) {
  check_options(options_, group_.get());
  torch::NoGradGuard no_grad;

  // Every rank starts from rank 0's model.
  std::vector<at::Tensor> state = module_->parameters();
  buffers_ = module_->buffers();
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(*group_, state, 0);

  std::vector<FsdpUnitPlan> plans = plan_fsdp_units(module_, options_);
  if (options_.compute_dtype) {
    check_frozen_parameters(*module_, *options_.compute_dtype, plans);
  }
  std::unordered_map<std::string, WrapTarget> targets;
  for (WrapTarget& target : find_wrap_targets(module_, options_.wrap_policy)) {
    targets.emplace(target.name, std::move(target));
  }
  units_.resize(plans.size());
  std::vector<at::Tensor> hooked;
  for (size_t u = 0; u < plans.size(); ++u) {
    num_wrapped_ += plans[u].position >= 0 ? 1 : 0;
    build_unit(u, std::move(plans[u]), hooked);
    Unit& unit = units_[u];
    if (unit.position >= 0) { // its forward runs through run_unit from now on
      const WrapTarget& target = targets.at(unit.name);
      unit.container = target.container;
      unit.index_in_container = target.index;
      unit.module_forward = sequential_element_forward(*unit.container, target.index);
      intercept_sequential_element(*unit.container, target.index,
                                   [this, u](const at::Tensor& x) { return run_unit(u, x); });
    }
  }
  hooks_->grad_ready = std::make_unique<GradReadyHooks>(
      hooked, [this](size_t index) { on_gradient_ready(index); }, [this] { on_backward_end(); });
}

// Lays the unit's parameters out flat, keeps this rank's shard (the parameters' own values:
// the float32 masters with compute copies) and makes the parameters views of the full buffer
// (of the gathered dtype), which starts freed. Appends the parameters to `hooked`.
void FullyShardedDataParallel::build_unit(size_t u, FsdpUnitPlan plan,
                                          std::vector<at::Tensor>& hooked) {
  check_unit_parameters(plan);
  const int rank = group_->rank();
  Unit& unit = units_[u];
  unit.name = std::move(plan.name);
  unit.position = plan.position;
  unit.param_names = std::move(plan.param_names);
  unit.params = std::move(plan.params);
  std::vector<int64_t> numels;
  for (const at::Tensor& param : unit.params) {
    numels.push_back(param.numel());
  }
  unit.layout = FlatLayout(numels, group_->world_size());
  at::Tensor values =
      at::zeros({unit.layout.padded_numel()}, unit.params.front().options().requires_grad(false));
  for (size_t i = 0; i < unit.params.size(); ++i) {
    values.narrow(0, unit.layout.offset(i), unit.params[i].numel())
        .view(unit.params[i].sizes())
        .copy_(unit.params[i]);
  }
  const int64_t shard_numel = unit.layout.shard_numel();
  unit.shard = values.narrow(0, rank * shard_numel, shard_numel).clone();
  unit.full = values.to(plan.gathered_dtype); // `values` itself without compute copies
  for (size_t i = 0; i < unit.params.size(); ++i) {
    at::Tensor& param = unit.params[i];
    param.set_data(unit.full.narrow(0, unit.layout.offset(i), param.numel()).view(param.sizes()));
    hooked_params_.emplace_back(u, i);
    hooked.push_back(param);
  }
  unit.grad_shard = at::zeros_like(unit.shard);
  unit.pieces = unit.layout.pieces_of_rank(rank);
  for (const ShardPiece& piece : unit.pieces) {
    unit.piece_params.push_back(
        unit.shard.narrow(0, piece.flat_offset - rank * shard_numel, piece.numel));
  }
  attach_piece_gradients(unit);
  resize_storage(unit.full, 0); // freed until its first forward
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  hooks_->grad_ready.reset();
  for (Unit& unit : units_) {
    if (unit.in_flight) {
      try {
        unit.pending.wait(); // the collective must not write into freed memory
      } catch (const std::exception&) {
        // A failed collective was reported by whoever waited first; nothing to do here.
      }
    }
    if (unit.container) { // the element's forward no longer goes through this object
      *(unit.container->begin() + static_cast<std::ptrdiff_t>(unit.index_in_container)) =
          unit.module_forward;
    }
  }
}

void FullyShardedDataParallel::start_gather(Unit& unit) {
  if (unit.gathered) {
    return;
  }
  torch::NoGradGuard no_grad;
  resize_storage(unit.full, static_cast<size_t>(full_bytes(unit)));
  // Compute copies: the shard is cast first, so the all-gather moves the low precision.
  unit.gather_source = unit.shard.to(unit.full.scalar_type()); // the shard itself, or a copy
  unit.pending = group_->all_gather_async(unit.full, unit.gather_source);
  unit.in_flight = true;
  unit.gathered = true;
  gathered_bytes_ += full_bytes(unit);
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
}

void FullyShardedDataParallel::gather(Unit& unit) {
  start_gather(unit);
  if (unit.in_flight) {
    unit.in_flight = false;
    unit.pending.wait();
    unit.gather_source = at::Tensor();
  }
}

void FullyShardedDataParallel::free(Unit& unit) {
  if (!unit.gathered) {
    return;
  }
  if (unit.in_flight) { // the collective writes into the storage until it is done
    unit.in_flight = false;
    unit.pending.wait();
    unit.gather_source = at::Tensor();
  }
  resize_storage(unit.full, 0);
  unit.gathered = false;
  gathered_bytes_ -= full_bytes(unit);
}

at::Tensor FullyShardedDataParallel::forward(const at::Tensor& input) {
  // Units still gathered from an earlier forward (reshard_after_forward off, or a forward
  // with no backward) may predate an optimizer step: free them so that this forward gathers
  // the current shards. A pending backward of that forward gathers again in its hooks.
  for (Unit& unit : units_) {
    free(unit);
  }
  if (options_.broadcast_buffers && !buffers_.empty()) {
    broadcast_coalesced(*group_, buffers_, 0);
  }
  for (Unit& unit : units_) {
    if (unit.position < 0) {
      // Kept through the backward: the parameters outside the wrapped units (a head) are
      // needed at its very start, the float32 unit's throughout.
      gather(unit);
    }
  }
  const at::Tensor cast_input = options_.compute_dtype && input.is_floating_point()
      ? input.to(*options_.compute_dtype)
      : input;
  at::Tensor output = model_.forward<at::Tensor>(cast_input);
  if (!output.requires_grad()) {
    // No backward will follow (inference, or nothing trainable in use).
    for (Unit& unit : units_) {
      free(unit);
    }
  }
  return output;
}

at::Tensor FullyShardedDataParallel::run_unit(size_t u, const at::Tensor& x) {
  Unit& unit = units_[u];
  const int64_t recompute = current_recompute_id();
  unit.ran_in = torch::GradMode::is_enabled() ? recompute : -1;
  gather(unit);
  // In an activation-checkpoint recompute the next unit, outside the segment being
  // recomputed, would only wait, gathered, for its own turn.
  if (options_.prefetch && recompute == 0 && u + 1 < num_wrapped_) {
    start_gather(units_[u + 1]);
  }
  at::Tensor output = unit.module_forward.forward<at::Tensor>(x);
  if (output.requires_grad()) {
    // The gradient of the unit's output arrives before the unit's own backward runs; the
    // unit before it runs next in the backward, if it ran in the same forward (not in
    // another checkpointed segment, whose recompute gathers it).
    // (The hook takes a TensorBase: libtorch 2.x hands it one, 1.13 a Tensor.)
    output.register_hook([this, u](const at::TensorBase&) {
      Unit& hooked = units_[u];
      hooked.used_in_backward = true;
      gather(hooked);
      if (options_.prefetch && u > 0 && units_[u - 1].ran_in == hooked.ran_in) {
        start_gather(units_[u - 1]);
      }
    });
  }
  if (options_.reshard_after_forward) {
    free(unit);
  }
  return output;
}

void FullyShardedDataParallel::attach_piece_gradients(Unit& unit) {
  const int64_t shard_begin = group_->rank() * unit.layout.shard_numel();
  for (size_t p = 0; p < unit.pieces.size(); ++p) {
    const ShardPiece& piece = unit.pieces[p];
    unit.piece_params[p].mutable_grad() =
        unit.grad_shard.narrow(0, piece.flat_offset - shard_begin, piece.numel);
  }
}

void FullyShardedDataParallel::on_gradient_ready(size_t param_index) {
  Unit& unit = units_[hooked_params_[param_index].first];
  unit.used_in_backward = true;
  if (++unit.num_ready == unit.params.size() && !unit.reduced) {
    reduce_gradients(unit);
  }
}

void FullyShardedDataParallel::reduce_gradients(Unit& unit) {
  torch::NoGradGuard no_grad;
  // Compute copies: the gradients are in the compute dtype; reduced in it, or in the
  // shards' dtype with fp32_reduce_scatter, and added to the shard in the shards' dtype.
  const at::ScalarType reduce_dtype =
      options_.fp32_reduce_scatter ? unit.shard.scalar_type() : unit.full.scalar_type();
  at::Tensor flat =
      at::zeros({unit.layout.padded_numel()}, unit.shard.options().dtype(reduce_dtype));
  for (size_t i = 0; i < unit.params.size(); ++i) {
    at::Tensor& param = unit.params[i];
    if (param.grad().defined()) {
      flat.narrow(0, unit.layout.offset(i), param.numel()).view(param.sizes()).copy_(param.grad());
      param.mutable_grad().reset(); // the full gradient is freed
    }
  }
  at::Tensor reduced = at::empty({unit.layout.shard_numel()}, flat.options());
  group_->reduce_scatter(reduced, flat);
  reduced.div_(group_->world_size());
  // The optimizer's zero_grad(set_to_none) dropped the pieces' gradients: the shard counts
  // as zero, and the pieces get their views back.
  bool cleared = false;
  for (const at::Tensor& piece : unit.piece_params) {
    cleared = cleared || !piece.grad().defined();
  }
  if (cleared) {
    unit.grad_shard.zero_();
    attach_piece_gradients(unit);
  }
  unit.grad_shard.add_(reduced);
  unit.reduced = true;
  free(unit);
}

void FullyShardedDataParallel::on_backward_end() {
  // Units whose parameters did not all get a gradient are reduced now (the missing ones as
  // zeros), in unit order, so that every rank issues the same collectives.
  for (Unit& unit : units_) {
    if (unit.used_in_backward && !unit.reduced) {
      reduce_gradients(unit);
    }
  }
  for (Unit& unit : units_) {
    free(unit);
    unit.num_ready = 0;
    unit.reduced = false;
    unit.used_in_backward = false;
  }
}

std::unique_ptr<optim::Optimizer> FullyShardedDataParallel::make_optimizer(
    const std::vector<optim::ParamGroup>& groups,
    const std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>&
        make_base,
    const ParameterNormCompletion& complete_parameter_norms) {
  std::unordered_map<std::string, std::pair<size_t, size_t>> where; // name -> (unit, index)
  for (size_t u = 0; u < units_.size(); ++u) {
    for (size_t i = 0; i < units_[u].param_names.size(); ++i) {
      where.emplace(units_[u].param_names[i], std::make_pair(u, i));
    }
  }
  std::unordered_map<std::string, int64_t> global_index;
  std::vector<optim::ParamGroup> shard_groups;
  std::vector<int64_t> piece_to_param;
  optimizer_group_names_.clear();
  for (const optim::ParamGroup& param_group : groups) {
    optimizer_group_names_.push_back(param_group.names);
    optim::ParamGroup shard_group;
    shard_group.name = param_group.name;
    shard_group.lr = param_group.lr;
    shard_group.weight_decay = param_group.weight_decay;
    for (const std::string& name : param_group.names) {
      auto found = where.find(name);
      if (found == where.end()) {
        throw Error(fmt::format(
            "FullyShardedDataParallel::make_optimizer: {} (group {}) is not a sharded "
            "parameter of the model (only trainable parameters are sharded; build the groups "
            "from the wrapped model)",
            name,
            param_group.name));
      }
      const int64_t index = static_cast<int64_t>(global_index.size());
      global_index.emplace(name, index);
      const Unit& unit = units_[found->second.first];
      for (size_t p = 0; p < unit.pieces.size(); ++p) {
        if (unit.pieces[p].tensor_index == found->second.second) {
          shard_group.params.push_back(unit.piece_params[p]);
          shard_group.names.push_back(name);
          piece_to_param.push_back(index);
        }
      }
    }
    shard_groups.push_back(std::move(shard_group));
  }
  std::unique_ptr<optim::Optimizer> optimizer = make_base(std::move(shard_groups));
  optimizer->set_norm_reducer(complete_norms(
      make_piece_norm_reducer(
          group_, std::move(piece_to_param), static_cast<int64_t>(global_index.size())),
      complete_parameter_norms,
      optimizer->param_groups()));
  return optimizer;
}

void FullyShardedDataParallel::zero_grad() {
  torch::NoGradGuard no_grad;
  for (Unit& unit : units_) {
    unit.grad_shard.zero_();
    attach_piece_gradients(unit);
  }
}

std::vector<at::Tensor> FullyShardedDataParallel::shard_parameters() const {
  std::vector<at::Tensor> pieces;
  for (const Unit& unit : units_) {
    pieces.insert(pieces.end(), unit.piece_params.begin(), unit.piece_params.end());
  }
  return pieces;
}

double FullyShardedDataParallel::clip_grad_norm(double max_norm, double norm_type) {
  return clip_grad_norm_of_pieces(shard_parameters(), *group_, max_norm, norm_type);
}

std::unordered_map<std::string, at::Tensor> FullyShardedDataParallel::copy_units(
    bool keep, const std::function<at::Tensor(const at::Tensor&)>& copy) {
  torch::NoGradGuard no_grad;
  std::unordered_map<std::string, at::Tensor> copies;
  for (Unit& unit : units_) {
    at::Tensor values = at::empty({unit.layout.padded_numel()}, unit.shard.options());
    group_->all_gather(values, unit.shard);
    for (size_t i = 0; keep && i < unit.params.size(); ++i) {
      copies.emplace(unit.param_names[i],
                     copy(values.narrow(0, unit.layout.offset(i), unit.params[i].numel())
                              .view(unit.params[i].sizes())));
    }
  }
  return copies;
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedDataParallel::full_parameters() {
  const auto values =
      copy_units(/*keep=*/true, [](const at::Tensor& param) { return param.detach().clone(); });
  std::vector<std::pair<std::string, at::Tensor>> ordered;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    auto found = values.find(item.key());
    if (found != values.end()) {
      ordered.emplace_back(item.key(), found->second);
    }
  }
  return ordered;
}

void FullyShardedDataParallel::update_full_parameter(
    const std::string& name, const std::function<void(at::Tensor&)>& update) {
  torch::NoGradGuard no_grad;
  for (Unit& unit : units_) {
    const auto found = std::find(unit.param_names.begin(), unit.param_names.end(), name);
    if (found == unit.param_names.end()) {
      continue;
    }
    const auto index = static_cast<size_t>(found - unit.param_names.begin());
    free(unit); // the shard changes: a gathered copy would be stale
    at::Tensor values = at::empty({unit.layout.padded_numel()}, unit.shard.options());
    group_->all_gather(values, unit.shard);
    at::Tensor value = values.narrow(0, unit.layout.offset(index), unit.params[index].numel())
                           .view(unit.params[index].sizes());
    update(value);
    const at::Tensor flat = value.reshape({-1});
    for (size_t p = 0; p < unit.pieces.size(); ++p) {
      const ShardPiece& piece = unit.pieces[p];
      if (piece.tensor_index == index) {
        unit.piece_params[p].copy_(flat.narrow(0, piece.tensor_offset, piece.numel));
      }
    }
    return;
  }
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.key() == name) { // frozen: whole on every rank
      at::Tensor value = item.value();
      update(value);
      return;
    }
  }
  throw Error(fmt::format(
      "FullyShardedDataParallel::update_full_parameter: the model has no parameter {}", name));
}

PieceOwnership FullyShardedDataParallel::piece_ownership() const {
  PieceOwnership ownership;
  ownership.rank = group_->rank();
  ownership.world_size = group_->world_size();
  ownership.group_names = optimizer_group_names_;
  for (const Unit& unit : units_) {
    for (const ShardPiece& piece : unit.pieces) {
      ownership.ranges[unit.param_names[piece.tensor_index]] = {piece.tensor_offset, piece.numel};
    }
  }
  return ownership;
}

std::vector<std::pair<std::string, at::Tensor>> FullyShardedDataParallel::full_state_on_rank(
    int root) {
  const bool keep = group_->rank() == root;
  auto to_cpu = [](const at::Tensor& tensor) {
    return tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  };
  const auto sharded = copy_units(keep, to_cpu);
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> state;
  if (!keep) {
    return state;
  }
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    auto found = sharded.find(item.key());
    state.emplace_back(item.key(), found != sharded.end() ? found->second : to_cpu(item.value()));
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    state.emplace_back(item.key(), to_cpu(item.value()));
  }
  return state;
}

void FullyShardedDataParallel::load_full_state(
    const std::unordered_map<std::string, at::Tensor>& state) {
  auto value_of = [&](const std::string& name) -> const at::Tensor& {
    auto found = state.find(name);
    if (found == state.end()) {
      throw Error(fmt::format(
          "FullyShardedDataParallel::load_full_state: the state has no entry for {}", name));
    }
    return found->second;
  };
  torch::NoGradGuard no_grad;
  std::unordered_set<std::string> sharded;
  for (Unit& unit : units_) {
    free(unit); // the shard changes: a gathered copy would be stale
    for (size_t p = 0; p < unit.pieces.size(); ++p) {
      const ShardPiece& piece = unit.pieces[p];
      const std::string& name = unit.param_names[piece.tensor_index];
      unit.piece_params[p].copy_(
          value_of(name).reshape({-1}).narrow(0, piece.tensor_offset, piece.numel));
    }
    sharded.insert(unit.param_names.begin(), unit.param_names.end());
  }
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (sharded.count(item.key()) == 0) { // frozen: kept whole on every rank
      item.value().copy_(value_of(item.key()));
    }
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    item.value().copy_(value_of(item.key()));
  }
}

int64_t FullyShardedDataParallel::shard_bytes() const {
  int64_t bytes = 0;
  for (const Unit& unit : units_) {
    bytes += unit.shard.nbytes();
  }
  return bytes;
}

} // namespace largo::parallel
