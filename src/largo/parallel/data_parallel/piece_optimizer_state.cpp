#include <largo/parallel/data_parallel/piece_optimizer_state.h>

#include <largo/core/error.h>
#include <largo/parallel/pipeline/pipeline_checkpoint.h>

#include <fmt/format.h>

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

// The "state" entry of an optimizer state_dict: {param_name: {key: tensor}}.
GenericDict state_entry(const std::map<std::string, std::map<std::string, at::Tensor>>& state) {
  GenericDict entry = make_string_dict();
  for (const auto& [name, tensors] : state) {
    GenericDict per_param = make_string_dict();
    for (const auto& [key, tensor] : tensors) {
      per_param.insert(key, tensor);
    }
    entry.insert(name, per_param);
  }
  return entry;
}

} // namespace

c10::IValue piece_state_dict(const optim::Optimizer& base, const PieceOwnership& ownership,
                             const std::string& type) {
  GenericDict pieces = make_string_dict();
  for (const auto& [name, range] : ownership.ranges) {
    pieces.insert(name, c10::List<int64_t>({range.first, range.second}));
  }
  // Every group's whole parameter list (the same on every rank): consolidation restores the
  // unsharded optimizer's order from it.
  c10::impl::GenericList groups(c10::AnyType::get());
  for (const std::vector<std::string>& names : ownership.group_names) {
    groups.push_back(c10::List<std::string>(names));
  }
  GenericDict root = make_string_dict();
  root.insert("type", type);
  root.insert("rank", static_cast<int64_t>(ownership.rank));
  root.insert("world_size", static_cast<int64_t>(ownership.world_size));
  root.insert("base", base.state_dict());
  root.insert("pieces", pieces);
  root.insert("groups", groups);
  return root;
}

bool has_same_pieces(const c10::IValue& shard, const PieceOwnership& ownership) {
  if (!shard.isGenericDict()) {
    return false;
  }
  const GenericDict root = shard.toGenericDict();
  const std::string where = "an optimizer shard";
  return entry(root, "rank", where).toInt() == ownership.rank &&
      entry(root, "world_size", where).toInt() == ownership.world_size &&
      pieces_of(root, where) == ownership.ranges;
}

void load_piece_state_dict(optim::Optimizer& base, const PieceOwnership& ownership,
                           const c10::IValue& state_dict) {
  if (!state_dict.isGenericDict()) {
    throw CheckpointError("sharded optimizer state must be a dict");
  }
  const GenericDict root = state_dict.toGenericDict();
  const std::string where = fmt::format("the shard of rank {}", ownership.rank);
  const int64_t saved_world = entry(root, "world_size", where).toInt();
  const int64_t saved_rank = entry(root, "rank", where).toInt();
  if (saved_world != ownership.world_size || saved_rank != ownership.rank) {
    throw CheckpointError(fmt::format(
        "the optimizer shard was written by rank {} of {}, but this is rank {} of {}; load "
        "shards of another world size with load_resharded_piece_state",
        saved_rank, saved_world, ownership.rank, ownership.world_size));
  }
  if (pieces_of(root, where) != ownership.ranges) {
    throw CheckpointError(fmt::format(
        "the optimizer shard of rank {} covers other parameter ranges than this rank's shard; "
        "the model or the parameter groups differ from the run that wrote it",
        ownership.rank));
  }
  base.load_state_dict(entry(root, "base", where));
}

void load_resharded_piece_state(optim::Optimizer& base, const PieceOwnership& ownership,
                                int old_world_size,
                                const std::function<c10::IValue(int old_rank)>& shards) {
  // This rank's pieces: name -> (offset in the flattened parameter, numel, options).
  struct Target {
    int64_t offset;
    int64_t numel;
    int64_t covered = 0;
    bool has_state = false;
  };
  std::map<std::string, Target> targets;
  for (const auto& [name, range] : ownership.ranges) {
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
  const GenericDict state = state_entry(new_state);
  GenericDict current = base.state_dict().toGenericDict();
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
  base.load_state_dict(root);
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
  const GenericDict state = state_entry(full_state);
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

IValue whole_state_as_single_shard(
    const IValue& whole, const std::map<std::string, std::vector<int64_t>>& param_shapes) {
  GenericDict pieces = make_string_dict();
  for (const auto& [name, shape] : param_shapes) {
    int64_t numel = 1;
    for (int64_t size : shape) {
      numel *= size;
    }
    pieces.insert(name, c10::List<int64_t>({0, numel}));
  }
  GenericDict shard = make_string_dict();
  shard.insert("base", whole);
  shard.insert("pieces", pieces);
  shard.insert("rank", int64_t{0});
  shard.insert("world_size", int64_t{1});
  return shard;
}

c10::IValue consolidate_on_first_rank(
    const optim::Optimizer& base,
    const PieceOwnership& ownership,
    const std::string& type,
    comm::ProcessGroup& group,
    const std::map<std::string, std::vector<int64_t>>& param_shapes) {
  const std::vector<c10::IValue> shards =
      gather_to_root(group, piece_state_dict(base, ownership, type));
  if (shards.empty()) {
    return {};
  }
  return consolidate_sharded_optimizer_state(
      group.world_size(),
      [&](int rank) { return shards[static_cast<size_t>(rank)]; },
      param_shapes);
}

} // namespace largo::parallel
