// Evaluation-only runs (TEST_ONLY, `largo eval`): the newest checkpoint of CHECKPOINT.DIR is
// evaluated on DATA.TEST without training, and the run directory keeps every checkpoint.
// Training runs keep the best model so far in model_best.torch.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/error.h>
#include <largo/train/run_plan.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>

namespace largo::train::trainer_evaluation_test {
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

// A checkpoint written mid-epoch by one process evaluates on two ranks (training could not
// resume it there): an evaluation reads the model alone. Both ranks report the figures of the
// whole test split, those of the one-process evaluation of the same checkpoint.
TEST(TrainerEvaluationTest, AMidEpochCheckpointEvaluatesAtAnotherWorldSize) {
  const fs::path dir = test_dir_for("evaluation");
  const std::vector<std::string> evaluation{"TEST_ONLY=True"};
  largo::testing::run_on_ranks(2, [&](comm::ProcessGroup& group) {
    std::optional<double> one_process;
    if (group.rank() == 0) {
      fs::remove_all(dir);
      auto options = trainer_options_from_config(
          synthetic_job_config(dir, {"CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2"}));
      options.stop_after_iterations = 3; // mid-epoch 1: the newest checkpoint is iteration 2
      auto single = comm::ProcessGroup::single_process();
      Trainer(options, "", single).run();
      one_process =
          Trainer(trainer_options_from_config(synthetic_job_config(dir, evaluation)), "", single)
              .run()
              .final_top1;
    }
    group.barrier();
    auto borrowed = std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
    const TrainSummary evaluated =
        Trainer(trainer_options_from_config(synthetic_job_config(dir, evaluation)), "", borrowed)
            .run();
    EXPECT_TRUE(evaluated.resumed);
    EXPECT_EQ(evaluated.iterations, 2);
    ASSERT_TRUE(evaluated.final_top1.has_value());
    if (group.rank() == 0) {
      ASSERT_TRUE(one_process.has_value());
      EXPECT_EQ(*evaluated.final_top1, *one_process);
    }
  });
}

// An evaluation reads DATA.TEST alone: the model is sized from it (DATA.TRAIN may point at
// nothing), and a head given by MODEL.HEAD.PARAMS keeps its width whatever the test split's
// class count (a 12-output model is scored on 3 classes), as a torchvision 1000-class model
// is evaluated on a 2-class folder.
TEST(TrainerEvaluationTest, AnEvaluationReadsOnlyTheTestSplitAndKeepsTheHeadsWidth) {
  const fs::path dir = test_dir_for("evaluation");
  fs::remove_all(dir);
  const std::vector<std::string> model{
      "MODEL.TRUNK.NAME=mlp",
      "MODEL.TRUNK.MLP.HIDDEN_DIMS=[16]",
      R"(MODEL.HEAD.PARAMS=[["mlp", {"dims": [16, 12]}]])",
      "OPTIMIZER.num_epochs=1"};
  const TrainSummary trained =
      Trainer(trainer_options_from_config(synthetic_job_config(dir, model))).run();
  ASSERT_TRUE(trained.final_top1.has_value());

  std::vector<std::string> evaluation = model;
  evaluation.insert(
      evaluation.end(),
      {"TEST_ONLY=True",
       "DATA.TRAIN.DATA_SOURCES=[disk_folder]",
       "DATA.TRAIN.DATA_PATHS=[" + (dir / "no_such_folder").string() + "]",
       "DATA.TEST.SYNTHETIC.NUM_CLASSES=3"});
  const Config config = synthetic_job_config(dir, evaluation);
  const RunPlan plan = resolve_run(config);
  EXPECT_TRUE(plan.train_shape.sample_shape.empty()) << "DATA.TRAIN is not read";
  EXPECT_EQ(plan.model.num_classes, 12) << "the head's own width, not the test split's 3";
  EXPECT_EQ(plan.model.in_channels, 1);
  const TrainSummary evaluated = Trainer(trainer_options_from_config(config)).run();
  EXPECT_TRUE(evaluated.resumed);
  EXPECT_TRUE(evaluated.final_top1.has_value());

  // Training checks both splits' labels against the head: 10 classes do not fit 8 outputs.
  std::vector<std::string> narrow = model;
  narrow[2] = R"(MODEL.HEAD.PARAMS=[["mlp", {"dims": [16, 8]}]])";
  try {
    resolve_run(synthetic_job_config(dir / "narrow", narrow));
    ADD_FAILURE() << "a head narrower than the classes was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("DATA.TRAIN has 10 classes but the model's head has 8"),
        std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// The Apex ImageNet example's model_best file: after each evaluation that beats every earlier
// one, the model is written beside the checkpoints; its weights are those of that epoch's
// checkpoint, and a later, worse epoch leaves it alone.
TEST(TrainerEvaluationTest, TrainingKeepsTheBestModelBesideTheCheckpoints) {
  const fs::path dir = fs::temp_directory_path() / "largo_trainer_best_model_test";
  fs::remove_all(dir);
  const TrainSummary trained = Trainer(trainer_options_from_config(synthetic_job_config(
                                           dir, {"DATA.TEST.SYNTHETIC.NUM_SAMPLES=64"})))
                                   .run();
  ASSERT_EQ(trained.epochs_completed, 3);
  std::vector<double> top1; // per epoch
  for (const auto& record : read_metrics(dir / "metrics.jsonl")) {
    if (record["phase"] == "test") {
      top1.push_back(record["top1"].get<double>());
    }
  }
  ASSERT_EQ(top1.size(), 3u);
  const auto best = std::max_element(top1.begin(), top1.end()); // the first of equal ones
  const int64_t best_epoch = best - top1.begin();

  const checkpoint::StateDict saved = checkpoint::load_checkpoint(dir / "model_best.torch");
  EXPECT_EQ(saved.at("epoch").toInt(), best_epoch + 1) << "epochs done when it was evaluated";
  EXPECT_EQ(saved.at("best_top1").toDouble(), *best);
  EXPECT_EQ(saved.at("top1").toDouble(), *best);
  EXPECT_FALSE(saved.contains("optimizer")) << "weights only: not a checkpoint to resume";
  const std::string checkpoint_name = best_epoch == 2
                                          ? "model_final_checkpoint_phase2.torch"
                                          : fmt::format("model_phase{}.torch", best_epoch);
  const auto expected =
      checkpoint::load_checkpoint(dir / checkpoint_name).at("model").toGenericDict();
  const auto weights = saved.at("model").toGenericDict();
  ASSERT_EQ(weights.size(), expected.size());
  for (const auto& entry : expected) {
    EXPECT_TRUE(torch::equal(weights.at(entry.key()).toTensor(), entry.value().toTensor()))
        << entry.key().toStringRef();
  }
  fs::remove_all(dir);
}

} // namespace
} // namespace largo::train::trainer_evaluation_test
