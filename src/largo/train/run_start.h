// How a run starts from its directory, by the policy of train/resume_policy.h: a training run
// resumes from the newest intact checkpoint, or starts afresh without overwriting any; an
// evaluation-only run loads what it evaluates. Private to the trainer.
#pragma once

#include <largo/checkpoint/training_state.h>
#include <largo/comm/process_group.h>
#include <largo/train/trainer_options.h>

#include <filesystem>

namespace largo::train {

// CHECKPOINT.AUTO_RESUME: loads the checkpoint to continue from into `state` and returns
// true; false for a first run, or a fresh start (CHECKPOINT.OVERWRITE_EXISTING, also after a
// final checkpoint), for which rank 0 moves the old files aside. Collective (a barrier).
bool resume_or_start_fresh(
    checkpoint::TrainingState& state, const CheckpointOptions& options, comm::ProcessGroup& group);

// TEST_ONLY: the newest intact checkpoint of `run_dir` (final ones too) is loaded into
// `state` (true); without one, the weights MODEL.WEIGHTS_INIT gave the model are evaluated
// (false), and without those a ConfigError says what to set. Nothing in the directory is
// moved or written.
bool load_for_evaluation(
    checkpoint::TrainingState& state,
    const std::filesystem::path& run_dir,
    const std::filesystem::path& weights_file,
    comm::ProcessGroup& group);

} // namespace largo::train
