// Evaluation-only runs (TEST_ONLY, `largo eval`): the newest checkpoint of CHECKPOINT.DIR is
// evaluated on DATA.TEST without training, and the run directory keeps every checkpoint.
#include <largo/core/error.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "train/trainer_test_util.h"

#include <gtest/gtest.h>

#include <set>

namespace largo::train {
namespace {

namespace fs = std::filesystem;

// The names and sizes of a directory's files (checkpoints, links), to see nothing changed.
std::set<std::pair<std::string, uintmax_t>> checkpoint_files(const fs::path& dir) {
  std::set<std::pair<std::string, uintmax_t>> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 6 && name.substr(name.size() - 6) == ".torch") {
      files.insert({name, fs::file_size(entry.path())});
    }
  }
  return files;
}

TEST(TrainerEvaluationTest, TestOnlyEvaluatesTheNewestCheckpointAndWritesNoCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / "largo_trainer_evaluation_test";
  fs::remove_all(dir);
  const std::vector<std::string> job{
      "OPTIMIZER.num_epochs=1", "DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=32"};
  const TrainSummary trained =
      Trainer(trainer_options_from_config(synthetic_job_config(dir, job))).run();
  ASSERT_TRUE(trained.final_top1.has_value());
  const auto before = checkpoint_files(dir);
  const size_t metrics_lines = read_metrics(dir / "metrics.jsonl").size();

  std::vector<std::string> evaluation = job;
  evaluation.push_back("TEST_ONLY=True");
  const TrainSummary evaluated =
      Trainer(trainer_options_from_config(synthetic_job_config(dir, evaluation))).run();
  EXPECT_TRUE(evaluated.resumed);
  EXPECT_TRUE(evaluated.iteration_losses.empty()) << "nothing is trained";
  EXPECT_EQ(evaluated.iterations, trained.iterations);
  ASSERT_TRUE(evaluated.final_top1.has_value());
  EXPECT_EQ(*evaluated.final_top1, *trained.final_top1) << "the same model on the same test split";
  EXPECT_EQ(checkpoint_files(dir), before);
  const auto metrics = read_metrics(dir / "metrics.jsonl");
  ASSERT_EQ(metrics.size(), metrics_lines + 1);
  EXPECT_EQ(metrics.back()["phase"], "test");

  // Nothing to evaluate: a clear error, not an evaluation of random weights.
  const fs::path empty = dir / "empty";
  try {
    Trainer(trainer_options_from_config(synthetic_job_config(empty, evaluation))).run();
    ADD_FAILURE() << "TEST_ONLY without a checkpoint was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no checkpoint"), std::string::npos) << e.what();
  }
  // TEST_ONLY evaluates DATA.TEST: TEST_MODEL off contradicts it.
  evaluation.push_back("TEST_MODEL=False");
  EXPECT_THROW(
      Trainer(trainer_options_from_config(synthetic_job_config(dir, evaluation))), ConfigError);
  fs::remove_all(dir);
}

} // namespace
} // namespace largo::train
