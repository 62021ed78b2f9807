// A VISSL config with the RegNet trunk trains: MODEL.TRUNK {NAME: regnet, REGNET: {name:
// regnet_y_400mf}} on small images, with activation checkpointing cutting between RegNet
// blocks changing no loss; and MODEL.WEIGHTS_INIT loads torchvision's RegNet state dict
// through the config's name mapping.
#include <largo/core/config.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "test_paths.h"
#include "train/trainer_test_util.h"

#include <gtest/gtest.h>

#include <cmath>

namespace largo::train::trainer_regnet_test {
namespace {

namespace fs = std::filesystem;

fs::path test_dir(const std::string& name) {
  return fs::temp_directory_path() / ("largo_trainer_regnet_" + name);
}

// VISSL's layout, as a user writes it: 48 synthetic 3x32x32 images, batch 16, one epoch.
// REGNET_MAP stands for MODEL.TRUNK.REGNET.
const std::string kVisslRegNetConfig = R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {NUM_SAMPLES: 48, IMAGE_SHAPE: [3, 32, 32]}
      BATCHSIZE_PER_REPLICA: 16
      TRANSFORMS: [{name: ToTensor}]
    TEST:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {NUM_SAMPLES: 16, IMAGE_SHAPE: [3, 32, 32]}
      TRANSFORMS: [{name: ToTensor}]
  MODEL:
    TRUNK:
      NAME: regnet
      REGNET: REGNET_MAP
  OPTIMIZER:
    num_epochs: 1
    param_schedulers: {lr: {name: constant, value: 0.05}}
  MACHINE: {DEVICE: cpu, NUM_THREADS: 1}
  TEST_MODEL: False
)";

TrainSummary run_regnet(
    const fs::path& dir, const std::string& regnet_map, const std::vector<std::string>& overrides) {
  fs::remove_all(dir);
  std::string yaml = kVisslRegNetConfig;
  yaml.replace(yaml.find("REGNET_MAP"), 10, regnet_map);
  Config config = Config::load({}, {});
  config.merge_yaml(yaml, "the test's VISSL config");
  for (const std::string& assignment : overrides) {
    config.apply_override(assignment);
  }
  config.apply_override("CHECKPOINT.DIR=" + dir.string());
  TrainSummary summary = Trainer(trainer_options_from_config(config)).run();
  fs::remove_all(dir);
  return summary;
}

TEST(TrainerRegNetTest, VisslRegNetConfigTrainsAndCheckpointingBetweenBlocksChangesNoLoss) {
  const std::string preset = "{name: regnet_y_400mf}";
  const TrainSummary plain = run_regnet(test_dir("plain"), preset, {});
  ASSERT_EQ(plain.iteration_losses.size(), 3u);
  for (float loss : plain.iteration_losses) {
    EXPECT_TRUE(std::isfinite(loss));
  }
  // regnet_y_400mf has 16 blocks: 18 trunk blocks, cut into 4 checkpointed segments.
  const TrainSummary checkpointed = run_regnet(
      test_dir("checkpointed"),
      preset,
      {"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
       "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=4"});
  EXPECT_EQ(checkpointed.iteration_losses, plain.iteration_losses);
  // VISSL's checkpoint groups (SEER's stage_checkpoints) cut it where they end instead.
  const TrainSummary grouped = run_regnet(
      test_dir("grouped"),
      "{name: regnet_y_400mf, stage_checkpoints: [[1], [1], [2, 4], []]}",
      {"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True"});
  EXPECT_EQ(grouped.iteration_losses, plain.iteration_losses);
}

// torchvision's state dict of the small RegNetY of tests/checkpoint/baselines (written by
// tests/reference/gen_regnet_baselines.py) initializes the same explicit RegNet: every
// torchvision name maps onto the model, or the run would stop listing the mismatches.
TEST(TrainerRegNetTest, TorchvisionWeightsInitializeAnExplicitRegNet) {
  const std::string weights = std::string(largo::test_paths::data_dir()) +
                              "/checkpoint/baselines/torchvision_regnet_small.pth";
  const TrainSummary summary = run_regnet(
      test_dir("weights_init"),
      "{depth: 6, w_0: 8, w_a: 8, w_m: 2, group_width: 4, stem_width: 8}",
      {"MODEL.WEIGHTS_INIT.PARAMS_FILE=" + weights, "MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME=\"\""});
  EXPECT_EQ(summary.iteration_losses.size(), 3u);
}

} // namespace
} // namespace largo::train::trainer_regnet_test
