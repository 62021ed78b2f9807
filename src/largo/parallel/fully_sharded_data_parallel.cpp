#include <largo/parallel/fully_sharded_data_parallel.h>

#include <largo/core/error.h>
#include <largo/core/torch_compat.h>
#include <largo/parallel/distributed_data_parallel.h>
#include <largo/parallel/grad_ready_hooks.h>
#include <largo/parallel/sharded_optimizer.h>

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

} // namespace

std::vector<FsdpUnitPlan> plan_fsdp_units(const models::TrunkHeadModel& model,
                                           const FullyShardedDataParallelOptions& options) {
  // With compute copies, the parameters of the modules kept in float32 go to a unit of
  // their own, whatever block they are in.
  std::unordered_set<std::string> float32_names;
  if (options.compute_dtype && options.keeps_fp32) {
    for (const auto& item : model->named_modules()) {
      if (!options.keeps_fp32(*item.value())) {
        continue;
      }
      for (const auto& param : item.value()->named_parameters(/*recurse=*/false)) {
        float32_names.insert(item.key().empty() ? param.key() : item.key() + "." + param.key());
      }
    }
  }
  std::vector<FsdpUnitPlan> units;
  std::vector<std::string> unit_prefixes;
  for (int64_t b = 0; b < model->num_trunk_blocks(); ++b) {
    const std::string prefix = fmt::format("trunk.{}.", b);
    int64_t numel = 0;
    bool trainable = false;
    for (const auto& item : model->trunk_block(b)->named_parameters()) {
      if (item.value().requires_grad() && float32_names.count(prefix + item.key()) == 0) {
        numel += item.value().numel();
        trainable = true;
      }
    }
    if (trainable && numel >= options.auto_wrap_threshold) {
      units.emplace_back();
      units.back().name = fmt::format("trunk.{}", b);
      units.back().block = b;
      unit_prefixes.push_back(prefix);
    }
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
  units.erase(std::remove_if(units.begin() + static_cast<std::ptrdiff_t>(root), units.end(),
                             [](const FsdpUnitPlan& unit) { return unit.params.empty(); }),
              units.end());
  return units;
}

struct FullyShardedDataParallel::Hooks {
  std::unique_ptr<GradReadyHooks> grad_ready;
};

FullyShardedDataParallel::FullyShardedDataParallel(
    models::TrunkHeadModel model,
    std::shared_ptr<comm::ProcessGroup> group,
    FullyShardedDataParallelOptions options)
    : model_(std::move(model)),
      group_(std::move(group)),
      options_(options),
      hooks_(std::make_unique<Hooks>()) {
  if (!group_) {
    throw ConfigError("FullyShardedDataParallel needs a process group (got none)");
  }
  if (options_.auto_wrap_threshold < 0) {
    throw ConfigError(fmt::format(
        "MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD must be >= 0 (0 wraps every trunk block that "
        "has parameters), got {}",
        options_.auto_wrap_threshold));
  }
  if (options_.compute_dtype && !options_.fp32_reduce_scatter &&
      *options_.compute_dtype == at::kBFloat16 && group_->world_size() > 1 &&
      group_->backend() == "gloo" &&
      !compat::kGlooReducesBFloat16) {
    throw ConfigError(fmt::format(
        "FSDP with bfloat16 compute copies reduces bfloat16 gradients, which the Gloo backend "
        "of this libtorch ({}) cannot; set MODEL.FSDP_CONFIG.fp32_reduce_scatter True (the "
        "gradients are then reduced in float32)",
        TORCH_VERSION));
  }

  const int rank = group_->rank();
  const int world_size = group_->world_size();
  torch::NoGradGuard no_grad;

  // Every rank starts from rank 0's model.
  std::vector<at::Tensor> state = model_->parameters();
  buffers_ = model_->buffers();
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  broadcast_coalesced(*group_, state, 0);

  // Units: trunk blocks with enough trainable parameter elements, then the root (and the
  // float32 unit).
  const int64_t num_blocks = model_->num_trunk_blocks();
  unit_of_block_.assign(static_cast<size_t>(num_blocks), -1);
  position_of_block_.assign(static_cast<size_t>(num_blocks), 0);
  std::vector<at::ScalarType> gathered_dtypes;
  for (FsdpUnitPlan& plan : plan_fsdp_units(model_, options_)) {
    if (plan.block >= 0) {
      unit_of_block_[static_cast<size_t>(plan.block)] = static_cast<int64_t>(units_.size());
      position_of_block_[static_cast<size_t>(plan.block)] = block_units_.size();
      block_units_.push_back(units_.size());
    }
    gathered_dtypes.push_back(plan.gathered_dtype);
    units_.emplace_back();
    units_.back().name = std::move(plan.name);
    units_.back().block = plan.block;
    units_.back().param_names = std::move(plan.param_names);
    units_.back().params = std::move(plan.params);
  }
  if (options_.compute_dtype) {
    std::unordered_set<const c10::TensorImpl*> sharded;
    for (const Unit& unit : units_) {
      for (const at::Tensor& param : unit.params) {
        sharded.insert(param.unsafeGetTensorImpl());
      }
    }
    for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
      if (sharded.count(item.value().unsafeGetTensorImpl()) == 0 &&
          item.value().is_floating_point() &&
          item.value().scalar_type() != *options_.compute_dtype) {
        throw Error(fmt::format(
            "FullyShardedDataParallel with {} compute copies: the frozen parameter {} is not "
            "sharded and stays {}, which would meet {} inputs; make it trainable or cast it",
            c10::toString(*options_.compute_dtype), item.key(),
            c10::toString(item.value().scalar_type()), c10::toString(*options_.compute_dtype)));
      }
    }
  }

  // Each unit's parameters become views of its full flat buffer (of the compute dtype); this
  // rank keeps its slice of the parameters' own values (the float32 masters).
  std::vector<at::Tensor> hooked;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    const at::Tensor& first = unit.params.front();
    std::vector<int64_t> numels;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const at::Tensor& param = unit.params[i];
      if (!param.is_floating_point() || param.scalar_type() != first.scalar_type() ||
          param.device() != first.device()) {
        throw Error(fmt::format(
            "FullyShardedDataParallel: the parameters of unit {} must be floating point and "
            "share one dtype and device; {} is {} on {} but {} is {} on {}",
            unit.name,
            unit.param_names[i],
            c10::toString(param.scalar_type()),
            param.device().str(),
            unit.param_names.front(),
            c10::toString(first.scalar_type()),
            first.device().str()));
      }
      numels.push_back(param.numel());
    }
    unit.layout = FlatLayout(numels, world_size);
    at::Tensor values =
        at::zeros({unit.layout.padded_numel()}, first.options().requires_grad(false));
    for (size_t i = 0; i < unit.params.size(); ++i) {
      values.narrow(0, unit.layout.offset(i), unit.params[i].numel())
          .view(unit.params[i].sizes())
          .copy_(unit.params[i]);
    }
    const int64_t shard_numel = unit.layout.shard_numel();
    unit.shard = values.narrow(0, rank * shard_numel, shard_numel).clone();
    unit.full = values.to(gathered_dtypes[u]); // `values` itself without compute copies
    for (size_t i = 0; i < unit.params.size(); ++i) {
      at::Tensor& param = unit.params[i];
      param.set_data(
          unit.full.narrow(0, unit.layout.offset(i), param.numel()).view(param.sizes()));
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

  hooks_->grad_ready = std::make_unique<GradReadyHooks>(
      hooked, [this](size_t index) { on_gradient_ready(index); }, [this] { on_backward_end(); });
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

at::Tensor FullyShardedDataParallel::forward(const at::Tensor& images, const TrunkForward& trunk) {
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
    if (unit.block < 0) {
      // Kept through the backward: the head's parameters are needed at its very start, the
      // float32 unit's throughout.
      gather(unit);
    }
  }
  TrunkBlockRunner run_blocks = [this](const at::Tensor& x, int64_t begin, int64_t end) {
    return forward_blocks(x, begin, end);
  };
  const at::Tensor input = options_.compute_dtype && images.is_floating_point()
      ? images.to(*options_.compute_dtype)
      : images;
  at::Tensor features =
      trunk ? trunk(input, run_blocks) : forward_blocks(input, 0, model_->num_trunk_blocks());
  at::Tensor output = model_->forward_head(features);
  if (!output.requires_grad()) {
    // No backward will follow (inference, or nothing trainable in use).
    for (Unit& unit : units_) {
      free(unit);
    }
  }
  return output;
}

at::Tensor FullyShardedDataParallel::forward_blocks(const at::Tensor& input, int64_t begin,
                                                    int64_t end) {
  // Prefetch stays within [begin, end): an activation-checkpointed segment calls this once in
  // the forward and once more in its recompute, and a unit outside the segment gathered then
  // would only wait, gathered, for its own turn.
  at::Tensor x = input;
  for (int64_t b = begin; b < end; ++b) {
    const int64_t u = unit_of_block_[static_cast<size_t>(b)];
    if (u < 0) {
      x = model_->forward_trunk_range(x, b, b + 1);
      continue;
    }
    Unit& unit = units_[static_cast<size_t>(u)];
    const size_t position = position_of_block_[static_cast<size_t>(b)];
    gather(unit);
    if (options_.prefetch && position + 1 < block_units_.size() &&
        units_[block_units_[position + 1]].block < end) {
      start_gather(units_[block_units_[position + 1]]);
    }
    x = model_->forward_trunk_range(x, b, b + 1);
    if (x.requires_grad()) {
      // The gradient of the unit's output arrives before the unit's own backward runs; the
      // block before it runs next in the backward.
      // (The hook takes a TensorBase: libtorch 2.x hands it one, 1.13 a Tensor.)
      x.register_hook([this, u, position, begin](const at::TensorBase&) {
        Unit& hooked = units_[static_cast<size_t>(u)];
        hooked.used_in_backward = true;
        gather(hooked);
        if (options_.prefetch && position > 0 &&
            units_[block_units_[position - 1]].block >= begin) {
          start_gather(units_[block_units_[position - 1]]);
        }
      });
    }
    if (options_.reshard_after_forward) {
      free(unit);
    }
  }
  return x;
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
        make_base) {
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
  optimizer->set_norm_reducer(make_piece_norm_reducer(
      group_, std::move(piece_to_param), static_cast<int64_t>(global_index.size())));
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
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    auto found = values.find(item.key());
    if (found != values.end()) {
      ordered.emplace_back(item.key(), found->second);
    }
  }
  return ordered;
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
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    auto found = sharded.find(item.key());
    state.emplace_back(item.key(), found != sharded.end() ? found->second : to_cpu(item.value()));
  }
  for (const auto& item : model_->named_buffers(/*recurse=*/true)) {
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
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (sharded.count(item.key()) == 0) { // frozen: kept whole on every rank
      item.value().copy_(value_of(item.key()));
    }
  }
  for (const auto& item : model_->named_buffers(/*recurse=*/true)) {
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
