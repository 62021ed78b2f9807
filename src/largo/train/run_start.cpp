#include "run_start.h"

#include <largo/core/error.h>
#include <largo/train/resume_policy.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace largo::train {
namespace fs = std::filesystem;
namespace {

void start_fresh(const fs::path& run_dir, bool overwrite_existing, comm::ProcessGroup& group) {
  if (group.rank() == 0) {
    if (auto moved = prepare_fresh_start(run_dir, overwrite_existing)) {
      spdlog::info("the checkpoints of the earlier run were moved to {}", moved->string());
    }
  }
  group.barrier();
}

void warn_on_rank_zero(const ResumeChoice& choice, const comm::ProcessGroup& group) {
  if (!choice.warning.empty() && group.rank() == 0) {
    spdlog::warn("{}", choice.warning);
  }
}

} // namespace

bool resume_or_start_fresh(
    checkpoint::TrainingState& state, const CheckpointOptions& options, comm::ProcessGroup& group) {
  if (!options.auto_resume) {
    start_fresh(options.dir, options.overwrite_existing, group);
    return false;
  }
  const std::optional<ResumeChoice> choice = choose_resume_checkpoint(options.dir);
  if (!choice) {
    return false;
  }
  warn_on_rank_zero(*choice, group);
  if (!state.load(choice->path, /*unless_final=*/options.overwrite_existing)) {
    spdlog::info(
        "{} is a final checkpoint; CHECKPOINT.OVERWRITE_EXISTING is set, so training "
        "starts again from scratch",
        fs::canonical(choice->path).string());
    start_fresh(options.dir, /*overwrite_existing=*/true, group);
    return false;
  }
  spdlog::info(
      "resuming from {} (epoch {}, iteration {} of the epoch, {} iterations in all)",
      fs::canonical(choice->path).string(),
      state.progress.epoch,
      state.progress.iteration_in_epoch,
      state.progress.iteration);
  return true;
}

bool load_for_evaluation(
    checkpoint::TrainingState& state,
    const fs::path& run_dir,
    const fs::path& weights_file,
    comm::ProcessGroup& group) {
  std::optional<ResumeChoice> choice;
  if (fs::is_directory(run_dir)) {
    choice = choose_resume_checkpoint(run_dir);
  }
  if (choice) {
    warn_on_rank_zero(*choice, group);
    state.load_for_evaluation(choice->path);
    spdlog::info(
        "evaluating {} (trained {} epochs, {} iterations)",
        fs::canonical(choice->path).string(),
        state.progress.epoch,
        state.progress.iteration);
    return true;
  }
  if (weights_file.empty()) {
    throw ConfigError(fmt::format(
        "TEST_ONLY = True evaluates a trained model, but CHECKPOINT.DIR ({}) holds no checkpoint "
        "and MODEL.WEIGHTS_INIT.PARAMS_FILE is empty; point CHECKPOINT.DIR at the run to "
        "evaluate, or PARAMS_FILE at the weights",
        run_dir.string()));
  }
  spdlog::info("evaluating the weights of {}", weights_file.string());
  return false;
}

} // namespace largo::train
