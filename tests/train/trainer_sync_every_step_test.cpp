// MACHINE.SYNC_EVERY_STEP (TrainStepOptions::sync_every_step): a run that leaves each step's
// loss and inf/NaN flag on the device and reads them when it logs or saves trains bit for bit
// like the run that reads them every step (losses, logged means, parameters; one rank and
// DDP over two); a diverged run stops at the read naming the first bad iteration, as the
// synced run names it, and writes no checkpoint after it; the key resolves as documented and
// is refused with float16's loss scaling.
#include <largo/core/error.h>
#include <largo/train/run_plan.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

#include <regex>

namespace largo::train::trainer_sync_every_step_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

const Overrides kSynced = {"MACHINE.SYNC_EVERY_STEP=True"};
const Overrides kUnsynced = {"MACHINE.SYNC_EVERY_STEP=False"};

fs::path test_dir() {
  return test_dir_for("sync_every_step");
}

// The "loss" of every train line of a run's metrics.jsonl.
std::vector<double> logged_losses(const fs::path& run_dir) {
  std::vector<double> losses;
  for (const auto& event : read_metrics(run_dir / "metrics.jsonl")) {
    if (event.value("phase", "") == "train") {
      losses.push_back(event.at("loss").get<double>());
    }
  }
  return losses;
}

// `group`: null for one process of its own; rank 0 writes the records.
void expect_same_runs(
    const fs::path& dir,
    const Overrides& job,
    const std::shared_ptr<comm::ProcessGroup>& group,
    const std::string& what) {
  const RunResult synced = train_run(dir / "synced", job + kSynced, group);
  const RunResult unsynced = train_run(dir / "unsynced", job + kUnsynced, group);
  expect_same_training(unsynced, synced, /*tolerance=*/0.0, what);
  if (group == nullptr || group->rank() == 0) {
    const std::vector<double> logged = logged_losses(dir / "synced");
    EXPECT_FALSE(logged.empty()) << what;
    EXPECT_EQ(logged_losses(dir / "unsynced"), logged) << what;
  }
}

TEST(TrainerSyncEveryStepTest, TrainsBitForBitLikeTheRunThatSyncsEveryStep) {
  const fs::path dir = test_dir();
  fs::remove_all(dir);
  // 18 steps read at the log lines (every 4th) and the epochs' ends; then 3 micro-steps a
  // step (each step reads 3 losses) with mid-epoch checkpoints every 5 iterations.
  expect_same_runs(dir / "plain", {}, nullptr, "one rank");
  expect_same_runs(
      dir / "accumulation",
      {"DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
       "TRAINER.GRADIENT_ACCUMULATION_STEPS=3",
       "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=5"},
      nullptr,
      "one rank, accumulation 3");
  fs::remove_all(dir);
}

TEST(TrainerSyncEveryStepTest, DdpTrainsAndResumesBitForBitLikeTheRunThatSyncsEveryStep) {
  const fs::path dir = test_dir();
  if (largo::testing::is_parent()) {
    fs::remove_all(dir);
  }
  run_on_ranks(2, [&](comm::ProcessGroup& group) { // the flags agreed over the ranks
    const Overrides job = {"OPTIMIZER.num_epochs=1"};
    expect_same_runs(dir / "ddp", job, borrow(group), "DDP over 2 ranks");
    // Interrupted after 10 steps (its unread steps read as it stops), resumed from 8.
    expect_mid_epoch_resume_bit_exact(dir / "resume", kUnsynced, group);
  });
  fs::remove_all(dir);
}

// The TrainingError of a run that diverges.
std::string divergence_of(const fs::path& run_dir, const Overrides& overrides) {
  fs::remove_all(run_dir);
  try {
    train_run(run_dir, overrides, nullptr);
  } catch (const TrainingError& error) {
    return error.what();
  }
  return "(no error)";
}

// The global iteration a divergence message names as the bad step's.
std::string bad_iteration_in(const std::string& message) {
  std::smatch match;
  return std::regex_search(message, match, std::regex(R"(\(global iteration (\d+))"))
             ? match[1].str()
             : "(none in: " + message + ")";
}

TEST(TrainerSyncEveryStepTest, ADivergedRunStopsAtTheReadNamingTheFirstBadIteration) {
  const fs::path dir = test_dir();
  // A learning rate of 1e30 makes the second step's loss inf or NaN; the unsynced run reads
  // it at iteration 3 (a mid-epoch checkpoint's), which it must not write.
  const Overrides diverging = {
      "OPTIMIZER.param_schedulers.lr.start_value=1e30",
      "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
      "LOG_FREQUENCY=100"};
  const std::string synced = divergence_of(dir / "synced", diverging + kSynced);
  const std::string unsynced = divergence_of(dir / "unsynced", diverging + kUnsynced);
  EXPECT_NE(synced.find("training loss is"), std::string::npos) << synced;
  EXPECT_NE(unsynced.find("training loss is"), std::string::npos) << unsynced;
  EXPECT_EQ(bad_iteration_in(unsynced), bad_iteration_in(synced)) << synced << "\n" << unsynced;
  EXPECT_EQ(synced.find("read at global iteration"), std::string::npos) << synced;
  EXPECT_NE(unsynced.find("read at global iteration 3"), std::string::npos) << unsynced;
  EXPECT_NE(unsynced.find("MACHINE.SYNC_EVERY_STEP"), std::string::npos) << unsynced;
  for (const auto& entry : fs::directory_iterator(dir / "unsynced")) {
    if (entry.path().extension() != ".torch" || fs::is_symlink(entry.path())) {
      continue;
    }
    ADD_FAILURE() << "the diverged run wrote " << entry.path();
  }
  fs::remove_all(dir);
}

std::string config_error_of(const std::function<void()>& resolve) {
  try {
    resolve();
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(TrainerSyncEveryStepTest, TheKeyResolvesAsDocumentedAndIsRefusedWithLossScaling) {
  const fs::path dir = test_dir();
  auto plan_with = [&](const Overrides& overrides) {
    return resolve_run(synthetic_job_config(dir, overrides));
  };
  EXPECT_TRUE(plan_with({"MACHINE.SYNC_EVERY_STEP=auto"}).sync_every_step); // the CPU: on
  EXPECT_TRUE(plan_with(kSynced).sync_every_step);
  EXPECT_FALSE(plan_with(kUnsynced).sync_every_step);
  EXPECT_NE(plan_with(kUnsynced).describe().find("no host sync per step"), std::string::npos);
  const std::string bad_value = config_error_of([&] {
    trainer_options_from_config(synthetic_job_config(dir, {"MACHINE.SYNC_EVERY_STEP=often"}));
  });
  EXPECT_NE(bad_value.find("MACHINE.SYNC_EVERY_STEP"), std::string::npos) << bad_value;
  EXPECT_NE(bad_value.find("auto, True or False"), std::string::npos) << bad_value;
  const Overrides float16 = {
      "MODEL.AMP_PARAMS.USE_AMP=True",
      "MODEL.AMP_PARAMS.DTYPE=float16",
      "MODEL.AMP_PARAMS.AMP_ARGS={opt_level: O1}"};
  EXPECT_TRUE(plan_with(float16).sync_every_step); // auto: the scaler decides on the host
  const std::string refused = config_error_of([&] { plan_with(float16 + kUnsynced); });
  EXPECT_NE(refused.find("MACHINE.SYNC_EVERY_STEP"), std::string::npos) << refused;
  EXPECT_NE(refused.find("loss scaling"), std::string::npos) << refused;
}

} // namespace
} // namespace largo::train::trainer_sync_every_step_test
