// ZeRO in the trainer (Gloo over 127.0.0.1): stages 1 and 2 train like plain DDP (also
// with LARC, AdamW, accumulation, clipping and activation checkpointing); sharded
// checkpoints resume bit-exactly, at other world sizes and into unsharded runs, and
// consolidate offline into a plain checkpoint; the seed's YAML configures it verbatim.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/sharded_checkpoint.h>
#include <largo/core/error.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

namespace largo::train::trainer_zero_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

// fp32: ZeRO applies the same element-wise updates as the unsharded optimizer; only the
// order of the gradient sums (all-reduce vs reduce to the owner) and of the LARC / clipping
// norms (per-piece partials) differ, which moves the last bits.
constexpr double kTolerance = 1e-5;

const Overrides kStage1 = {"OPTIMIZER.use_zero=True"};
const Overrides kLars = {
    "OPTIMIZER.name=lars", "OPTIMIZER.eta=0.02", "OPTIMIZER.exclude_bias_and_norm=True"};
// A small reduce buffer, so buckets straddle the two ranks' shards.
const Overrides kStage2 = {
    "MODEL.SHARDED_DDP_SETUP.USE_SDP=True", "MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=3000"};

fs::path test_dir() {
  return test_dir_for("zero");
}

RunResult train(
    const fs::path& dir,
    const Overrides& overrides,
    std::shared_ptr<comm::ProcessGroup> group,
    int64_t stop_after = -1) {
  return train_run(dir, overrides, std::move(group), stop_after);
}

void expect_same_training(
    const RunResult& actual, const RunResult& expected, const std::string& what) {
  train::expect_same_training(actual, expected, kTolerance, what);
}

TEST(TrainerZeroTest, StagesOneAndTwoTrainLikeDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir(); // AUTO_RESUME off: every run starts afresh (OVERWRITE_EXISTING
                                     // moves the last one's files aside)
    const Overrides job = {
        "OPTIMIZER.num_epochs=2",
        "CHECKPOINT.AUTO_RESUME=False",
        "CHECKPOINT.OVERWRITE_EXISTING=True"};
    // Plain SGD first: clipping, AdamW and LARC do not see a gradient that is off by a
    // constant factor.
    const std::vector<std::pair<std::string, Overrides>> variants = {
        {"sgd momentum", {}},
        {"clipping", {"MODEL.GRAD_CLIP.USE_GRAD_CLIP=True", "MODEL.GRAD_CLIP.MAX_NORM=0.5"}},
        {"sgd momentum, accumulation 2", {"TRAINER.GRADIENT_ACCUMULATION_STEPS=2"}},
        {"adamw", {"OPTIMIZER.name=adamw", "OPTIMIZER.param_schedulers.lr.start_value=0.002"}},
        // VISSL's other optimizers: their state (a "step" scalar per piece, moments shaped
        // like the piece) sharded as AdamW's is.
        {"adam, L2 decay and amsgrad",
         {"OPTIMIZER.name=adam",
          "OPTIMIZER.amsgrad=True",
          "OPTIMIZER.param_schedulers.lr.start_value=0.002"}},
        {"rmsprop, centered with momentum",
         {"OPTIMIZER.name=rmsprop",
          "OPTIMIZER.centered=True",
          "OPTIMIZER.param_schedulers.lr.start_value=0.001"}},
        {"larc", {"OPTIMIZER.use_larc=True"}},
        // LARS's norms are completed across the ranks' pieces, and its exclusion is by name
        // (every piece is 1-D); eta 0.02 so that a per-piece norm would show.
        {"lars", kLars},
        {"activation checkpointing",
         {"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True"}},
    };
    for (const auto& [what, variant] : variants) {
      const RunResult ddp = train(dir / "ddp", job + variant, borrow(group));
      expect_same_training(
          train(dir / "zero1", job + variant + kStage1, borrow(group)), ddp, "stage 1, " + what);
      expect_same_training(
          train(dir / "zero2", job + variant + kStage2, borrow(group)), ddp, "stage 2, " + what);
    }
  });
}

TEST(TrainerZeroTest, ShardedCheckpointResumeIsBitExact) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    // As the DDP resume test: 6 iterations per epoch, interrupted at 10, resumed from 8.
    expect_mid_epoch_resume_bit_exact(test_dir(), kStage2, group, [](const fs::path& run) {
      // Each rank wrote its own optimizer shard; rank 0 the manifest naming both.
      EXPECT_TRUE(fs::exists(run / "model_iteration8_shard0.torch"));
      EXPECT_TRUE(fs::exists(run / "model_iteration8_shard1.torch"));
      auto manifest = nlohmann::json::parse(std::ifstream(run / "model_iteration8.manifest.json"));
      EXPECT_EQ(manifest["world_size"], 2);
      EXPECT_EQ(manifest["shards"][1]["file"], "model_iteration8_shard1.torch");
      EXPECT_EQ(
          manifest["shards"][1]["bytes"],
          static_cast<int64_t>(fs::file_size(run / "model_iteration8_shard1.torch")));
    });
  });
}

TEST(TrainerZeroTest, ShardedCheckpointsResumeAtOtherWorldSizesAndConsolidate) {
  const fs::path root = test_dir();
  // 2 epochs; checkpoint.torch is model_phase0 (the end of epoch 0), written by 2 ranks
  // with a plain optimizer state ("plain") and with ZeRO shards ("zero").
  const Overrides job = {"OPTIMIZER.num_epochs=2"};
  if (largo::testing::is_parent()) {
    fs::remove_all(root);
  }
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    train(root / "plain", job, borrow(group), /*stop_after=*/4); // 3 iterations per epoch
    train(root / "zero", job + kStage2, borrow(group), 4);
  });
  ASSERT_TRUE(fs::exists(root / "zero" / "model_phase0_shard1.torch"));

  if (largo::testing::is_parent()) {
    // One process: the shards consolidated on load, or resharded into a one-rank ZeRO run,
    // continue exactly like the plain checkpoint does.
    for (const char* copy : {"plain_at1", "zero_at1_plain", "zero_at1_zero"}) {
      copy_run(root / (std::string(copy).rfind("plain", 0) == 0 ? "plain" : "zero"), root / copy);
    }
    auto single = comm::ProcessGroup::single_process();
    const RunResult expected = train(root / "plain_at1", job, single);
    ASSERT_TRUE(expected.summary.resumed);
    expect_same_training(
        train(root / "zero_at1_plain", job, single),
        expected,
        "ZeRO shards of 2 ranks into an unsharded run");
    expect_same_training(
        train(root / "zero_at1_zero", job + kStage1, single),
        expected,
        "ZeRO shards of 2 ranks into a 1-rank ZeRO run");

    // Offline consolidation gives the plain run's optimizer state.
    const fs::path consolidated = checkpoint::consolidate_checkpoint(root / "zero");
    EXPECT_EQ(consolidated, root / "zero" / "model_phase0_consolidated.torch");
    expect_same_momentum(consolidated, root / "plain" / "model_phase0.torch", kTolerance);
    // A missing shard is named (without the consolidated copy, which the resume would fall
    // back to as the newest intact checkpoint).
    copy_run(root / "zero", root / "zero_missing");
    fs::remove(root / "zero_missing" / "model_phase0_shard1.torch");
    fs::remove(root / "zero_missing" / "model_phase0_consolidated.torch");
    try {
      train(root / "zero_missing", job, single);
      ADD_FAILURE() << "expected a CheckpointError";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("model_phase0_shard1.torch"), std::string::npos)
          << e.what();
    }
    copy_run(root / "plain", root / "plain_at3");
    copy_run(root / "zero", root / "zero_at3");
  }
  // Three ranks: the two shards resharded over three equal the plain checkpoint's run.
  run_on_ranks(3, [&](comm::ProcessGroup& group) {
    const RunResult expected = train(root / "plain_at3", job, borrow(group));
    ASSERT_TRUE(expected.summary.resumed);
    expect_same_training(
        train(root / "zero_at3", job + kStage2, borrow(group)),
        expected,
        "ZeRO shards of 2 ranks into 3");
  });
}

TEST(TrainerZeroConfigTest, TheSeedsYamlRunsVerbatim) {
  // OPTIMIZER as the VISSL ZeRO documentation writes it.
  const std::string seed = R"(
OPTIMIZER:
  name: "zero"
  use_zero: True
  base_optimizer:
    name: sgd
    use_larc: False
    larc_config:
      clip: False
      trust_coefficient: 0.001
      eps: 0.00000001
    weight_decay: 0.000001
    momentum: 0.9
    nesterov: False
)";
  Config config = synthetic_job_config(test_dir());
  config.merge_yaml(seed, "the seed");
  const TrainerOptions options = trainer_options_from_config(config);
  EXPECT_EQ(options.parallel.data_parallelism, parallel::DataParallelism::kZero1);
  EXPECT_EQ(options.optimizer.spec.name, "sgd");
  EXPECT_DOUBLE_EQ(options.optimizer.weight_decay, 1e-6);
  EXPECT_DOUBLE_EQ(options.optimizer.spec.sgd.momentum, 0.9);
  EXPECT_FALSE(options.optimizer.spec.sgd.nesterov);
  EXPECT_FALSE(options.optimizer.spec.use_larc);
  EXPECT_DOUBLE_EQ(options.optimizer.spec.larc.eps, 1e-8);

  // SDP alone implies the sharded optimizer, over OPTIMIZER's own settings.
  Config sdp = synthetic_job_config(test_dir(), {"MODEL.SHARDED_DDP_SETUP.USE_SDP=True"});
  const TrainerOptions sdp_options = trainer_options_from_config(sdp);
  EXPECT_EQ(sdp_options.parallel.data_parallelism, parallel::DataParallelism::kZero2);
  EXPECT_EQ(sdp_options.parallel.zero.reduce_buffer_bytes, (int64_t{1} << 23) * 4); // elements
}

TEST(TrainerZeroConfigTest, IncompleteOrMistypedBaseOptimizersAreClearErrors) {
  auto error_of = [](const Overrides& overrides) -> std::string {
    try {
      trainer_options_from_config(synthetic_job_config(test_dir(), overrides));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(
      error_of({"OPTIMIZER.name=zero"}).find("OPTIMIZER.base_optimizer.name"), std::string::npos);
  EXPECT_NE(
      error_of({"OPTIMIZER.name=zero", "OPTIMIZER.base_optimizer={name: sgd, momentun: 0.9}"})
          .find("OPTIMIZER.base_optimizer.momentun"),
      std::string::npos);
  EXPECT_NE(
      error_of({"OPTIMIZER.name=zero", "OPTIMIZER.base_optimizer={name: adagrad}"}).find("adagrad"),
      std::string::npos);
  EXPECT_NE(
      error_of(
          {"MODEL.SHARDED_DDP_SETUP.USE_SDP=True", "MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=0"})
          .find("reduce_buffer_size"),
      std::string::npos);
}

} // namespace
} // namespace largo::train::trainer_zero_test
