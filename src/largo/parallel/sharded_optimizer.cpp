#include <largo/parallel/sharded_optimizer.h>

#include <largo/core/error.h>
#include <largo/optim/grad_clipping.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <map>
#include <unordered_map>

namespace largo::parallel {
namespace {

using c10::IValue;
using c10::impl::GenericDict;

GenericDict make_string_dict() {
  return GenericDict(c10::StringType::get(), c10::AnyType::get());
}

const IValue& entry(const GenericDict& dict, const std::string& key, const std::string& where) {
  auto it = dict.find(key);
  if (it == dict.end()) {
    throw CheckpointError(fmt::format(
        "sharded optimizer state: {} has no '{}'; the checkpoint was not written by Largo's "
        "ZeRO optimizer or is damaged",
        where, key));
  }
  return it->value();
}

// {param_name: [offset in the flattened parameter, numel]} of a shard's state.
std::map<std::string, std::pair<int64_t, int64_t>> pieces_of(const GenericDict& shard,
                                                              const std::string& where) {
  std::map<std::string, std::pair<int64_t, int64_t>> pieces;
  for (const auto& item : entry(shard, "pieces", where).toGenericDict()) {
    auto range = item.value().toIntVector();
    pieces[item.key().toStringRef()] = {range.at(0), range.at(1)};
  }
  return pieces;
}

// A state entry that is a per-parameter scalar (AdamW's "step") rather than one value per
// element: 0-dim tensors.
bool is_scalar_entry(const at::Tensor& tensor) {
  return tensor.dim() == 0;
}

} // namespace

ShardedOptimizer::ShardedOptimizer(std::vector<optim::ParamGroup> param_groups,
                                   std::shared_ptr<comm::ProcessGroup> group,
                                   ShardedOptimizerOptions options)
    : optim::Optimizer(std::move(param_groups)), group_(std::move(group)) {
  if (!options.make_base_optimizer) {
    throw ConfigError("ZeRO: the sharded optimizer needs a base optimizer (OPTIMIZER.base_optimizer)");
  }
  TORCH_CHECK(group_ != nullptr, "ShardedOptimizer needs a process group");
  const int rank = group_->rank();
  const int world_size = group_->world_size();

  // Parameters grouped by (dtype, device) into flat buffers, in group order.
  std::map<std::pair<at::ScalarType, std::string>, size_t> buffer_of;
  std::unordered_map<std::string, std::pair<size_t, size_t>> where; // name -> (buffer, index)
  for (const optim::ParamGroup& param_group : optim::Optimizer::param_groups()) {
    for (size_t i = 0; i < param_group.params.size(); ++i) {
      const at::Tensor& param = param_group.params[i];
      auto key = std::make_pair(param.scalar_type(), param.device().str());
      auto [it, inserted] = buffer_of.emplace(key, buffers_.size());
      if (inserted) {
        buffers_.emplace_back();
      }
      FlatBuffer& buffer = buffers_[it->second];
      where[param_group.names[i]] = {it->second, buffer.tensors.size()};
      buffer.names.push_back(param_group.names[i]);
      buffer.tensors.push_back(param);
    }
  }
  torch::NoGradGuard no_grad;
  for (FlatBuffer& buffer : buffers_) {
    std::vector<int64_t> numels;
    for (const at::Tensor& tensor : buffer.tensors) {
      numels.push_back(tensor.numel());
    }
    buffer.layout = FlatLayout(numels, world_size);
    buffer.params = at::zeros({buffer.layout.padded_numel()}, buffer.tensors.front().options());
    for (size_t i = 0; i < buffer.tensors.size(); ++i) {
      at::Tensor& tensor = buffer.tensors[i];
      at::Tensor view =
          buffer.params.narrow(0, buffer.layout.offset(i), tensor.numel()).view(tensor.sizes());
      view.copy_(tensor);
      tensor.set_data(view);
    }
    buffer.pieces = buffer.layout.pieces_of_rank(rank);
    for (const ShardPiece& piece : buffer.pieces) {
      buffer.piece_params.push_back(buffer.params.narrow(0, piece.flat_offset, piece.numel));
    }
  }

  // The base optimizer's groups: the same groups over this rank's pieces.
  std::vector<optim::ParamGroup> base_groups;
  for (const optim::ParamGroup& param_group : optim::Optimizer::param_groups()) {
    optim::ParamGroup base_group;
    base_group.name = param_group.name;
    base_group.lr = param_group.lr;
    base_group.weight_decay = param_group.weight_decay;
    for (const std::string& name : param_group.names) {
      auto [b, index] = where.at(name);
      const FlatBuffer& buffer = buffers_[b];
      for (size_t p = 0; p < buffer.pieces.size(); ++p) {
        if (buffer.pieces[p].tensor_index == index) {
          base_group.params.push_back(buffer.piece_params[p]);
          base_group.names.push_back(name);
        }
      }
    }
    base_groups.push_back(std::move(base_group));
  }
  // Per-parameter norms (LARC, LAMB) from partial sums: each rank's pieces contribute to
  // their parameters' entries of one global vector, which one all-reduce completes.
  std::unordered_map<std::string, int64_t> global_index;
  for (const optim::ParamGroup& param_group : optim::Optimizer::param_groups()) {
    for (const std::string& name : param_group.names) {
      global_index.emplace(name, static_cast<int64_t>(global_index.size()));
    }
  }
  std::vector<int64_t> piece_to_param;
  for (const optim::ParamGroup& base_group : base_groups) {
    for (const std::string& name : base_group.names) {
      piece_to_param.push_back(global_index.at(name));
    }
  }
  base_ = options.make_base_optimizer(std::move(base_groups));
  base_->set_norm_reducer(make_piece_norm_reducer(
      group_, std::move(piece_to_param), static_cast<int64_t>(global_index.size())));
}

// The base optimizer passes its per-piece partials as [2 * P] (optimizer.h: P parameter
// entries, then P gradient or update entries, for its P pieces in group order). Each block
// is scattered into a [N] vector over all N parameters, one all-reduce completes both, and
// every piece reads its parameter's total back. Ranks holding no piece take part too.
optim::PartialNormReducer make_piece_norm_reducer(std::shared_ptr<comm::ProcessGroup> group,
                                                  std::vector<int64_t> piece_to_param,
                                                  int64_t num_params) {
  constexpr int64_t kBlocks = 2;
  auto index = at::tensor(piece_to_param, at::kLong);
  return [group, index, num_params](const at::Tensor& partials, optim::NormReduceOp op) {
    const int64_t num_pieces = index.numel();
    TORCH_CHECK(partials.numel() == kBlocks * num_pieces,
                "ZeRO norm reducer: expected 2 partials per piece, got ", partials.numel(),
                " for ", num_pieces, " pieces");
    at::Tensor positions = index.to(partials.device());
    at::Tensor global = at::zeros({kBlocks, num_params}, partials.options());
    at::Tensor local = partials.view({kBlocks, num_pieces});
    for (int64_t b = 0; b < kBlocks; ++b) {
      global[b].index_put_({positions}, local[b]);
    }
    group->all_reduce(global, op == optim::NormReduceOp::sum ? comm::ReduceOp::kSum
                                                             : comm::ReduceOp::kMax);
    return global.index({torch::indexing::Slice(), positions}).reshape({-1});
  };
}

void ShardedOptimizer::use_gradient_shards() {
  gradient_shards_ = true;
  for (FlatBuffer& buffer : buffers_) {
    buffer.grad_shard = at::zeros({buffer.layout.shard_numel()}, buffer.params.options());
  }
}

void ShardedOptimizer::attach_piece_gradients() {
  const int64_t rank = group_->rank();
  for (FlatBuffer& buffer : buffers_) {
    const int64_t shard_begin = rank * buffer.layout.shard_numel();
    for (size_t p = 0; p < buffer.pieces.size(); ++p) {
      const ShardPiece& piece = buffer.pieces[p];
      at::Tensor& piece_grad = buffer.piece_params[p].mutable_grad();
      if (gradient_shards_) {
        piece_grad = buffer.grad_shard.narrow(0, piece.flat_offset - shard_begin, piece.numel);
        continue;
      }
      const at::Tensor& grad = buffer.tensors[piece.tensor_index].grad();
      piece_grad = grad.defined() ? grad.reshape({-1}).narrow(0, piece.tensor_offset, piece.numel)
                                  : at::Tensor();
    }
  }
}

std::vector<at::Tensor> ShardedOptimizer::shard_gradients() {
  attach_piece_gradients();
  std::vector<at::Tensor> grads;
  for (const FlatBuffer& buffer : buffers_) {
    for (const at::Tensor& piece : buffer.piece_params) {
      if (piece.grad().defined()) {
        grads.push_back(piece.grad());
      }
    }
  }
  return grads;
}

std::vector<at::Tensor> ShardedOptimizer::shard_parameters() {
  attach_piece_gradients();
  std::vector<at::Tensor> pieces;
  for (const FlatBuffer& buffer : buffers_) {
    pieces.insert(pieces.end(), buffer.piece_params.begin(), buffer.piece_params.end());
  }
  return pieces;
}

void ShardedOptimizer::step() {
  // The schedule sets lr on this optimizer's groups; the base optimizer's groups follow.
  auto& groups = param_groups();
  auto& base_groups = base_->param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    base_groups[g].lr = groups[g].lr;
    base_groups[g].weight_decay = groups[g].weight_decay;
  }
  attach_piece_gradients();
  base_->step();
  torch::NoGradGuard no_grad;
  for (FlatBuffer& buffer : buffers_) {
    const int64_t shard = buffer.layout.shard_numel();
    // A copy of this rank's part: the all-gather writes into the buffer it would read from.
    at::Tensor own = buffer.params.narrow(0, group_->rank() * shard, shard).clone();
    group_->all_gather(buffer.params, own);
  }
}

void ShardedOptimizer::zero_grad(bool set_to_none) {
  optim::Optimizer::zero_grad(set_to_none);
  for (FlatBuffer& buffer : buffers_) {
    if (buffer.grad_shard.defined()) {
      buffer.grad_shard.zero_();
    }
  }
}

double ShardedOptimizer::clip_grad_norm(double max_norm, double norm_type) {
  std::vector<at::Tensor> pieces = shard_parameters();
  // The pieces tile the parameters, so the partial sums (or maxima) of all ranks complete
  // to the global norm.
  auto group = group_;
  return optim::clip_grad_norm(
      pieces, max_norm, norm_type, [group](const at::Tensor& partial, optim::NormReduceOp op) {
        at::Tensor total = partial.clone();
        group->all_reduce(total, op == optim::NormReduceOp::sum ? comm::ReduceOp::kSum
                                                                : comm::ReduceOp::kMax);
        return total;
      });
}

std::map<std::string, std::pair<int64_t, int64_t>> ShardedOptimizer::piece_ranges() const {
  std::map<std::string, std::pair<int64_t, int64_t>> ranges;
  for (const FlatBuffer& buffer : buffers_) {
    for (const ShardPiece& piece : buffer.pieces) {
      ranges[buffer.names[piece.tensor_index]] = {piece.tensor_offset, piece.numel};
    }
  }
  return ranges;
}

c10::IValue ShardedOptimizer::state_dict() const {
  GenericDict pieces = make_string_dict();
  for (const auto& [name, range] : piece_ranges()) {
    pieces.insert(name, c10::List<int64_t>({range.first, range.second}));
  }
  // Every group's whole parameter list (the same on every rank): consolidation restores the
  // unsharded optimizer's order from it.
  c10::impl::GenericList groups(c10::AnyType::get());
  for (const optim::ParamGroup& param_group : param_groups()) {
    groups.push_back(c10::List<std::string>(param_group.names));
  }
  GenericDict root = make_string_dict();
  root.insert("type", type());
  root.insert("rank", static_cast<int64_t>(group_->rank()));
  root.insert("world_size", static_cast<int64_t>(group_->world_size()));
  root.insert("base", base_->state_dict());
  root.insert("pieces", pieces);
  root.insert("groups", groups);
  return root;
}

void ShardedOptimizer::load_state_dict(const c10::IValue& state_dict) {
  if (!state_dict.isGenericDict()) {
    throw CheckpointError("sharded optimizer state must be a dict");
  }
  const GenericDict root = state_dict.toGenericDict();
  const std::string where = fmt::format("the shard of rank {}", group_->rank());
  const int64_t saved_world = entry(root, "world_size", where).toInt();
  const int64_t saved_rank = entry(root, "rank", where).toInt();
  if (saved_world != group_->world_size() || saved_rank != group_->rank()) {
    throw CheckpointError(fmt::format(
        "the optimizer shard was written by rank {} of {}, but this is rank {} of {}; load "
        "shards of another world size with load_resharded_state",
        saved_rank, saved_world, group_->rank(), group_->world_size()));
  }
  if (pieces_of(root, where) != piece_ranges()) {
    throw CheckpointError(fmt::format(
        "the optimizer shard of rank {} covers other parameter ranges than this rank's shard; "
        "the model or the parameter groups differ from the run that wrote it",
        group_->rank()));
  }
  base_->load_state_dict(entry(root, "base", where));
}

void ShardedOptimizer::load_resharded_state(
    int old_world_size, const std::function<c10::IValue(int old_rank)>& shards) {
  // This rank's pieces: name -> (offset in the flattened parameter, numel, options).
  struct Target {
    int64_t offset;
    int64_t numel;
    int64_t covered = 0;
    bool has_state = false;
  };
  std::map<std::string, Target> targets;
  for (const auto& [name, range] : piece_ranges()) {
    targets[name] = {range.first, range.second};
  }
  std::map<std::string, std::map<std::string, at::Tensor>> new_state;
  c10::IValue old_groups;
  std::string old_type;
  for (int old_rank = 0; old_rank < old_world_size; ++old_rank) {
    const std::string where = fmt::format("the shard of old rank {}", old_rank);
    const GenericDict shard = shards(old_rank).toGenericDict();
    const GenericDict base = entry(shard, "base", where).toGenericDict();
    if (old_rank == 0) {
      old_groups = entry(base, "param_groups", where);
      old_type = entry(base, "type", where).toStringRef();
    }
    const GenericDict old_state = entry(base, "state", where).toGenericDict();
    for (const auto& [name, range] : pieces_of(shard, where)) {
      auto target = targets.find(name);
      auto state = old_state.find(name);
      if (target == targets.end() || state == old_state.end()) {
        continue;
      }
      const auto [old_offset, old_numel] = range;
      const int64_t begin = std::max(old_offset, target->second.offset);
      const int64_t end =
          std::min(old_offset + old_numel, target->second.offset + target->second.numel);
      if (end <= begin) {
        continue;
      }
      target->second.covered += end - begin;
      target->second.has_state = true;
      for (const auto& item : state->value().toGenericDict()) {
        const std::string key = item.key().toStringRef();
        const at::Tensor old_tensor = item.value().toTensor();
        at::Tensor& tensor = new_state[name][key];
        if (is_scalar_entry(old_tensor)) {
          tensor = old_tensor.clone();
          continue;
        }
        if (!tensor.defined()) {
          tensor = at::zeros({target->second.numel}, old_tensor.options());
        }
        tensor.narrow(0, begin - target->second.offset, end - begin)
            .copy_(old_tensor.reshape({-1}).narrow(0, begin - old_offset, end - begin));
      }
    }
  }
  for (const auto& [name, target] : targets) {
    if (target.has_state && target.covered != target.numel) {
      throw CheckpointError(fmt::format(
          "resharding the optimizer state: the old shards hold {} of the {} elements this rank "
          "needs of parameter '{}'; the checkpoint's shards are incomplete or were written for "
          "a different model",
          target.covered, target.numel, name));
    }
  }
  // The base optimizer's state_dict format, with this rank's names and the old lr/decay.
  GenericDict state = make_string_dict();
  for (const auto& [name, entries] : new_state) {
    GenericDict per_param = make_string_dict();
    for (const auto& [key, tensor] : entries) {
      per_param.insert(key, tensor);
    }
    state.insert(name, per_param);
  }
  GenericDict current = base_->state_dict().toGenericDict();
  c10::impl::GenericList groups(c10::AnyType::get());
  const auto current_groups = current.at("param_groups").toList();
  const auto saved_groups = old_groups.toList();
  if (saved_groups.size() != current_groups.size()) {
    throw CheckpointError(fmt::format(
        "the checkpoint's optimizer has {} parameter groups but this optimizer has {}",
        saved_groups.size(), current_groups.size()));
  }
  for (size_t g = 0; g < current_groups.size(); ++g) {
    GenericDict group_dict = current_groups.get(g).toGenericDict().copy();
    const GenericDict saved = saved_groups.get(g).toGenericDict();
    group_dict.insert_or_assign("lr", saved.at("lr"));
    group_dict.insert_or_assign("weight_decay", saved.at("weight_decay"));
    groups.push_back(group_dict);
  }
  GenericDict root = make_string_dict();
  root.insert("state", state);
  root.insert("param_groups", groups);
  root.insert("type", old_type);
  base_->load_state_dict(root);
}

int64_t ShardedOptimizer::state_bytes() const {
  return base_->state_bytes();
}

int64_t ShardedOptimizer::parameter_bytes() const {
  int64_t bytes = 0;
  for (const FlatBuffer& buffer : buffers_) {
    bytes += buffer.params.numel() * static_cast<int64_t>(buffer.params.element_size());
  }
  return bytes;
}

int64_t ShardedOptimizer::gradient_shard_bytes() const {
  int64_t bytes = 0;
  for (const FlatBuffer& buffer : buffers_) {
    if (buffer.grad_shard.defined()) {
      bytes += buffer.grad_shard.numel() * static_cast<int64_t>(buffer.grad_shard.element_size());
    }
  }
  return bytes;
}

c10::IValue consolidate_sharded_optimizer_state(
    int world_size, const std::function<c10::IValue(int rank)>& shards,
    const std::map<std::string, std::vector<int64_t>>& param_shapes) {
  std::map<std::string, std::map<std::string, at::Tensor>> full_state;
  std::vector<std::vector<std::string>> group_names;
  c10::IValue first_groups;
  std::string base_type;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string where = fmt::format("the shard of rank {}", rank);
    const GenericDict shard = shards(rank).toGenericDict();
    const GenericDict base = entry(shard, "base", where).toGenericDict();
    if (rank == 0) {
      first_groups = entry(base, "param_groups", where);
      base_type = entry(base, "type", where).toStringRef();
      for (const auto& names : entry(shard, "groups", where).toList()) {
        std::vector<std::string> list;
        for (const auto& name : names.get().toListRef()) {
          list.push_back(name.toStringRef());
        }
        group_names.push_back(std::move(list));
      }
    }
    const GenericDict state = entry(base, "state", where).toGenericDict();
    for (const auto& [name, range] : pieces_of(shard, where)) {
      auto it = state.find(name);
      if (it == state.end()) {
        continue;
      }
      auto shape = param_shapes.find(name);
      if (shape == param_shapes.end()) {
        throw CheckpointError(fmt::format(
            "consolidating the optimizer state: parameter '{}' of {} is not in the model", name,
            where));
      }
      for (const auto& item : it->value().toGenericDict()) {
        const at::Tensor piece = item.value().toTensor();
        at::Tensor& full = full_state[name][item.key().toStringRef()];
        if (is_scalar_entry(piece)) {
          full = piece.clone();
          continue;
        }
        if (!full.defined()) {
          full = at::zeros(shape->second, piece.options());
        }
        full.view({-1}).narrow(0, range.first, range.second).copy_(piece.reshape({-1}));
      }
    }
  }
  GenericDict state = make_string_dict();
  for (const auto& [name, entries] : full_state) {
    GenericDict per_param = make_string_dict();
    for (const auto& [key, tensor] : entries) {
      per_param.insert(key, tensor);
    }
    state.insert(name, per_param);
  }
  c10::impl::GenericList groups(c10::AnyType::get());
  const auto saved_groups = first_groups.toList();
  for (size_t g = 0; g < saved_groups.size(); ++g) {
    GenericDict group_dict = saved_groups.get(g).toGenericDict().copy();
    group_dict.insert_or_assign("params", c10::List<std::string>(group_names[g]));
    groups.push_back(group_dict);
  }
  GenericDict root = make_string_dict();
  root.insert("state", state);
  root.insert("param_groups", groups);
  root.insert("type", base_type);
  return root;
}

} // namespace largo::parallel
