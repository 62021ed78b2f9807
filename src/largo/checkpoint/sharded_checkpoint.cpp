#include <largo/checkpoint/sharded_checkpoint.h>

#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/atomic_file.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace largo::checkpoint {
namespace fs = std::filesystem;
namespace {

constexpr const char* kShardedType = "zero_sharded";

std::string stem_of(const std::string& checkpoint_file_name) {
  return fs::path(checkpoint_file_name).stem().string();
}

struct ShardedEntry {
  int world_size = 0;
  std::vector<std::string> shard_files;
};

ShardedEntry parse_entry(const c10::IValue& entry) {
  const auto dict = entry.toGenericDict();
  const std::string where = "the checkpoint's sharded optimizer entry";
  ShardedEntry parsed;
  parsed.world_size = static_cast<int>(checkpoint::state_at(dict, "world_size", where).toInt());
  for (const auto& file : checkpoint::state_at(dict, "shard_files", where).toListRef()) {
    parsed.shard_files.push_back(file.toStringRef());
  }
  if (static_cast<int>(parsed.shard_files.size()) != parsed.world_size) {
    throw CheckpointError(fmt::format("{} lists {} shard files for a world of {} ranks", where,
                                      parsed.shard_files.size(), parsed.world_size));
  }
  return parsed;
}

// Reads old rank r's optimizer shard, checking it belongs to this set.
c10::IValue read_shard(const fs::path& dir, const ShardedEntry& entry, int rank) {
  const fs::path path = dir / entry.shard_files.at(static_cast<size_t>(rank));
  if (!fs::exists(path)) {
    throw CheckpointError(fmt::format(
        "optimizer shard {} of rank {} is missing; a ZeRO checkpoint needs all {} shard files "
        "beside it (see the .manifest.json); restore the file or resume from another checkpoint",
        path.string(), rank, entry.world_size));
  }
  auto shard = checkpoint::load_checkpoint(path, {"optimizer", "rank", "world_size"});
  const int64_t saved_rank = checkpoint::state_at(shard, "rank", path.string()).toInt();
  const int64_t saved_world = checkpoint::state_at(shard, "world_size", path.string()).toInt();
  if (saved_rank != rank || saved_world != entry.world_size) {
    throw CheckpointError(fmt::format(
        "{} holds the optimizer shard of rank {} of {} but the checkpoint expects rank {} of {}",
        path.string(), saved_rank, saved_world, rank, entry.world_size));
  }
  return checkpoint::state_at(shard, "optimizer", path.string());
}

} // namespace

std::string shard_file_name(const std::string& checkpoint_file_name, int rank) {
  return fmt::format("{}_shard{}.torch", stem_of(checkpoint_file_name), rank);
}

std::string manifest_file_name(const std::string& checkpoint_file_name) {
  return stem_of(checkpoint_file_name) + ".manifest.json";
}

c10::IValue save_optimizer_shards(const fs::path& dir, const std::string& checkpoint_file_name,
                                  const c10::IValue& shard_state,
                                  comm::ProcessGroup& group) {
  const int rank = group.rank();
  const int world_size = group.world_size();
  const fs::path own_path = dir / shard_file_name(checkpoint_file_name, rank);
  std::string own_error;
  int64_t own_bytes = 0;
  try {
    fs::create_directories(dir); // rank 0 made it at setup; another node may not see it yet
    auto shard = checkpoint::make_state_dict();
    shard.insert("optimizer", shard_state);
    shard.insert("rank", static_cast<int64_t>(rank));
    shard.insert("world_size", static_cast<int64_t>(world_size));
    shard.insert("checkpoint", checkpoint_file_name);
    checkpoint::save_checkpoint(own_path, shard);
    own_bytes = static_cast<int64_t>(fs::file_size(own_path));
  } catch (const std::exception& error) {
    own_error = error.what();
  }
  // Every rank learns which ranks failed and every shard's size (one all-gather), so all
  // of them stop together instead of some waiting in the next collective.
  at::Tensor own = at::tensor({own_error.empty() ? int64_t{0} : int64_t{1}, own_bytes}, at::kLong);
  at::Tensor all = at::empty({world_size, 2}, at::kLong);
  group.all_gather(all, own);
  for (int r = 0; r < world_size; ++r) {
    if (all[r][0].item<int64_t>() != 0) {
      throw CheckpointError(fmt::format(
          "rank {} could not write its optimizer shard of {}{}; the previous checkpoint is still "
          "the latest (checkpoint.torch was not moved)",
          r, checkpoint_file_name, r == rank ? ": " + own_error : ""));
    }
  }
  c10::List<std::string> files;
  nlohmann::json manifest = {{"format", "largo-zero-optimizer-shards-1"},
                             {"checkpoint", checkpoint_file_name},
                             {"world_size", world_size},
                             {"shards", nlohmann::json::array()}};
  for (int r = 0; r < world_size; ++r) {
    files.push_back(shard_file_name(checkpoint_file_name, r));
    manifest["shards"].push_back(
        {{"rank", r}, {"file", files.get(r)}, {"bytes", all[r][1].item<int64_t>()}});
  }
  if (rank == 0) {
    write_file_atomically(dir / manifest_file_name(checkpoint_file_name), manifest.dump(2) + "\n");
  }
  auto entry = checkpoint::make_state_dict();
  entry.insert("type", std::string(kShardedType));
  entry.insert("world_size", static_cast<int64_t>(world_size));
  entry.insert("shard_files", files);
  entry.insert("manifest", manifest_file_name(checkpoint_file_name));
  return entry;
}

bool is_sharded_optimizer_entry(const c10::IValue& entry) {
  if (!entry.isGenericDict()) {
    return false;
  }
  const auto dict = entry.toGenericDict();
  auto type = dict.find("type");
  return type != dict.end() && type->value().isString() &&
      type->value().toStringRef() == kShardedType;
}

c10::IValue whole_optimizer_state(
    const fs::path& dir,
    const c10::IValue& entry,
    const std::map<std::string, std::vector<int64_t>>& param_shapes) {
  if (!is_sharded_optimizer_entry(entry)) {
    return entry;
  }
  const ShardedEntry parsed = parse_entry(entry);
  return parallel::consolidate_sharded_optimizer_state(
      parsed.world_size,
      [&](int old_rank) { return read_shard(dir, parsed, old_rank); },
      param_shapes);
}

void load_piece_optimizer_state(const fs::path& dir, const c10::IValue& entry,
                                optim::Optimizer& base, const parallel::PieceOwnership& ownership,
                                const std::map<std::string, std::vector<int64_t>>& param_shapes) {
  if (!is_sharded_optimizer_entry(entry)) {
    parallel::load_resharded_piece_state(
        base, ownership, 1,
        [&](int) { return parallel::whole_state_as_single_shard(entry, param_shapes); });
    return;
  }
  const ShardedEntry parsed = parse_entry(entry);
  auto shard_of = [&](int old_rank) { return read_shard(dir, parsed, old_rank); };
  if (parsed.world_size == ownership.world_size) {
    // Usually this rank's own shard; another ZeRO stage's shard of the same rank covers other
    // pieces (stages 1-2 lay out the whole model, stage 3 each unit) and is resharded.
    const c10::IValue own = shard_of(ownership.rank);
    if (parallel::has_same_pieces(own, ownership)) {
      parallel::load_piece_state_dict(base, ownership, own);
      return;
    }
  }
  parallel::load_resharded_piece_state(base, ownership, parsed.world_size, shard_of);
}

fs::path consolidate_checkpoint(const fs::path& checkpoint_path, fs::path output) {
  fs::path source = fs::is_directory(checkpoint_path) ? checkpoint_path / "checkpoint.torch"
                                                      : checkpoint_path;
  if (!fs::exists(source)) {
    throw CheckpointError(fmt::format("{} does not exist; give a checkpoint file or a run "
                                      "directory holding checkpoint.torch",
                                      source.string()));
  }
  source = fs::canonical(source); // follow checkpoint.torch to the file it names
  auto state = checkpoint::load_checkpoint(source, {"model", "optimizer"});
  const c10::IValue& optimizer_entry = checkpoint::state_at(state, "optimizer", source.string());
  if (!is_sharded_optimizer_entry(optimizer_entry)) {
    throw CheckpointError(fmt::format(
        "{} is not a ZeRO checkpoint (its optimizer state is not sharded); it needs no "
        "consolidation",
        source.string()));
  }
  // The parameters' shapes come from the model entry (every parameter and buffer by name).
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : checkpoint::state_at(state, "model", source.string()).toGenericDict()) {
    if (item.value().isTensor()) {
      shapes[item.key().toStringRef()] = item.value().toTensor().sizes().vec();
    }
  }
  const ShardedEntry parsed = parse_entry(optimizer_entry);
  const fs::path dir = source.parent_path();
  state.insert_or_assign("optimizer", parallel::consolidate_sharded_optimizer_state(
                                          parsed.world_size,
                                          [&](int rank) { return read_shard(dir, parsed, rank); },
                                          shapes));
  if (output.empty()) {
    output = dir / (source.stem().string() + "_consolidated.torch");
  }
  checkpoint::save_checkpoint(output, state);
  return output;
}

} // namespace largo::checkpoint
