// HOOKS.EMA_MODEL in training: the average the checkpoints hold is VISSL's update replayed
// over the weights the run had after each step; its evaluation leaves the training untouched;
// a mid-epoch resume continues it bit for bit (ZeRO-2, FSDP); under FSDP the checkpoint holds
// a DDP run's average; meters without a test split are refused.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/error.h>
#include <largo/optim/model_ema.h>
#include <largo/train/run_plan.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

#include <gtest/gtest.h>

#include <map>
#include <regex>

namespace largo::train::trainer_model_ema_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

optim::NamedTensors named(const c10::impl::GenericDict& dict) {
  optim::NamedTensors tensors;
  for (const auto& entry : dict) {
    tensors.insert(entry.key().toStringRef(), entry.value().toTensor());
  }
  return tensors;
}

// Every training checkpoint of `dir` by the iteration it was written after.
std::map<int64_t, checkpoint::StateDict> checkpoints_by_iteration(const fs::path& dir) {
  std::map<int64_t, checkpoint::StateDict> found;
  const std::regex name("model_(iteration|phase|final_checkpoint_phase)[0-9]+\\.torch");
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (std::regex_match(entry.path().filename().string(), name)) {
      checkpoint::StateDict state = checkpoint::load_checkpoint(entry.path());
      found.emplace(state.at("iteration").toInt(), std::move(state));
    }
  }
  return found;
}

void expect_equal_tensors(
    const optim::NamedTensors& actual,
    const c10::impl::GenericDict& expected,
    const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (const auto& entry : expected) {
    const at::Tensor* value = actual.find(entry.key().toStringRef());
    ASSERT_NE(value, nullptr) << what << ": " << entry.key().toStringRef();
    EXPECT_TRUE(torch::equal(*value, entry.value().toTensor()))
        << what << ": " << entry.key().toStringRef();
  }
}

// 18 steps with a checkpoint after each: replaying ModelEma (bit-equal to VISSL's hook,
// optim/model_ema_test.cpp) over the weights of those checkpoints gives, after every step,
// the average that step's checkpoint holds: updated after the right steps (UPDATE_ITER 2),
// copied during the warm-up, and ahead of every other hook.
TEST(TrainerModelEmaTest, TheCheckpointedAverageIsVisslsUpdateOverTheRunsWeights) {
  const fs::path dir = test_dir_for("model_ema");
  fs::remove_all(dir);
  const Overrides job{
      "HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
      "HOOKS.EMA_MODEL.DECAY=0.7",
      "HOOKS.EMA_MODEL.WARMUP=0.2",
      "HOOKS.EMA_MODEL.UPDATE_ITER=2",
      "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"};
  train_run(dir, job, comm::ProcessGroup::single_process());
  const auto checkpoints = checkpoints_by_iteration(dir);
  ASSERT_EQ(checkpoints.size(), 18u);
  optim::ModelEmaOptions options;
  options.decay = 0.7;
  options.warmup = 0.2;
  options.update_iter = 2;
  optim::ModelEma replay(named(checkpoints.begin()->second.at("model").toGenericDict()), options);
  for (const auto& [iteration, state] : checkpoints) {
    replay.on_update(
        named(state.at("model").toGenericDict()), iteration - 1, (iteration - 1) / 18.0);
    const auto saved = state.at("ema_model").toGenericDict();
    EXPECT_EQ(saved.at("decay").toDouble(), 0.7);
    expect_equal_tensors(
        replay.averages(),
        saved.at("averages").toGenericDict(),
        "after step " + std::to_string(iteration));
  }
  fs::remove_all(dir);
}

// DECAY 0 makes the average the model itself: its evaluation ("test_ema") equals the model's;
// and putting the model's weights back after it is exact: the run trains as one without EMA.
TEST(TrainerModelEmaTest, MetersEvaluateTheAverageAndTrainingContinuesUntouched) {
  const fs::path dir = test_dir_for("model_ema");
  fs::remove_all(dir);
  auto single = comm::ProcessGroup::single_process();
  const RunResult plain = train_run(dir / "plain", {}, single);
  const RunResult with_average = train_run(
      dir / "ema", {"HOOKS.EMA_MODEL.ENABLE_EMA_METERS=True", "HOOKS.EMA_MODEL.DECAY=0.0"}, single);
  expect_same_training(with_average, plain, /*tolerance=*/0.0, "with EMA meters");
  std::map<std::string, std::vector<nlohmann::json>> by_phase;
  for (const auto& record : read_metrics(dir / "ema" / "metrics.jsonl")) {
    by_phase[record["phase"].get<std::string>()].push_back(record);
  }
  ASSERT_EQ(by_phase["test"].size(), 3u);
  ASSERT_EQ(by_phase["test_ema"].size(), 3u);
  for (size_t epoch = 0; epoch < 3; ++epoch) {
    for (const char* key : {"loss", "top1", "top5", "epoch", "iteration"}) {
      EXPECT_EQ(by_phase["test_ema"][epoch][key], by_phase["test"][epoch][key])
          << key << " of epoch " << epoch;
    }
  }
  EXPECT_FALSE(checkpoint::load_checkpoint(dir / "ema" / "checkpoint.torch").contains("ema_model"))
      << "SAVE_EMA_MODEL is off";
  fs::remove_all(dir);
}

const Overrides kSavedAverage{
    "HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
    "HOOKS.EMA_MODEL.ENABLE_EMA_METERS=True",
    "HOOKS.EMA_MODEL.DECAY=0.9",
    "HOOKS.EMA_MODEL.WARMUP=0.1"};

// ZeRO-2 and FSDP (where each rank averages its own pieces) on 2 ranks, interrupted mid-epoch
// and resumed: the losses, weights and the final checkpoint's average equal the uninterrupted
// run's bit for bit.
TEST(TrainerModelEmaTest, MidEpochResumeContinuesTheAverageBitExactly) {
  const fs::path dir = test_dir_for("model_ema");
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    for (const char* mode :
         {"MODEL.SHARDED_DDP_SETUP.USE_SDP=True", "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}) {
      expect_mid_epoch_resume_bit_exact(dir, kSavedAverage + Overrides{mode}, group);
      if (group.rank() == 0) {
        const std::string final_name = "model_final_checkpoint_phase2.torch";
        const auto full = checkpoint::load_checkpoint(dir / "full" / final_name);
        const auto resumed = checkpoint::load_checkpoint(dir / "resumed" / final_name);
        expect_equal_tensors(
            named(resumed.at("ema_model").toGenericDict().at("averages").toGenericDict()),
            full.at("ema_model").toGenericDict().at("averages").toGenericDict(),
            std::string("the average, ") + mode);
      }
      group.barrier();
    }
  });
  fs::remove_all(dir);
}

// Under FSDP the ranks average their own pieces; the checkpoint gathers them into the same
// whole tensors by the same names as a DDP run's, equal to them as FSDP's weights are to DDP's
// (1e-5: gradient sums in another order), and the average's evaluation agrees (the loss to
// 1e-4 relative through the CNN).
TEST(TrainerModelEmaTest, UnderFsdpTheCheckpointHoldsTheAverageADdpRunKeeps) {
  const fs::path dir = test_dir_for("model_ema");
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    if (group.rank() == 0) {
      fs::remove_all(dir);
    }
    group.barrier();
    const Overrides job = kSavedAverage + Overrides{"OPTIMIZER.num_epochs=2"};
    train_run(dir / "ddp", job, borrow(group));
    train_run(
        dir / "fsdp", job + Overrides{"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}, borrow(group));
    if (group.rank() == 0) {
      const std::string final_name = "model_final_checkpoint_phase1.torch";
      const auto ddp = checkpoint::load_checkpoint(dir / "ddp" / final_name)
                           .at("ema_model")
                           .toGenericDict()
                           .at("averages")
                           .toGenericDict();
      const auto fsdp = checkpoint::load_checkpoint(dir / "fsdp" / final_name)
                            .at("ema_model")
                            .toGenericDict()
                            .at("averages")
                            .toGenericDict();
      ASSERT_EQ(fsdp.size(), ddp.size());
      for (const auto& entry : ddp) {
        const std::string& name = entry.key().toStringRef();
        ASSERT_TRUE(fsdp.contains(name)) << name;
        const at::Tensor expected = entry.value().toTensor();
        const at::Tensor actual = fsdp.at(name).toTensor();
        ASSERT_EQ(actual.sizes(), expected.sizes()) << name;
        EXPECT_TRUE(torch::allclose(actual, expected, 1e-5, 1e-5)) << name;
      }
      auto last = [&](const std::string& run, const std::string& phase) {
        nlohmann::json found;
        for (const auto& record : read_metrics(dir / run / "metrics.jsonl")) {
          if (record["phase"] == phase) {
            found = record;
          }
        }
        return found.at("loss").get<double>();
      };
      const double expected_loss = last("ddp", "test_ema");
      EXPECT_NEAR(last("fsdp", "test_ema"), expected_loss, 1e-4 * expected_loss);
      // DECAY 0.9: the average is not the model, nor is its evaluation.
      EXPECT_NE(last("fsdp", "test_ema"), last("fsdp", "test"));
    }
    group.barrier();
  });
}

TEST(TrainerModelEmaTest, MetersWithoutATestSplitAreRefused) {
  const fs::path dir = test_dir_for("model_ema");
  try {
    resolve_run(
        synthetic_job_config(dir, {"HOOKS.EMA_MODEL.ENABLE_EMA_METERS=True", "TEST_MODEL=False"}));
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("but TEST_MODEL is False"), std::string::npos) << e.what();
  }
}

} // namespace
} // namespace largo::train::trainer_model_ema_test
