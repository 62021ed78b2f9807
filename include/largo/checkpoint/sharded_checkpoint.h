// ZeRO checkpoints: the optimizer state of a sharded run (stages 1-2:
// parallel/data_parallel/sharded_optimizer.h; stage 3: parallel/data_parallel/fully_sharded_data_parallel.h) is written
// by every rank as its own file beside the main checkpoint, so no rank ever gathers the
// whole state:
//
//   model_phase3.torch                  model, epoch, RNG, ... and an "optimizer" entry
//                                       {"type": "zero_sharded", "world_size": W,
//                                        "shard_files": [...], "manifest": ...}
//   model_phase3_shard0.torch ...       {"optimizer": rank r's shard (piece_optimizer_state.h),
//                                        "rank": r, "world_size": W, "checkpoint": ...}
//   model_phase3.manifest.json          the shard files, their ranks and sizes
//
// The shards are written (atomically) before the manifest and the main file, and
// checkpoint.torch moves last, so it only ever names a complete set. Loading handles every
// pairing: shards into the same world size (each rank reads its own file), into another
// world size or another ZeRO stage (resharded, reading one old shard at a time), into an
// unsharded run (consolidated), and an unsharded checkpoint into a sharded run. `largo checkpoint
// consolidate` turns a sharded checkpoint into a plain one offline (consolidate_checkpoint).
#pragma once

#include <largo/comm/process_group.h>
#include <largo/optim/optimizer.h>
#include <largo/parallel/data_parallel/piece_optimizer_state.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace largo::checkpoint {

// "model_phase3.torch", rank 1 -> "model_phase3_shard1.torch".
std::string shard_file_name(const std::string& checkpoint_file_name, int rank);
// "model_phase3.torch" -> "model_phase3.manifest.json".
std::string manifest_file_name(const std::string& checkpoint_file_name);

// Collective. Every rank writes its optimizer shard `shard_state` (piece_state_dict() of the
// optimizer that steps its pieces, ZeRO 1-3) for `checkpoint_file_name` into `dir`;
// when all succeeded, rank 0 writes the manifest. Returns (on every rank) the entry the main
// checkpoint stores under "optimizer". If any rank fails to write, every rank throws
// CheckpointError (naming the rank) and the previous checkpoint stays the latest.
c10::IValue save_optimizer_shards(const std::filesystem::path& dir,
                                  const std::string& checkpoint_file_name,
                                  const c10::IValue& shard_state,
                                  comm::ProcessGroup& group);

// Whether a checkpoint's "optimizer" entry refers to shard files.
bool is_sharded_optimizer_entry(const c10::IValue& entry);

// The unsharded optimizer state a checkpoint's "optimizer" entry holds: the entry itself,
// or a sharded entry's shards (looked up in `dir`) consolidated, which needs `param_shapes`
// (trained parameter name -> shape). Throws CheckpointError naming the file when a shard is
// missing, corrupt or from another run.
c10::IValue whole_optimizer_state(
    const std::filesystem::path& dir,
    const c10::IValue& entry,
    const std::map<std::string, std::vector<int64_t>>& param_shapes);

// The same for an optimizer `base` that steps the pieces `ownership` describes (ZeRO 1-3:
// a ShardedOptimizer's base(), FSDP's optimizer): the rank's own shard when the entry's world
// size and pieces match, otherwise resharded from every old shard (or from a plain entry).
void load_piece_optimizer_state(const std::filesystem::path& dir, const c10::IValue& entry,
                                optim::Optimizer& base, const parallel::PieceOwnership& ownership,
                                const std::map<std::string, std::vector<int64_t>>& param_shapes);

// Offline: reads the checkpoint at `checkpoint_path` (a file, or a run directory whose
// checkpoint.torch is used) and writes `output` (default: "<stem>_consolidated.torch" beside
// it) with the same entries and the optimizer state consolidated, i.e. what an unsharded run
// (or torch.load) reads. Shards are read one at a time. Returns the path written.
std::filesystem::path consolidate_checkpoint(const std::filesystem::path& checkpoint_path,
                                             std::filesystem::path output = {});

} // namespace largo::checkpoint
