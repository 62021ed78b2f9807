// What the trainer does to the model and the loss before training, from VISSL's keys:
// MODEL.WEIGHTS_INIT (a fresh start begins from the file's weights; a resumed run does not
// read it), MODEL.SYNC_BN_CONFIG (BatchNorm2d becomes SyncBatchNorm, whose statistics the
// ranks share) and the options of LOSS.cross_entropy_multiple_output_single_target.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/error.h>
#include <largo/parallel/data_parallel/sync_batch_norm.h>
#include <largo/train/run_plan.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_test_util.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <functional>
#include <sstream>

namespace largo::train::trainer_model_setup_test {
namespace {

namespace fs = std::filesystem;

fs::path test_dir(const std::string& name) {
  return fs::temp_directory_path() / ("largo_trainer_model_setup_" + name);
}

// One epoch of one iteration (16 samples, batch 16), no evaluation: the cheapest run.
Config one_step_job(const fs::path& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides{
      "DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16", "OPTIMIZER.num_epochs=1", "TEST_MODEL=False"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return synthetic_job_config(dir, overrides);
}

TEST(TrainerModelSetupTest, WeightsInitStartsAFreshRunFromTheFileAndIsNotReadOnResume) {
  const fs::path source_dir = test_dir("weights_source");
  const fs::path run_dir = test_dir("weights_run");
  fs::remove_all(source_dir);
  fs::remove_all(run_dir);
  Trainer(trainer_options_from_config(one_step_job(source_dir))).run();
  const fs::path file = fs::canonical(source_dir / "checkpoint.torch");
  const auto saved = checkpoint::load_checkpoint(file).at("model").toGenericDict();

  // A fresh start with another seed: the model holds the file's values, not its own init.
  Trainer fresh(trainer_options_from_config(
      one_step_job(run_dir, {"SEED_VALUE=7", "MODEL.WEIGHTS_INIT.PARAMS_FILE=" + file.string()})));
  int64_t compared = 0;
  for (const auto& [name, value] : fresh.full_parameters()) {
    const at::Tensor expected = saved.at(name).toTensor();
    EXPECT_TRUE(value.equal(expected)) << name;
    ++compared;
  }
  EXPECT_GT(compared, 0);

  // A missing file is an error naming it on a fresh start...
  const std::string missing = (run_dir / "no_such_weights.torch").string();
  EXPECT_THROW(
      Trainer(trainer_options_from_config(one_step_job(
          test_dir("weights_missing"), {"MODEL.WEIGHTS_INIT.PARAMS_FILE=" + missing}))),
      Error);
  // ...and not read when the run resumes from its own checkpoint.
  EXPECT_NO_THROW(Trainer(trainer_options_from_config(
      one_step_job(source_dir, {"MODEL.WEIGHTS_INIT.PARAMS_FILE=" + missing}))));
  fs::remove_all(source_dir);
  fs::remove_all(run_dir);
  fs::remove_all(test_dir("weights_missing"));
}

// Without SyncBatchNorm two ranks reading different samples end with different running
// statistics (BROADCAST_BUFFERS off); with it they share them.
TEST(TrainerModelSetupTest, SyncBatchNormSharesTheStatisticsOfTheRanks) {
  for (const bool convert : {false, true}) {
    largo::testing::run_on_ranks(2, [convert](comm::ProcessGroup& group) {
      const fs::path dir = test_dir(fmt::format("sync_bn_{}_{}", convert, group.rank()));
      fs::remove_all(dir);
      Config config = one_step_job(
          dir,
          {"DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=32",
           "DISTRIBUTED.BROADCAST_BUFFERS=False",
           fmt::format("MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN={}", convert),
           "MODEL.SYNC_BN_CONFIG.GROUP_SIZE=0"});
      // Each rank writes its own directory: only the statistics are compared.
      Trainer trainer(
          trainer_options_from_config(config),
          "",
          std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {}));
      int64_t sync_layers = 0;
      for (const auto& module : trainer.model()->modules()) {
        sync_layers += std::dynamic_pointer_cast<parallel::SyncBatchNormImpl>(module) ? 1 : 0;
      }
      EXPECT_EQ(sync_layers > 0, convert);
      trainer.run();
      at::Tensor running_mean; // the first norm layer's
      for (const auto& buffer : trainer.model()->named_buffers()) {
        if (buffer.key().find("running_mean") != std::string::npos) {
          running_mean = buffer.value().clone();
          break;
        }
      }
      ASSERT_TRUE(running_mean.defined());
      at::Tensor rank0 = running_mean.clone();
      group.broadcast(rank0, 0);
      // Every rank learns whether all ranks hold rank 0's statistics.
      at::Tensor agreeing = at::tensor({running_mean.equal(rank0) ? 1.0 : 0.0}, at::kDouble);
      group.all_reduce(agreeing);
      EXPECT_EQ(agreeing.item<double>() == group.world_size(), convert)
          << (convert ? "SyncBatchNorm: the ranks' statistics must agree"
                      : "BatchNorm2d: the ranks saw different samples");
      group.barrier();
      fs::remove_all(dir);
    });
  }
}

// logits / temperature: a huge temperature flattens them, so the first loss is log(classes)
// to within |logit| / temperature; at temperature 1 it is not.
TEST(TrainerModelSetupTest, LossTemperatureReachesTheTrainingStep) {
  const double log_classes = std::log(10.0); // the synthetic job's 10 classes
  auto first_loss = [](const std::string& temperature) {
    const fs::path dir = test_dir("temperature_" + temperature);
    fs::remove_all(dir);
    Trainer trainer(trainer_options_from_config(one_step_job(
        dir,
        {"LOSS.name=cross_entropy_multiple_output_single_target",
         "LOSS.cross_entropy_multiple_output_single_target.temperature=" + temperature})));
    const double loss = trainer.run().iteration_losses.at(0);
    fs::remove_all(dir);
    return loss;
  };
  EXPECT_NEAR(first_loss("1.0e6"), log_classes, 1e-4);
  EXPECT_GT(std::abs(first_loss("1.0") - log_classes), 1e-3);
}

// What spdlog's default logger prints while `body` runs.
std::string log_during(const std::function<void()>& body) {
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  auto logger = spdlog::default_logger();
  logger->sinks().push_back(sink);
  try {
    body();
  } catch (...) {
    logger->sinks().pop_back();
    throw;
  }
  logger->sinks().pop_back();
  return captured.str();
}

// A user confirms from the start-up log what runs: the optimizer with its settings, whether
// LARC wraps it and whether BatchNorm became SyncBatchNorm.
TEST(TrainerModelSetupTest, TheStartUpLogNamesTheOptimizerLarcAndSyncBatchNorm) {
  const fs::path dir = test_dir("start_up_log");
  fs::remove_all(dir);
  const std::string sgd_with_larc = log_during([&] {
    Trainer trainer(trainer_options_from_config(one_step_job(
        dir,
        {"OPTIMIZER.name=sgd",
         "OPTIMIZER.momentum=0.9",
         "OPTIMIZER.use_larc=True",
         "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=True",
         "MODEL.SYNC_BN_CONFIG.GROUP_SIZE=0"})));
  });
  EXPECT_NE(
      sgd_with_larc.find("optimizer: SGD (momentum 0.9, dampening 0, nesterov false); LARC on"),
      std::string::npos)
      << sgd_with_larc;
  EXPECT_NE(
      sgd_with_larc.find("; SyncBatchNorm on, statistics over groups of 1 rank(s)"),
      std::string::npos)
      << sgd_with_larc;
  fs::remove_all(dir);
  const std::string adamw = log_during([&] {
    Trainer trainer(trainer_options_from_config(one_step_job(dir, {"OPTIMIZER.name=adamw"})));
  });
  EXPECT_NE(adamw.find("optimizer: AdamW (betas "), std::string::npos) << adamw;
  EXPECT_NE(adamw.find("; LARC off; SyncBatchNorm off"), std::string::npos) << adamw;
  fs::remove_all(dir);
}

// A library user sets TrainerOptions::parallel, the library's own ParallelOptions: the trunk's
// checkpointing cut (probed on the data's shape, which the Trainer fills in); precision and
// the inf/NaN check are the run's (TrainerOptions::amp, check_nan), refused there.
TEST(TrainerModelSetupTest, LibraryUsersSetTheParallelOptionsTheRunFillsItsOwnParts) {
  const fs::path dir = test_dir("parallel_options");
  fs::remove_all(dir);
  TrainerOptions options = trainer_options_from_config(one_step_job(dir));
  options.parallel.activation_checkpointing.sequential = "trunk";
  options.parallel.activation_checkpointing.num_splits = 2;
  const std::string log = log_during([&] { Trainer trainer(options); });
  EXPECT_NE(
      log.find("the first 1 of 2 segments checkpointed; cut to balance measured "
               "activation bytes"),
      std::string::npos)
      << log;
  auto expect_refused = [&](TrainerOptions refused, const std::string& option) {
    try {
      resolve_run(std::move(refused), RunWorld{});
      ADD_FAILURE() << "expected an OptionError naming " << option;
    } catch (const OptionError& error) {
      EXPECT_EQ(error.option(), option) << error.what();
    }
  };
  TrainerOptions precision = options;
  precision.parallel.precision.enabled = true;
  expect_refused(precision, "TrainerOptions::parallel.precision");
  TrainerOptions unchecked = options;
  unchecked.parallel.check_finite = false;
  expect_refused(unchecked, "TrainerOptions::parallel.check_finite");
  fs::remove_all(dir);
}

// `largo train` resuming a run with another optimizer than its checkpoint's: the error names
// the checkpoint file, both optimizers and the two ways on.
TEST(TrainerModelSetupTest, ResumingWithAnotherOptimizerNamesTheCheckpointFile) {
  const fs::path dir = test_dir("another_optimizer");
  fs::remove_all(dir);
  Trainer(trainer_options_from_config(one_step_job(dir, {"OPTIMIZER.name=sgd"}))).run();
  try {
    Trainer(trainer_options_from_config(
                one_step_job(dir, {"OPTIMIZER.name=adamw", "OPTIMIZER.num_epochs=2"})))
        .run();
    ADD_FAILURE() << "a resume with another optimizer was accepted";
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(
        message.find(
            (dir / "model_final_checkpoint_phase0.torch").string() + ": its optimizer state"),
        std::string::npos)
        << message;
    EXPECT_NE(message.find("'sgd' optimizer but this optimizer is 'adamw'"), std::string::npos)
        << message;
    EXPECT_NE(message.find("MODEL.WEIGHTS_INIT.PARAMS_FILE"), std::string::npos) << message;
  }
  fs::remove_all(dir);
}

} // namespace
} // namespace largo::train::trainer_model_setup_test
