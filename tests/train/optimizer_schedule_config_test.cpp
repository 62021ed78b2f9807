// OPTIMIZER's parameter-group constructor and weight-decay schedules
// (train/optimizer_schedule_config.cpp): the keys reach the options, what the dino constructor
// and the single group ignore is refused, and a run sets the scheduled weight decay on the
// decayed groups.
#include "trainer_test_util.h"

#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/models/model_factory.h>
#include <largo/optim/lr_schedule.h>
#include <largo/optim/param_groups.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace largo::train::optimizer_schedule_config_test {
namespace {

namespace fs = std::filesystem;

const std::string kSchedulers = "OPTIMIZER.param_schedulers.";

TrainerOptions options_with(const std::vector<std::string>& overrides) {
  return trainer_options_from_config(Config::load({}, overrides));
}

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    options_with(overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

// VISSL's DINO optimizer section (dino_16gpus_deits16.yaml), as written.
const std::vector<std::string> kVisslDinoOptimizer = {
    "OPTIMIZER.name=adamw",
    "OPTIMIZER.num_epochs=300",
    "OPTIMIZER.param_group_constructor=dino",
    "OPTIMIZER.regularize_bn=False",
    "OPTIMIZER.regularize_bias=False",
    kSchedulers + "weight_decay={name: cosine, start_value: 0.04, end_value: 0.4, "
                  "update_interval: epoch}"};

TEST(OptimizerScheduleConfig, VisslsDinoOptimizerKeysReachTheOptions) {
  const TrainerOptions options = options_with(kVisslDinoOptimizer);
  EXPECT_EQ(options.optimizer.param_groups.rule, optim::ParamGroupRule::kDino);
  ASSERT_TRUE(options.optimizer.weight_decay_schedule.has_value());
  const optim::ScheduleOptions& schedule = *options.optimizer.weight_decay_schedule;
  EXPECT_EQ(schedule.name, "cosine");
  EXPECT_EQ(schedule.start_value, 0.04);
  EXPECT_EQ(schedule.end_value, 0.4);
  EXPECT_EQ(schedule.update_interval, "epoch");
  EXPECT_FALSE(options.optimizer.head_weight_decay_schedule.has_value());

  const TrainerOptions plain = options_with({});
  EXPECT_EQ(plain.optimizer.param_groups.rule, optim::ParamGroupRule::kDefault);
  EXPECT_FALSE(plain.optimizer.weight_decay_schedule.has_value());
  const TrainerOptions head = options_with(
      {kSchedulers + "weight_decay_head={name: linear, start_value: 0.0, end_value: 0.1}"});
  ASSERT_TRUE(head.optimizer.head_weight_decay_schedule.has_value());
  EXPECT_EQ(head.optimizer.head_weight_decay_schedule->name, "linear");
}

TEST(OptimizerScheduleConfig, WhatTheDinoConstructorIgnoresIsRefusedNamingTheKey) {
  auto with_dino = [](const std::string& extra) {
    return std::vector<std::string>{"OPTIMIZER.param_group_constructor=dino", extra};
  };
  for (const std::string key :
       {"OPTIMIZER.regularize_bn",
        "OPTIMIZER.regularize_bias",
        "OPTIMIZER.head_optimizer_params.use_different_lr",
        "OPTIMIZER.head_optimizer_params.use_different_wd"}) {
    const std::string message = error_of(with_dino(key + "=True"));
    EXPECT_NE(message.find("config key " + key + " = True"), std::string::npos) << message;
    EXPECT_NE(message.find("param_group_constructor dino"), std::string::npos) << message;
  }
  std::string message = error_of(with_dino("OPTIMIZER.non_regularized_parameters=[pos_embed]"));
  EXPECT_NE(message.find("OPTIMIZER.non_regularized_parameters"), std::string::npos) << message;
  message = error_of(with_dino(kSchedulers + "weight_decay_head={name: constant, value: 0.1}"));
  EXPECT_NE(message.find("weight_decay_head"), std::string::npos) << message;
  // Another constructor of VISSL's stays unavailable, named as such.
  message = error_of({"OPTIMIZER.param_group_constructor=layer_decay"});
  EXPECT_NE(message.find("other than default and dino"), std::string::npos) << message;
}

// VISSL's linear-evaluation and SEER configs that ask for one group write regularize_bn
// False and regularize_bias True beside it (VISSL's defaults, which decide nothing then);
// SEER's regnet10B.yaml over swav_8node_resnet.yaml has regularize_bn True, which says what the
// one group does (BatchNorm decayed).
TEST(OptimizerScheduleConfig, TheSingleGroupKeyReachesTheOptionsAndRefusesWhatItIgnores) {
  const std::string single = "OPTIMIZER.construct_single_param_group_only=True";
  const TrainerOptions options =
      options_with({single, "OPTIMIZER.regularize_bn=False", "OPTIMIZER.regularize_bias=True"});
  EXPECT_EQ(options.optimizer.param_groups.rule, optim::ParamGroupRule::kSingle);
  EXPECT_EQ(
      options_with({single, "OPTIMIZER.regularize_bn=True"}).optimizer.param_groups.rule,
      optim::ParamGroupRule::kSingle);
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"OPTIMIZER.regularize_bias", "False"},
           {"OPTIMIZER.head_optimizer_params.use_different_lr", "True"},
           {"OPTIMIZER.head_optimizer_params.use_different_wd", "True"}}) {
    const std::string message = error_of({single, key + "=" + value});
    EXPECT_NE(message.find("config key " + key + " = " + value), std::string::npos) << message;
    EXPECT_NE(message.find("construct_single_param_group_only"), std::string::npos) << message;
  }
  std::string message = error_of({single, "OPTIMIZER.non_regularized_parameters=[bias]"});
  EXPECT_NE(message.find("OPTIMIZER.non_regularized_parameters"), std::string::npos) << message;
  message = error_of({single, kSchedulers + "weight_decay_head={name: constant, value: 0.1}"});
  EXPECT_NE(message.find("weight_decay_head"), std::string::npos) << message;
  message = error_of({single, "OPTIMIZER.param_group_constructor=dino"});
  EXPECT_NE(
      message.find("config key OPTIMIZER.construct_single_param_group_only = True"),
      std::string::npos)
      << message;
}

TEST(OptimizerScheduleConfig, BadWeightDecaySchedulesNameTheirKey) {
  std::string message = error_of({kSchedulers + "weight_decay={name: cosin, start_value: 0.1}"});
  EXPECT_NE(
      message.find("OPTIMIZER.param_schedulers.weight_decay.name = 'cosin'"), std::string::npos)
      << message;
  message = error_of({kSchedulers + "weight_decay={name: cosine, start_valu: 0.1}"});
  EXPECT_NE(message.find("weight_decay.start_valu"), std::string::npos) << message;
  message =
      error_of({kSchedulers + "weight_decay={name: constant, value: 0.1, auto_lr_scaling: {}}"});
  EXPECT_NE(message.find("weight_decay.auto_lr_scaling"), std::string::npos) << message;
}

// Largo's ViT and DINO head keep VISSL's module names, so VISSL's rule (".bias" or "norm" in
// the name: not decayed) leaves out exactly the biases and the LayerNorms, as in VISSL; the
// class token, the positions and the weight-normalised last layer are decayed.
TEST(OptimizerScheduleConfig, DinoGroupsOfAVitAndDinoHeadAreVisslsSplit) {
  TrainerOptions options = options_with(
      {"LOSS.name=dino_loss",
       "MODEL.TRUNK.NAME=vision_transformer",
       "MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE=8",
       "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=1",
       "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=2",
       "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=8",
       "MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=16",
       "MODEL.TRUNK.VISION_TRANSFORMERS.QKV_BIAS=True",
       "MODEL.HEAD.PARAMS=[[dino_head, {in_dim: 8, num_clusters: [6], hidden_dim: 8, "
       "bottleneck_dim: 4, normalize_last_layer: false}]]",
       "OPTIMIZER.param_group_constructor=dino"});
  options.model.in_channels = 3;
  options.model.image_size = 16;
  const models::RunModel model = models::build_run_model(options.model);
  const auto groups = optim::build_param_groups(*model.module(), options.optimizer.param_groups);
  ASSERT_EQ(groups.size(), 2u);
  for (const std::string& name : groups[0].names) { // decayed
    EXPECT_FALSE(name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) << name;
    EXPECT_EQ(name.find("norm"), std::string::npos) << name;
  }
  for (const std::string& name : groups[1].names) { // not decayed
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    EXPECT_TRUE(bias || name.find(".norm") != std::string::npos) << name;
  }
  auto in = [](const std::vector<std::string>& names, const std::string& suffix) {
    for (const std::string& name : names) {
      if (name.size() >= suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return true;
      }
    }
    return false;
  };
  for (const char* decayed :
       {"class_token",
        "pos_embedding",
        "qkv.weight",
        "fc1.weight",
        "prototypes0.weight_g",
        "prototypes0.weight_v"}) {
    EXPECT_TRUE(in(groups[0].names, decayed)) << decayed;
  }
  for (const char* not_decayed : {"norm1.weight", "norm2.weight", "norm.weight", "qkv.bias"}) {
    EXPECT_TRUE(in(groups[1].names, not_decayed)) << not_decayed;
  }
}

class OptimizerScheduleRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_dir_for("weight_decay_schedule");
    fs::remove_all(dir_);
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

// Every train line of a 3-epoch run carries the cosine's value at its epoch (update_interval
// epoch: where = epoch / 3), computed by the same library schedule the test checks elsewhere
// against ClassyVision; and a constant schedule trains bit for bit as the constant weight decay.
TEST_F(OptimizerScheduleRunTest, TheScheduleSetsTheWeightDecayOfEachEpoch) {
  auto losses = [&](const std::string& name, const std::vector<std::string>& extra) {
    return Trainer(trainer_options_from_config(synthetic_job_config(dir_ / name, extra)))
        .run()
        .iteration_losses;
  };
  const std::string cosine =
      kSchedulers + "weight_decay={name: cosine, start_value: 0.04, end_value: 0.4}";
  const auto scheduled = losses("cosine", {cosine, "OPTIMIZER.weight_decay=0.5"});
  int train_lines = 0;
  for (const auto& event : read_metrics(dir_ / "cosine" / "metrics.jsonl")) {
    if (event["phase"] != "train") {
      continue;
    }
    ++train_lines;
    const double where = event["epoch"].get<double>() / 3.0;
    const double expected = 0.4 + (0.04 - 0.4) * (1.0 + std::cos(M_PI * where)) / 2.0;
    EXPECT_NEAR(event["weight_decay"].get<double>(), expected, 1e-15) << event.dump();
  }
  EXPECT_GE(train_lines, 3);
  // The schedule reaches the step: the losses differ from those of the constant 0.5 it
  // replaces (the first, before any step, is the same).
  const auto unscheduled = losses("unscheduled", {"OPTIMIZER.weight_decay=0.5"});
  ASSERT_EQ(scheduled.size(), unscheduled.size());
  EXPECT_EQ(scheduled.front(), unscheduled.front());
  EXPECT_NE(scheduled.back(), unscheduled.back());

  // As in VISSL, the schedule sets the trunk's decayed group and leaves the head's at
  // OPTIMIZER.weight_decay (1e-4 here): the same run as a head with a decay of its own.
  const auto constant =
      losses("constant", {kSchedulers + "weight_decay={name: constant, value: 0.3}"});
  const auto plain = losses(
      "plain",
      {"OPTIMIZER.weight_decay=0.3",
       "OPTIMIZER.head_optimizer_params.use_different_wd=True",
       "OPTIMIZER.head_optimizer_params.weight_decay=0.0001"});
  auto expect_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i], b[i]) << "iteration " << i;
    }
  };
  expect_equal(constant, plain);
  // weight_decay_head sets the head's decayed group.
  const auto head_scheduled = losses(
      "head_scheduled",
      {kSchedulers + "weight_decay={name: constant, value: 0.3}",
       kSchedulers + "weight_decay_head={name: constant, value: 0.2}"});
  const auto head_plain = losses(
      "head_plain",
      {"OPTIMIZER.weight_decay=0.3",
       "OPTIMIZER.head_optimizer_params.use_different_wd=True",
       "OPTIMIZER.head_optimizer_params.weight_decay=0.2"});
  expect_equal(head_scheduled, head_plain);
}

// construct_single_param_group_only decays every parameter, the small CNN's BatchNorm
// included, with OPTIMIZER.weight_decay or its schedule: bit for bit the run whose default
// groups decay everything alike (the update is per parameter, whatever the grouping), and not
// the default run, which leaves the BatchNorm undecayed.
TEST_F(OptimizerScheduleRunTest, TheSingleGroupDecaysEveryParameter) {
  auto losses = [&](const std::string& name, const std::vector<std::string>& extra) {
    return Trainer(trainer_options_from_config(synthetic_job_config(dir_ / name, extra)))
        .run()
        .iteration_losses;
  };
  const std::string single = "OPTIMIZER.construct_single_param_group_only=True";
  const auto one_group = losses("single", {single, "OPTIMIZER.weight_decay=0.3"});
  const auto all_decayed = losses(
      "all_decayed",
      {"OPTIMIZER.weight_decay=0.3",
       "OPTIMIZER.regularize_bn=True",
       "OPTIMIZER.regularize_bias=True"});
  const auto bn_undecayed = losses("default", {"OPTIMIZER.weight_decay=0.3"});
  ASSERT_EQ(one_group.size(), all_decayed.size());
  for (size_t i = 0; i < one_group.size(); ++i) {
    EXPECT_EQ(one_group[i], all_decayed[i]) << "iteration " << i;
  }
  ASSERT_EQ(one_group.size(), bn_undecayed.size());
  EXPECT_NE(one_group.back(), bn_undecayed.back());
  // The weight_decay schedule reaches the one group.
  const auto scheduled =
      losses("scheduled", {single, kSchedulers + "weight_decay={name: constant, value: 0.3}"});
  ASSERT_EQ(scheduled.size(), one_group.size());
  for (size_t i = 0; i < scheduled.size(); ++i) {
    EXPECT_EQ(scheduled[i], one_group[i]) << "iteration " << i;
  }
}

} // namespace
} // namespace largo::train::optimizer_schedule_config_test
