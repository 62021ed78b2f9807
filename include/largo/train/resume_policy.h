// The run directory (CHECKPOINT.DIR) when a run starts: which checkpoint it resumes from,
// the protection of older checkpoints against a fresh start, and the temporaries that killed
// writes left behind. Policy (docs/checkpoints.md):
//
//   resume (CHECKPOINT.AUTO_RESUME)  checkpoint.torch when it names an intact checkpoint;
//                                    otherwise (missing, dangling, or its target damaged) the
//                                    newest intact checkpoint file, with a warning
//                                    naming both; checkpoint files but none intact: refused
//   fresh start                      refused in a directory that holds checkpoints, unless
//                                    CHECKPOINT.OVERWRITE_EXISTING, which moves them (and
//                                    metrics.jsonl) into previous_runs/<time>/ first: a fresh
//                                    start never overwrites a checkpoint
//   *.tmp.<pid>                      removed when no process has that pid
//
// "Intact" means: every zip entry passes its CRC-32 check, the file loads, it holds the
// entries a training checkpoint has with the right types (check_training_checkpoint), and
// the optimizer shard files of a ZeRO checkpoint are present and pass their CRC checks.
// Rank 0 calls these before training; no collectives.
#pragma once

#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/run_directory.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace largo::train {

// Throws CheckpointError naming `path` and the entry unless `state` has what the trainer
// reads from a training checkpoint: model (a dict of name -> tensor), optimizer (a dict),
// epoch, iteration_in_epoch, iteration, iterations_per_epoch (integers), complete (a
// boolean), rng_state (a tensor); and, when present, world_size (an integer), rng_states (a
// tensor), top1 / top5 / best_top1 (a number or None).
void check_training_checkpoint(
    const checkpoint::StateDict& state, const std::filesystem::path& path);

// The checkpoint files in `run_dir` (*.torch except checkpoint.torch, model_best.torch, ZeRO
// shard files and temporaries), newest first by modification time: what a run may resume from.
std::vector<std::filesystem::path> checkpoint_files(const std::filesystem::path& run_dir);

// Loads `path` and checks it is intact (see above). Throws CheckpointError saying why not.
checkpoint::StateDict load_intact_checkpoint(const std::filesystem::path& path);

struct ResumeChoice {
  std::filesystem::path path;  // the checkpoint to resume from
  checkpoint::StateDict state; // already loaded and checked
  std::string warning;         // set when it is not what checkpoint.torch names
};

// What a resuming run in `run_dir` continues from (policy above); nullopt when the directory
// holds no checkpoint (a first run). Throws CheckpointError listing every checkpoint file and
// why it was refused when none is intact, and when checkpoint.torch is a directory (the run
// could not write its link).
std::optional<ResumeChoice> choose_resume_checkpoint(const std::filesystem::path& run_dir);

// Before a fresh start in `run_dir`: nothing to do when it holds no checkpoint files. With
// checkpoints: throws CheckpointError saying how to proceed (resume, another CHECKPOINT.DIR,
// or CHECKPOINT.OVERWRITE_EXISTING) unless `overwrite_existing`; with it, moves the
// checkpoints, their shards and manifests, checkpoint.torch and metrics.jsonl into
// run_dir/previous_runs/<UTC time>/ and returns that directory.
std::optional<std::filesystem::path>
prepare_fresh_start(const std::filesystem::path& run_dir, bool overwrite_existing);

// Removes the temporaries of atomic writes (core/atomic_file.h: "<file>.tmp.<pid>") whose
// writer is no longer running (no process has that pid on this machine), and a leftover
// "checkpoint.torch.tmp" link; returns what it removed. Call before the run writes anything
// (a run directory is used by one job at a time).
std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& run_dir);

} // namespace largo::train
