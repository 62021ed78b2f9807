// End-to-end trainer tests: a short real run learns; resume is bit-exact; the run
// directory holds what the docs promise; failures stop cleanly.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/config.h>
#include <largo/core/embedded_configs.h>
#include <largo/core/error.h>
#include <largo/core/peak_flops.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "train/trainer_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace largo::train::trainer_test {
namespace {

namespace fs = std::filesystem;

const fs::path kFashionMnist = "/usr/share/datasets/fashion-mnist";

class TrainerTest : public ::testing::Test {
 public:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format(
               "largo_trainer_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }

  Config synthetic_config(const fs::path& run_dir, std::vector<std::string> extra = {}) {
    return synthetic_job_config(run_dir, std::move(extra));
  }

  fs::path dir_;
};

TEST_F(TrainerTest, ShortFashionMnistRunLearns) {
  if (!fs::exists(kFashionMnist)) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  Config config = Config::defaults();
  config.merge_yaml(embedded::default_job_yaml(), "default job");
  // In one process (no launcher variables here: the Trainer does not spawn), with the default
  // job's global batch (2 workers x 64) as one batch of 128.
  for (const auto& assignment :
       {"OPTIMIZER.num_epochs=1",
        "DATA.TRAIN.DATA_LIMIT=6000",
        "DATA.TEST.DATA_LIMIT=2000",
        "LOG_FREQUENCY=10",
        "DATA.TRAIN.BATCHSIZE_PER_REPLICA=128"}) {
    config.apply_override(assignment);
  }
  config.apply_override("CHECKPOINT.DIR=" + dir_.string());
  Trainer trainer(trainer_options_from_config(config), config.to_yaml());
  TrainSummary summary = trainer.run();
  ASSERT_EQ(summary.iteration_losses.size(), 47u); // ceil(6000 / 128)
  // Ten classes: an untrained model's loss is ~ln(10) = 2.30.
  EXPECT_GT(summary.iteration_losses.front(), 1.8f);
  float tail = 0;
  for (size_t i = summary.iteration_losses.size() - 10; i < summary.iteration_losses.size(); ++i) {
    tail += summary.iteration_losses[i] / 10;
  }
  EXPECT_LT(tail, 0.9f) << "mean loss of the last 10 iterations";
  ASSERT_TRUE(summary.final_top1.has_value());
  EXPECT_GT(*summary.final_top1, 65.0);
  EXPECT_TRUE(fs::exists(dir_ / "train_config.yaml"));
  EXPECT_TRUE(fs::exists(dir_ / "checkpoint.torch"));
}

// Uninterrupted vs interrupted + resumed, with `extra` config overrides on both.
void expect_resume_is_bit_exact(
    TrainerTest& test, const fs::path& dir, const std::vector<std::string>& extra);

TEST_F(TrainerTest, ResumeIsBitExact) {
  expect_resume_is_bit_exact(*this, dir_, {});
}

// A weight decay scheduled per step resumes bit for bit: the schedule holds no state, the
// decayed groups' value comes back from the epoch and iteration.
TEST_F(TrainerTest, WeightDecayScheduleResumeIsBitExact) {
  expect_resume_is_bit_exact(
      *this,
      dir_,
      {"OPTIMIZER.param_schedulers.weight_decay={name: cosine, start_value: 0.05, end_value: "
       "0.5, update_interval: step}"});
}

// LAMB inside LARC (clip mode, BatchNorm/bias excluded) with gradient clipping, from the
// config keys: the whole optimizer state resumes bit-exactly through the trainer.
TEST_F(TrainerTest, LarcLambWithClippingResumeIsBitExact) {
  expect_resume_is_bit_exact(
      *this,
      dir_,
      {"OPTIMIZER.name=lamb",
       "OPTIMIZER.use_larc=True",
       "OPTIMIZER.larc_config.clip=True",
       "OPTIMIZER.larc_config.trust_coefficient=0.02",
       "OPTIMIZER.larc_config.exclude_bias_and_norm=True",
       "MODEL.GRAD_CLIP.USE_GRAD_CLIP=True",
       "MODEL.GRAD_CLIP.MAX_NORM=0.5",
       "OPTIMIZER.param_schedulers.lr.start_value=0.01"});
}

void expect_resume_is_bit_exact(
    TrainerTest& test, const fs::path& dir, const std::vector<std::string>& extra) {
  // Uninterrupted: 3 epochs x 6 iterations.
  Config full = test.synthetic_config(dir / "full", extra);
  Trainer uninterrupted(trainer_options_from_config(full));
  TrainSummary reference = uninterrupted.run();
  ASSERT_EQ(reference.iteration_losses.size(), 18u);

  // Interrupted after 10 iterations (mid-epoch 2), with a checkpoint every 4 iterations:
  // the resumed run restarts from iteration 8 and must replay 8..17 exactly.
  std::vector<std::string> partial_overrides = extra;
  partial_overrides.push_back("CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=4");
  Config partial = test.synthetic_config(dir / "resumed", partial_overrides);
  auto first_options = trainer_options_from_config(partial);
  first_options.stop_after_iterations = 10;
  TrainSummary first = Trainer(first_options).run();
  ASSERT_TRUE(first.interrupted);
  for (size_t i = 0; i < first.iteration_losses.size(); ++i) {
    ASSERT_EQ(first.iteration_losses[i], reference.iteration_losses[i]) << "iteration " << i;
  }
  Trainer second(trainer_options_from_config(partial));
  TrainSummary resumed = second.run();
  ASSERT_TRUE(resumed.resumed);
  ASSERT_EQ(resumed.iteration_losses.size(), 10u);
  for (size_t i = 0; i < resumed.iteration_losses.size(); ++i) {
    // Bitwise: the same float, not merely close.
    EXPECT_EQ(resumed.iteration_losses[i], reference.iteration_losses[8 + i])
        << "iteration " << 8 + i;
  }
  auto reference_params = uninterrupted.model()->named_parameters();
  auto resumed_params = second.model()->named_parameters();
  for (const auto& item : reference_params) {
    EXPECT_TRUE(torch::equal(item.value(), resumed_params[item.key()])) << item.key();
  }
  EXPECT_EQ(resumed.final_top1, reference.final_top1);
}

TEST_F(TrainerTest, RunDirectoryHoldsConfigMetricsAndPythonReadableCheckpoint) {
  Config config = synthetic_config(dir_, {"HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=True"});
  Trainer trainer(trainer_options_from_config(config), config.to_yaml());
  trainer.run();
  Config reread = Config::load({dir_ / "train_config.yaml"});
  EXPECT_EQ(reread.get_string("MODEL.TRUNK.NAME"), "small_cnn");

  // The small CNN on 1x24x24 images, by hand: 3x3 convolutions 1->16 at 24x24, 16->32 at
  // 12x12, 32->64 at 6x6, then Linear 64*3*3 -> 10; 2 FLOPs per multiply-accumulate; training
  // = 3 x forward.
  const double forward_flops =
      2.0 * (24 * 24 * 16 * 1 * 9 + 12 * 12 * 32 * 16 * 9 + 6 * 6 * 64 * 32 * 9 + 576 * 10);
  auto events = read_metrics(dir_ / "metrics.jsonl");
  const PeakFlops cached = peak_flops(at::kCPU, at::kFloat, 1, default_peak_flops_cache());
  ASSERT_TRUE(cached.cached);
  const double peak = cached.flops_per_sec;
  int train_events = 0;
  int test_events = 0;
  for (const auto& event : events) {
    ASSERT_TRUE(event.contains("phase") && event.contains("epoch") && event.contains("iteration"));
    ASSERT_TRUE(event.contains("loss"));
    if (event["phase"] == "train") {
      ++train_events;
      EXPECT_TRUE(event.contains("lr"));
      ASSERT_TRUE(event.contains("flops_per_sec") && event.contains("images_per_sec"));
      const double images_per_sec = event["images_per_sec"].get<double>();
      EXPECT_GT(images_per_sec, 0.0);
      EXPECT_NEAR(
          event["flops_per_sec"].get<double>(),
          3 * forward_flops * images_per_sec,
          1e-12 * 3 * forward_flops * images_per_sec);
      // MFU: against the float32 peak of this one-rank run's CPU (the cache the run read; 1
      // thread, as MACHINE.NUM_THREADS set it).
      ASSERT_TRUE(event.contains("mfu"));
      EXPECT_DOUBLE_EQ(event["mfu"].get<double>(), event["flops_per_sec"].get<double>() / peak);
    } else {
      ++test_events;
      EXPECT_EQ(event["phase"], "test");
      EXPECT_TRUE(event.contains("top1") && event.contains("top5"));
    }
  }
  EXPECT_EQ(train_events, 6); // every 4 of 18 iterations, plus each epoch's last
  EXPECT_EQ(test_events, 3);
  EXPECT_FALSE(fs::is_empty(dir_ / "tb_logs"));

  auto latest = checkpoint::load_checkpoint(dir_ / "checkpoint.torch");
  EXPECT_TRUE(latest.at("complete").toBool());
  EXPECT_EQ(latest.at("iteration").toInt(), 18);
  if (fs::exists(LARGO_PYTHON)) {
    std::string command = fmt::format(
        LARGO_PYTHON " -c \"import torch; d = torch.load('{}'); "
                     "assert d['epoch'] == 3 and d['iteration'] == 18; "
                     "assert 'trunk.0.1.weight' in d['model'] or len(d['model']) > 0; "
                     "assert isinstance(d['optimizer']['state'], dict)\"",
        (dir_ / "checkpoint.torch").string());
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
  }

  // A second run with AUTO_RESUME finds the final checkpoint and trains nothing.
  Trainer again(trainer_options_from_config(config));
  TrainSummary summary = again.run();
  EXPECT_TRUE(summary.already_complete);
  EXPECT_TRUE(summary.iteration_losses.empty());
  EXPECT_EQ(summary.final_top1, trainer.run().final_top1);
}

TEST_F(TrainerTest, NonFiniteLossStopsWithoutWritingACheckpoint) {
  Config config = synthetic_config(
      dir_,
      {"OPTIMIZER.param_schedulers.lr.start_value=1e30", "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"});
  Trainer trainer(trainer_options_from_config(config));
  try {
    trainer.run();
    FAIL() << "expected a TrainingError";
  } catch (const TrainingError& e) {
    EXPECT_NE(std::string(e.what()).find("training loss is"), std::string::npos) << e.what();
  }
  // Every checkpoint written holds finite weights (the poisoned step wrote none).
  for (const auto& entry : fs::directory_iterator(dir_)) {
    if (entry.path().extension() != ".torch" || fs::is_symlink(entry.path())) {
      continue;
    }
    auto state = checkpoint::load_checkpoint(entry.path());
    for (const auto& item : state.at("model").toGenericDict()) {
      EXPECT_TRUE(torch::isfinite(item.value().toTensor()).all().item<bool>()) << entry.path();
    }
  }
}

TEST_F(TrainerTest, MissingDatasetIsAClearError) {
  Config config = Config::load(
      {},
      {"DATA.TRAIN.DATA_PATHS=[/nonexistent/fmnist]",
       "CHECKPOINT.DIR=" + dir_.string(),
       "MACHINE.DEVICE=cpu"});
  try {
    Trainer trainer(trainer_options_from_config(config));
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/fmnist"), std::string::npos) << e.what();
  }
}

TEST_F(TrainerTest, UnavailableFeaturesAreRejected) {
  for (const auto& assignment :
       {"DATA.TRAIN.USE_DEBUGGING_SAMPLER=True",
        "MODEL.TRUNK.RESNETS.STANDARDIZE_CONVOLUTIONS=True"}) {
    Config config = Config::load({}, {assignment});
    try {
      trainer_options_from_config(config);
      ADD_FAILURE() << assignment << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("not available"), std::string::npos) << e.what();
    }
  }
}

// Activation checkpointing changes no number: with the small CNN's three trunk blocks cut
// into three segments (dropout in the last block, drawn from the global generator), every
// loss equals the plain run's bit for bit; metrics.jsonl reports each window's measured peak.
TEST_F(TrainerTest, ActivationCheckpointingLeavesTheLossesUnchanged) {
  TrainSummary plain = Trainer(trainer_options_from_config(
                                   synthetic_config(dir_ / "plain", {"OPTIMIZER.num_epochs=1"})))
                           .run();
  Config config = synthetic_config(
      dir_ / "checkpointed",
      {"OPTIMIZER.num_epochs=1",
       "MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
       "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=3"});
  TrainSummary checkpointed = Trainer(trainer_options_from_config(config)).run();
  ASSERT_EQ(plain.iteration_losses.size(), 6u);
  ASSERT_EQ(checkpointed.iteration_losses.size(), plain.iteration_losses.size());
  for (size_t i = 0; i < plain.iteration_losses.size(); ++i) {
    EXPECT_EQ(checkpointed.iteration_losses[i], plain.iteration_losses[i]) << "iteration " << i;
  }
  EXPECT_EQ(checkpointed.final_top1, plain.final_top1);
  int train_events = 0;
  for (const auto& event : read_metrics(dir_ / "checkpointed" / "metrics.jsonl")) {
    if (event["phase"] == "train") {
      ++train_events;
      ASSERT_TRUE(event.contains("step_peak_bytes"));
      EXPECT_GT(event["step_peak_bytes"].get<int64_t>(), 0);
    }
  }
  EXPECT_GT(train_events, 0);
  for (const auto& event : read_metrics(dir_ / "plain" / "metrics.jsonl")) {
    EXPECT_FALSE(event.contains("step_peak_bytes"));
  }
}

TEST_F(TrainerTest, MoreCheckpointingSplitsThanTrunkBlocksIsAConfigError) {
  Config config = synthetic_config(
      dir_,
      {"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
       "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=4"});
  try {
    Trainer trainer(trainer_options_from_config(config));
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("NUM_ACTIVATION_CHECKPOINTING_SPLITS = 4"), std::string::npos)
        << e.what();
  }
}

TEST_F(TrainerTest, CorruptLatestCheckpointIsAClearError) {
  Config config = synthetic_config(dir_);
  fs::create_directories(dir_);
  std::ofstream(dir_ / "checkpoint.torch") << "garbage";
  try {
    Trainer(trainer_options_from_config(config)).run();
    FAIL() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.torch"), std::string::npos) << e.what();
  }
}

} // namespace
} // namespace largo::train::trainer_test
