// The YAML -> options mapping (train/trainer_config.h): keys reach the options they name and
// change what is built; the settings the trainer is to wire (SyncBN, EMA, weights init,
// loss options) are read and checked.
#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/models/model_factory.h>
#include <largo/train/trainer_config.h>
#include <largo/train/unavailable_keys.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::train::trainer_config_mapping_test {
namespace {

TrainerOptions options_with(const std::vector<std::string>& overrides) {
  return trainer_options_from_config(Config::load({}, overrides));
}

TEST(TrainerConfigMappingTest, RunKeysReachTheTrainerOptions) {
  TrainerOptions options = options_with(
      {"LOG_FREQUENCY=3",
       "TEST_MODEL=False",
       "TEST_EVERY_NUM_EPOCH=2",
       "SEED_VALUE=9",
       "CHECKPOINT.DIR=/tmp/x",
       "CHECKPOINT.AUTO_RESUME=False",
       "CHECKPOINT.CHECKPOINT_FREQUENCY=4",
       "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=50",
       "CHECKPOINT.OVERWRITE_EXISTING=True",
       "MACHINE.DEVICE=cpu",
       "MACHINE.NUM_THREADS=1", // at most the cores (the default is 0: every core)
       "METERS.accuracy_list_meter.topk_values=[1, 3]",
       "HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
       "HOOKS.EMA_MODEL.EMA_DEVICE=cpu",
       "HOOKS.EMA_MODEL.DECAY=0.5"});
  EXPECT_EQ(options.log_frequency, 3);
  EXPECT_FALSE(options.test_model);
  EXPECT_EQ(options.test_every_num_epoch, 2);
  EXPECT_EQ(options.seed, 9u);
  EXPECT_EQ(options.checkpoint.dir, "/tmp/x");
  EXPECT_FALSE(options.checkpoint.auto_resume);
  EXPECT_EQ(options.checkpoint.frequency_epochs, 4);
  EXPECT_EQ(options.checkpoint.frequency_iterations, 50);
  EXPECT_TRUE(options.checkpoint.overwrite_existing);
  EXPECT_EQ(options.device, "cpu");
  EXPECT_EQ(options.num_threads, 1);
  EXPECT_EQ(options.topk_values, (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(options.model_ema.enabled());
  EXPECT_EQ(options.model_ema.average.device, c10::Device(c10::kCPU));
  EXPECT_EQ(options.model_ema.average.decay, 0.5);
  EXPECT_FALSE(options_with({}).model_ema.average.device.has_value()) << "gpu: beside the model";
}

// VISSL's MODEL.CUDA_CACHE: off by default; on, its frequency reaches the trainer, and a
// frequency that could not be honoured is refused naming the key.
TEST(TrainerConfigMappingTest, CudaCacheKeysReachTheTrainerOptions) {
  EXPECT_EQ(options_with({}).empty_device_cache_every, 0);
  EXPECT_EQ(options_with({"MODEL.CUDA_CACHE.CLEAR_FREQ=7"}).empty_device_cache_every, 0);
  EXPECT_EQ(
      options_with({"MODEL.CUDA_CACHE.CLEAR_CUDA_CACHE=True", "MODEL.CUDA_CACHE.CLEAR_FREQ=7"})
          .empty_device_cache_every,
      7);
  try {
    options_with({"MODEL.CUDA_CACHE.CLEAR_FREQ=0"}); // checked even while off, as written
    FAIL() << "CLEAR_FREQ 0 was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MODEL.CUDA_CACHE.CLEAR_FREQ = 0"), std::string::npos)
        << e.what();
  }
}

int64_t count_modules_of_type(models::TrunkHeadModel& model, const std::string& type) {
  int64_t count = 0;
  for (const auto& module : model->modules()) {
    count += module->name() == type ? 1 : 0;
  }
  return count;
}

models::TrunkHeadModel model_with(std::vector<std::string> overrides) {
  overrides.push_back("MODEL.TRUNK.NAME=resnet");
  models::ModelOptions model = options_with(overrides).model;
  model.in_channels = 3;
  model.image_size = 32;
  model.num_classes = 10;
  return models::build_model(model);
}

TEST(TrainerConfigMappingTest, ResNetNormGroupsAndStrideKeysChangeTheModel) {
  models::TrunkHeadModel plain = model_with({"MODEL.TRUNK.RESNETS.DEPTH=50"});
  EXPECT_EQ(count_modules_of_type(plain, "torch::nn::GroupNormImpl"), 0);

  models::TrunkHeadModel group_norm = model_with(
      {"MODEL.TRUNK.RESNETS.DEPTH=50",
       "MODEL.TRUNK.RESNETS.NORM=GroupNorm",
       "MODEL.TRUNK.RESNETS.GROUPNORM_GROUPS=16"});
  EXPECT_EQ(count_modules_of_type(group_norm, "torch::nn::BatchNorm2dImpl"), 0);
  EXPECT_EQ(count_modules_of_type(group_norm, "torch::nn::GroupNormImpl"), 53);
  auto* norm = group_norm->trunk_block(1)->named_children()["bn1"]->as<torch::nn::GroupNorm>();
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->options.num_groups(), 16);
  models::TrunkHeadModel layer_norm =
      model_with({"MODEL.TRUNK.RESNETS.DEPTH=50", "MODEL.TRUNK.RESNETS.NORM=LayerNorm"});
  norm = layer_norm->trunk_block(1)->named_children()["bn1"]->as<torch::nn::GroupNorm>();
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->options.num_groups(), 1);

  // ResNeXt-50 32x4d: the 3x3 convs are grouped and wider.
  models::TrunkHeadModel resnext = model_with(
      {"MODEL.TRUNK.RESNETS.DEPTH=50",
       "MODEL.TRUNK.RESNETS.GROUPS=32",
       "MODEL.TRUNK.RESNETS.WIDTH_PER_GROUP=4"});
  auto* conv = resnext->trunk_block(1)->named_children()["conv2"]->as<torch::nn::Conv2d>();
  EXPECT_EQ(conv->options.groups(), 32);
  EXPECT_EQ(conv->options.out_channels(), 128);

  models::TrunkHeadModel stride_one =
      model_with({"MODEL.TRUNK.RESNETS.DEPTH=18", "MODEL.TRUNK.RESNETS.LAYER4_STRIDE=1"});
  models::TrunkHeadModel stride_two = model_with({"MODEL.TRUNK.RESNETS.DEPTH=18"});
  at::Tensor images = torch::zeros({1, 3, 64, 64});
  const int64_t before_pool = stride_one->num_trunk_blocks() - 1;
  EXPECT_EQ(
      stride_one->forward_trunk_range(images, 0, before_pool).size(2),
      2 * stride_two->forward_trunk_range(images, 0, before_pool).size(2));

  Config bad = Config::load({}, {"MODEL.TRUNK.RESNETS.NORM=InstanceNorm"});
  EXPECT_THROW(trainer_options_from_config(bad), ConfigError);
}

// VISSL's USE_CLASS_TOKEN (default True) or Largo's CLASSIFIER gap: either drops the class
// token, whose absence the built trunk shows as one token fewer.
TEST(TrainerConfigMappingTest, VitUseClassTokenFalseOrGapDropsTheClassToken) {
  auto tokens_of = [](const std::vector<std::string>& overrides) {
    std::vector<std::string> all = {
        "MODEL.TRUNK.NAME=vision_transformer",
        "MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE=8",
        "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=1",
        "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=2",
        "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=8",
        "MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=16"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    models::ModelOptions model = options_with(all).model;
    model.in_channels = 3;
    model.image_size = 16;
    model.num_classes = 2;
    return models::build_model(model)
        ->forward_trunk_range(torch::zeros({1, 3, 16, 16}), 0, 1)
        .size(1);
  };
  EXPECT_TRUE(options_with({}).model.vit.use_class_token); // VISSL's default
  EXPECT_FALSE(options_with({"MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN=False"})
                   .model.vit.use_class_token);
  EXPECT_EQ(tokens_of({}), 4 + 1); // 2x2 patches and the class token
  EXPECT_EQ(tokens_of({"MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN=False"}), 4);
  EXPECT_EQ(tokens_of({"MODEL.TRUNK.VISION_TRANSFORMERS.CLASSIFIER=gap"}), 4);
  EXPECT_EQ(
      tokens_of(
          {"MODEL.TRUNK.VISION_TRANSFORMERS.CLASSIFIER=gap",
           "MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN=True"}),
      4);
}

TEST(TrainerConfigMappingTest, VitDropPathImageSizeAndHeadMultiplierReachTheModel) {
  TrainerOptions options = options_with(
      {"MODEL.TRUNK.VISION_TRANSFORMERS.DROP_PATH_RATE=0.3",
       "MODEL.TRUNK.VISION_TRANSFORMERS.IMAGE_SIZE=32",
       "MODEL.HEAD.PARAMS_MULTIPLIER=0.5"});
  EXPECT_EQ(options.model.vit.drop_path_rate, 0.3);
  EXPECT_EQ(options.model.vit.image_size, 32);         // must then equal the data's size
  EXPECT_EQ(options_with({}).model.vit.image_size, 0); // VISSL's 224: the data's size

  models::ModelOptions model = options.model;
  model.trunk_name = "small_cnn";
  model.in_channels = 3;
  model.image_size = 32;
  model.num_classes = 10;
  torch::manual_seed(0);
  at::Tensor scaled = models::build_model(model)->named_parameters()["head.0.weight"];
  model.head_params_multiplier = 1.0;
  torch::manual_seed(0);
  at::Tensor plain = models::build_model(model)->named_parameters()["head.0.weight"];
  EXPECT_TRUE(scaled.equal(plain * 0.5));
}

// The ConfigError message of the mapping for `overrides`, or "(accepted)".
std::string mapping_error(const std::vector<std::string>& overrides) {
  try {
    options_with(overrides);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(accepted)";
}

struct Refusal {
  std::vector<std::string> overrides;
  std::vector<std::string> parts; // each in the message
};

void expect_refused(const std::vector<Refusal>& refusals) {
  for (const Refusal& refusal : refusals) {
    const std::string message = mapping_error(refusal.overrides);
    for (const std::string& part : refusal.parts) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
    }
  }
}

// OPTIMIZER.name lars with VISSL's Barlow Twins settings reaches the spec; lars's own keys
// (eta, exclude_bias_and_norm) set for another optimizer, which would ignore them, are
// refused by name, plain and as ZeRO's base_optimizer; momentum outside [0, 1) too.
TEST(TrainerConfigMappingTest, LarsKeysReachTheSpecAndAreRefusedWithoutLars) {
  const TrainerOptions options = options_with(
      {"OPTIMIZER.name=lars",
       "OPTIMIZER.weight_decay=0.000001",
       "OPTIMIZER.momentum=0.9",
       "OPTIMIZER.exclude_bias_and_norm=True",
       "OPTIMIZER.eta=0.002",
       "OPTIMIZER.regularize_bn=False",
       "OPTIMIZER.regularize_bias=False"});
  EXPECT_EQ(options.optimizer.spec.name, "lars");
  EXPECT_EQ(options.optimizer.spec.lars.momentum, 0.9);
  EXPECT_EQ(options.optimizer.spec.lars.eta, 0.002);
  EXPECT_TRUE(options.optimizer.lars_exclude_bias_and_norm);
  EXPECT_EQ(options.optimizer.weight_decay, 0.000001);
  EXPECT_FALSE(options_with({"OPTIMIZER.name=lars"}).optimizer.lars_exclude_bias_and_norm);
  EXPECT_EQ(options_with({"OPTIMIZER.name=lars"}).optimizer.spec.lars.eta, 0.001);

  const TrainerOptions zero = options_with(
      {"OPTIMIZER.name=zero",
       "+OPTIMIZER.base_optimizer.name=lars",
       "+OPTIMIZER.base_optimizer.eta=0.003"});
  EXPECT_EQ(zero.optimizer.spec.name, "lars");
  EXPECT_EQ(zero.optimizer.spec.lars.eta, 0.003);

  for (const std::string name : {"sgd", "adamw", "lamb"}) {
    SCOPED_TRACE(name);
    const std::string eta = mapping_error({"OPTIMIZER.name=" + name, "OPTIMIZER.eta=0.002"});
    EXPECT_NE(eta.find("OPTIMIZER.eta = 0.002"), std::string::npos) << eta;
    EXPECT_NE(eta.find("unless the optimizer is lars"), std::string::npos) << eta;
    const std::string exclude =
        mapping_error({"OPTIMIZER.name=" + name, "OPTIMIZER.exclude_bias_and_norm=True"});
    EXPECT_NE(exclude.find("OPTIMIZER.exclude_bias_and_norm"), std::string::npos) << exclude;
  }
  const std::string nested = mapping_error(
      {"OPTIMIZER.name=zero",
       "+OPTIMIZER.base_optimizer.name=sgd",
       "+OPTIMIZER.base_optimizer.exclude_bias_and_norm=True"});
  EXPECT_NE(nested.find("OPTIMIZER.base_optimizer.exclude_bias_and_norm"), std::string::npos)
      << nested;
  const std::string momentum = mapping_error({"OPTIMIZER.name=lars", "OPTIMIZER.momentum=1.0"});
  EXPECT_NE(momentum.find("OPTIMIZER.momentum = 1"), std::string::npos) << momentum;
  const std::string eta = mapping_error({"OPTIMIZER.name=lars", "OPTIMIZER.eta=0"});
  EXPECT_NE(eta.find("OPTIMIZER.eta = 0"), std::string::npos) << eta;
}

// VISSL's other optimizers: adam (its weight decay reaches the parameter groups, which Adam
// applies as an L2 penalty), rmsprop (alpha, eps, momentum, centered; VISSL's default
// momentum 0.9 applies), and sgd_fsdp, which is sgd. A key the named optimizer does not read
// is refused by name at any value but its default, plain and as ZeRO's base_optimizer.
TEST(TrainerConfigMappingTest, AdamRmspropAndSgdFsdpReachTheSpecAndIgnoredKeysAreRefused) {
  const TrainerOptions adam = options_with(
      {"OPTIMIZER.name=adam",
       "OPTIMIZER.betas=[0.8, 0.99]",
       "OPTIMIZER.eps=1e-6",
       "OPTIMIZER.amsgrad=True",
       "OPTIMIZER.weight_decay=0.05"});
  EXPECT_EQ(adam.optimizer.spec.name, "adam");
  EXPECT_EQ(adam.optimizer.spec.adam.betas, (std::array<double, 2>{0.8, 0.99}));
  EXPECT_EQ(adam.optimizer.spec.adam.eps, 1e-6);
  EXPECT_TRUE(adam.optimizer.spec.adam.amsgrad);
  EXPECT_EQ(adam.optimizer.weight_decay, 0.05);

  const TrainerOptions rmsprop = options_with(
      {"OPTIMIZER.name=rmsprop",
       "OPTIMIZER.alpha=0.9",
       "OPTIMIZER.eps=1e-6",
       "OPTIMIZER.centered=True"});
  EXPECT_EQ(rmsprop.optimizer.spec.name, "rmsprop");
  EXPECT_EQ(rmsprop.optimizer.spec.rmsprop.alpha, 0.9);
  EXPECT_EQ(rmsprop.optimizer.spec.rmsprop.eps, 1e-6);
  EXPECT_EQ(rmsprop.optimizer.spec.rmsprop.momentum, 0.9) << "VISSL's default momentum";
  EXPECT_TRUE(rmsprop.optimizer.spec.rmsprop.centered);
  const TrainerOptions zero = options_with(
      {"OPTIMIZER.name=zero",
       "+OPTIMIZER.base_optimizer.name=rmsprop",
       "+OPTIMIZER.base_optimizer.momentum=0.0"});
  EXPECT_EQ(zero.optimizer.spec.name, "rmsprop");
  EXPECT_EQ(zero.optimizer.spec.rmsprop.momentum, 0.0);

  const TrainerOptions sgd_fsdp = options_with(
      {"OPTIMIZER.name=sgd_fsdp", "OPTIMIZER.momentum=0.8", "OPTIMIZER.use_larc=True"});
  EXPECT_EQ(sgd_fsdp.optimizer.spec.name, "sgd");
  EXPECT_EQ(sgd_fsdp.optimizer.spec.sgd.momentum, 0.8);
  EXPECT_TRUE(sgd_fsdp.optimizer.spec.use_larc);

  expect_refused({
      {{"OPTIMIZER.name=adam", "OPTIMIZER.momentum=0.5"},
       {"OPTIMIZER.momentum = 0.5",
        "0.9 (its default) unless the optimizer is sgd or rmsprop "
        "or lars: adam does not read it"}},
      {{"OPTIMIZER.name=adam", "OPTIMIZER.alpha=0.9"}, {"OPTIMIZER.alpha = 0.9", "rmsprop"}},
      {{"OPTIMIZER.name=rmsprop", "OPTIMIZER.nesterov=True"}, {"OPTIMIZER.nesterov", "sgd"}},
      {{"OPTIMIZER.name=rmsprop", "OPTIMIZER.amsgrad=True"}, {"OPTIMIZER.amsgrad", "adamw"}},
      {{"OPTIMIZER.name=rmsprop", "OPTIMIZER.betas=[0.8, 0.9]"}, {"OPTIMIZER.betas", "lamb"}},
      {{"OPTIMIZER.name=sgd", "OPTIMIZER.centered=True"}, {"OPTIMIZER.centered", "rmsprop"}},
      {{"OPTIMIZER.name=sgd_fsdp", "OPTIMIZER.eps=1e-3"}, {"OPTIMIZER.eps", "sgd does not"}},
      {{"OPTIMIZER.name=zero",
        "+OPTIMIZER.base_optimizer.name=adam",
        "+OPTIMIZER.base_optimizer.dampening=0.1"},
       {"OPTIMIZER.base_optimizer.dampening = 0.1"}},
      {{"OPTIMIZER.name=rmsprop", "OPTIMIZER.momentum=1.0"}, {"OPTIMIZER.momentum = 1", "[0, 1)"}},
      {{"OPTIMIZER.name=adagrad"}, {"OPTIMIZER.name = adagrad", "rmsprop", "sgd_fsdp"}},
  });
}

// MODEL.TRUNK.REGNET: VISSL's keyword map of ClassyVision's RegNetParams; a preset by name
// (with the keyword arguments its constructor takes) or explicit parameters; every other
// entry is refused by name.
TEST(TrainerConfigMappingTest, RegNetKeysReachTheModelAndOtherEntriesAreRefused) {
  const std::string trunk = "MODEL.TRUNK.NAME=regnet";
  TrainerOptions preset = options_with(
      {trunk, "MODEL.TRUNK.REGNET={name: regnet_y_1.6gf, bn_epsilon: 1e-3, activation: silu}"});
  EXPECT_EQ(preset.model.regnet.depth, 27);
  EXPECT_EQ(preset.model.regnet.group_width, 24);
  EXPECT_EQ(preset.model.regnet.bn_epsilon, 1e-3);
  EXPECT_EQ(preset.model.regnet.activation, "silu");

  TrainerOptions explicit_options = options_with(
      {trunk,
       "MODEL.TRUNK.REGNET={depth: 6, w_0: 8, w_a: 8.5, w_m: 2, group_width: 4, "
       "bottleneck_multiplier: 2.0, stem_type: res_stem_cifar, stem_width: 16, use_se: False, "
       "se_ratio: 0.5, bn_momentum: 0.2, block_type: res_bottleneck_block}"});
  const models::RegNetOptions& r = explicit_options.model.regnet;
  EXPECT_EQ(r.depth, 6);
  EXPECT_EQ(r.w_0, 8);
  EXPECT_EQ(r.w_a, 8.5);
  EXPECT_EQ(r.w_m, 2.0);
  EXPECT_EQ(r.group_width, 4);
  EXPECT_EQ(r.bottleneck_multiplier, 2.0);
  EXPECT_EQ(r.stem_type, "res_stem_cifar");
  EXPECT_EQ(r.stem_width, 16);
  EXPECT_FALSE(r.use_se);
  EXPECT_EQ(r.se_ratio, 0.5);
  EXPECT_EQ(r.bn_momentum, 0.2);
  // The model is built from them: 16-wide stem, bottlenecks twice the block widths.
  models::ModelOptions model = explicit_options.model;
  model.in_channels = 3;
  model.image_size = 32;
  model.num_classes = 10;
  models::TrunkHeadModel built = models::build_model(model);
  EXPECT_EQ(built->trunk_block(0)->named_parameters()["0.weight"].size(0), 16);
  EXPECT_EQ(
      built->trunk_block(1)->named_parameters()["f.a.0.weight"].size(0),
      2 * models::regnet_stages(r).front().width);

  // MODEL.WEIGHTS_INIT maps torchvision's RegNet names.
  const Config config = Config::load({}, {trunk, "MODEL.TRUNK.REGNET={name: regnet_y_400mf}"});
  const checkpoint::WeightsInitOptions init =
      weights_init_options_from(config, trainer_options_from_config(config).model);
  ASSERT_TRUE(init.rename);
  EXPECT_EQ(init.rename("trunk_output.block2.block2-0.f.b.0.weight"), "trunk.2.f.b.0.weight");
  EXPECT_EQ(init.rename("fc.bias"), "head.0.bias");

  // VISSL's SEER benchmark fragments (regnet3B.yaml, without their stage_checkpoints),
  // narrowed: ClassyVision's AnyNet, each stage as given.
  const std::string anynet =
      "name: anynet, depths: [1, 2], widths: [16, 40], group_widths: [8, 20], "
      "bottleneck_multipliers: [1.0, 0.5], strides: [2, 1]";
  const TrainerOptions anynet_run = options_with({trunk, "MODEL.TRUNK.REGNET={" + anynet + "}"});
  const std::vector<models::RegNetStageSpec>& stages = anynet_run.model.regnet.stages;
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[1].depth, 2);
  EXPECT_EQ(stages[1].width, 40);
  EXPECT_EQ(stages[1].group_width, 20);
  EXPECT_EQ(stages[1].bottleneck_multiplier, 0.5);
  EXPECT_EQ(stages[1].stride, 1);
  EXPECT_EQ(models::regnet_blocks(anynet_run.model.regnet)[1].groups, 1); // 40 * 0.5 / 20

  // VISSL's RegNet checkpoint groups (SEER's regnet10B.yaml writes [[2], [7], [9, 17], []])
  // cut the trunk where they end: regnet_y_400mf's stages have 1, 3, 6 and 6 blocks after the
  // stem (element 0), and the last group runs through the pool (element 17).
  const std::string groups =
      "MODEL.TRUNK.REGNET={name: regnet_y_400mf, stage_checkpoints: [[1], [1], [2, 4], []]}";
  const auto& cut =
      options_with(
          {trunk, groups, "MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True"})
          .parallel.activation_checkpointing;
  EXPECT_EQ(cut.boundaries, (std::vector<int64_t>{0, 1, 2, 3, 5, 7, 9, 11, 18}));
  EXPECT_EQ(cut.num_splits, 8);
  EXPECT_FALSE(options_with({trunk, groups}).parallel.activation_checkpointing.enabled())
      << "without checkpointing the groups change nothing, as in VISSL";

  const std::vector<std::pair<std::vector<std::string>, std::string>> refused{
      {{trunk}, "no RegNet is set: give a preset (MODEL.TRUNK.REGNET.name"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_y_400mf, depth: 20}"},
       "MODEL.TRUNK.REGNET.depth = 20: expected no depth beside name = regnet_y_400mf"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_x_400mf, use_se: True}"},
       "MODEL.TRUNK.REGNET.use_se = True"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_y_7gf}"},
       "MODEL.TRUNK.REGNET.name = regnet_y_7gf"},
      {{trunk, "MODEL.TRUNK.REGNET={name: anynet, depths: [1, 2]}"},
       "MODEL.TRUNK.REGNET.widths = (not set): expected a list with one entry per stage"},
      {{trunk, "MODEL.TRUNK.REGNET={" + anynet + ", depth: 4}"},
       "MODEL.TRUNK.REGNET.depth = 4: expected no depth beside name = anynet"},
      {{trunk,
        "MODEL.TRUNK.REGNET={name: anynet, depths: [1, 1], widths: [16, 24], group_widths: [8, "
        "8], bottleneck_multipliers: [1.0], strides: [2, 2]}"},
       "MODEL.TRUNK.REGNET.bottleneck_multipliers = [1.0]: expected 2 entries, one per stage"},
      {{trunk,
        "MODEL.TRUNK.REGNET={name: anynet, depths: [1, 0], widths: [16, 24], group_widths: [8, "
        "8], bottleneck_multipliers: [1.0, 1.0], strides: [2, 2]}"},
       "MODEL.TRUNK.REGNET.depths[1] = 0: expected an integer > 0"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_y_400mf, widths: [8]}"},
       "MODEL.TRUNK.REGNET.widths = [8]: expected no widths without name = anynet"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_y_400mf, colour: red}"},
       "MODEL.TRUNK.REGNET.colour = red: expected no such RegNet parameter; MODEL.TRUNK.REGNET "
       "takes name, depth, w_0"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_y_400mf, stage_checkpointing: [[True]]}"},
       "MODEL.TRUNK.REGNET.stage_checkpointing = [[True]]: expected no entry"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_y_400mf, stage_checkpoints: [[2]]}"},
       "MODEL.TRUNK.REGNET.stage_checkpoints = [[2]]: expected increasing block indices in "
       "(0, 1] for stage 1 (1 blocks)"},
      {{trunk,
        "MODEL.TRUNK.REGNET={name: regnet_y_400mf, stage_checkpoints: [[], [], [], [], []]}"},
       "expected a list of at most 4 lists (one per stage)"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_y_400mf, bn_epsilon: small}"},
       "MODEL.TRUNK.REGNET.bn_epsilon = small: expected a finite number"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_y_400mf, use_se: 3}"},
       "MODEL.TRUNK.REGNET.use_se = 3: expected a boolean"},
      {{trunk, "MODEL.TRUNK.REGNET={name: regnet_y_400mf, block_type: res_basic_block}"},
       "MODEL.TRUNK.REGNET.block_type = res_basic_block: expected res_bottleneck_block"},
      {{trunk, "MODEL.TRUNK.REGNET={depth: 6, w_0: 12, w_a: 8, w_m: 2, group_width: 4}"},
       "MODEL.TRUNK.REGNET.w_0 = 12: expected a multiple of 8"},
      {{"MODEL.TRUNK.NAME=resnet", "MODEL.TRUNK.REGNET={name: regnet_y_400mf}"},
       "with MODEL.TRUNK.NAME = resnet (the RegNet keys build the regnet trunk only)"},
  };
  for (const auto& [overrides, expected] : refused) {
    const std::string message = mapping_error(overrides);
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

TEST(TrainerConfigMappingTest, ManualGradientReductionUnderZeroStageTwoIsRefused) {
  EXPECT_NO_THROW(options_with({"DISTRIBUTED.MANUAL_GRADIENT_REDUCTION=True"}));
  try {
    options_with(
        {"DISTRIBUTED.MANUAL_GRADIENT_REDUCTION=True", "MODEL.SHARDED_DDP_SETUP.USE_SDP=True"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(
        std::string(error.what()).find("DISTRIBUTED.MANUAL_GRADIENT_REDUCTION"), std::string::npos);
  }
}

// The settings of SyncBatchNorm, the model EMA, weights init and the loss: read, validated
// and carried into the trainer's options.
TEST(TrainerConfigMappingTest, SyncBnEmaWeightsInitAndLossSettingsAreReadAndChecked) {
  Config config = Config::load(
      {},
      {"MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=True",
       "MODEL.SYNC_BN_CONFIG.GROUP_SIZE=4",
       "HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
       "HOOKS.EMA_MODEL.DECAY=0.99",
       "HOOKS.EMA_MODEL.UPDATE_ITER=2",
       "HOOKS.EMA_MODEL.WARMUP=0.1",
       "HOOKS.EMA_MODEL.EMA_DEVICE=cpu",
       "MODEL.WEIGHTS_INIT.PARAMS_FILE=/w.pth",
       "MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME=\"\"",
       "MODEL.WEIGHTS_INIT.REMOVE_PREFIX=module.",
       "MODEL.TRUNK.RESNETS.DEPTH=18",
       "LOSS.name=cross_entropy_multiple_output_single_target",
       "LOSS.cross_entropy_multiple_output_single_target.temperature=0.1",
       "LOSS.cross_entropy_multiple_output_single_target.normalize_output=True",
       "LOSS.cross_entropy_multiple_output_single_target.weight=[1.0, 2.0]"});
  const TrainerOptions options = trainer_options_from_config(config);
  EXPECT_TRUE(options.sync_batch_norm.convert);
  EXPECT_TRUE(options.model_ema.save);
  EXPECT_EQ(options.weights_init.params_file, "/w.pth");

  SyncBatchNormSettings sync_bn = sync_batch_norm_settings_from(config);
  EXPECT_TRUE(sync_bn.convert);
  EXPECT_EQ(sync_bn.group_size, 4);
  ModelEmaSettings ema = model_ema_settings_from(config);
  EXPECT_TRUE(ema.enabled());
  EXPECT_EQ(ema.average.decay, 0.99);
  EXPECT_EQ(ema.average.update_iter, 2);
  EXPECT_EQ(ema.average.warmup, 0.1);
  ASSERT_TRUE(ema.average.device.has_value());
  EXPECT_TRUE(ema.average.device->is_cpu());
  models::ModelOptions model;
  model.trunk_name = "resnet";
  model.resnet.depth = 18;
  checkpoint::WeightsInitOptions weights = weights_init_options_from(config, model);
  EXPECT_EQ(weights.params_file, "/w.pth");
  EXPECT_TRUE(weights.state_dict_key_name.empty());
  EXPECT_EQ(weights.remove_prefix, "module.");
  ASSERT_TRUE(weights.rename);
  EXPECT_EQ(weights.rename("layer1.0.conv1.weight"), "trunk.1.conv1.weight");
  ClassificationLossOptions loss = classification_loss_options_from(config);
  EXPECT_EQ(loss.temperature, 0.1);
  EXPECT_TRUE(loss.normalize_output);
  EXPECT_EQ(loss.weight, (std::vector<double>{1.0, 2.0}));

  EXPECT_THROW(
      model_ema_settings_from(Config::load({}, {"HOOKS.EMA_MODEL.DECAY=1.5"})), ConfigError);
  EXPECT_THROW(
      sync_batch_norm_settings_from(Config::load({}, {"MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE=x"})),
      ConfigError);
}

// VISSL's FSDP-wrapped models (<name>_fsdp) are their plain architecture under FSDP
// (MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP, which VISSL's own renaming requires too); without it,
// or when Largo lacks the plain model, they are refused naming the key to set or the model.
TEST(TrainerConfigMappingTest, VisslFsdpModelNamesAreTheirModelsUnderFsdp) {
  const std::string fsdp = "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True";
  const std::string swav_fsdp =
      "MODEL.HEAD.PARAMS=[[swav_head_fsdp, {dims: [440, 64, 16], num_clusters: [12]}]]";
  const TrainerOptions seer = options_with(
      {fsdp,
       "MODEL.TRUNK.NAME=regnet_fsdp",
       "MODEL.TRUNK.REGNET={name: regnet_y_400mf}",
       swav_fsdp,
       "LOSS.name=swav_loss",
       "OPTIMIZER.name=sgd_fsdp",
       "OPTIMIZER.use_larc=True"});
  EXPECT_EQ(seer.model.trunk_name, "regnet");
  EXPECT_EQ(seer.model.regnet.depth, 16) << "regnet_y_400mf's REGNET keys reach regnet_fsdp";
  EXPECT_EQ(seer.model.swav_head.dims, (std::vector<int64_t>{440, 64, 16}));
  EXPECT_EQ(seer.parallel.data_parallelism, parallel::DataParallelism::kFsdp);
  EXPECT_EQ(seer.optimizer.spec.name, "sgd");

  const TrainerOptions vit = options_with(
      {fsdp,
       "MODEL.TRUNK.NAME=vision_transformer_fsdp",
       "MODEL.HEAD.PARAMS=[[mlp_fsdp, {dims: [768, 10]}]]"});
  EXPECT_EQ(vit.model.trunk_name, "vision_transformer");
  EXPECT_EQ(vit.model.head_dims, (std::vector<int64_t>{768, 10}));

  const models::ModelOptions dino = model_options_from(Config::load(
      {}, {fsdp, "MODEL.HEAD.PARAMS=[[dino_head_fsdp, {in_dim: 384, num_clusters: [16]}]]"}));
  EXPECT_EQ(dino.dino_head.in_dim, 384) << "dino_head_fsdp is the dino_head under FSDP";

  const models::ModelOptions eval = model_options_from(Config::load(
      {},
      {fsdp,
       "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
       "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True",
       "MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res5avg, [Identity, []]]]",
       "MODEL.HEAD.PARAMS=[[eval_mlp_fsdp, {in_channels: 2048, dims: [2048, 1000]}]]"}));
  ASSERT_EQ(eval.feature_eval.heads.size(), 1u);
  EXPECT_EQ(eval.feature_eval.heads[0].name, "eval_mlp");

  expect_refused({
      {{"MODEL.TRUNK.NAME=regnet_fsdp"},
       {"MODEL.TRUNK.NAME = regnet_fsdp",
        "Set MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True or "
        "TRAINER.TASK_NAME=self_supervision_fsdp_task"}},
      {{swav_fsdp, "LOSS.name=swav_loss"},
       {"MODEL.HEAD.PARAMS[0] = swav_head_fsdp", "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}},
      {{"MODEL.HEAD.PARAMS=[[mlp_fsdp, {dims: [128, 10]}]]"}, {"MODEL.HEAD.PARAMS[0] = mlp_fsdp"}},
      {{fsdp, "MODEL.TRUNK.NAME=xcit_fsdp"}, {"MODEL.TRUNK.NAME = xcit_fsdp", "XCiT"}},
      {{"MODEL.HEAD.PARAMS=[[dino_head_fsdp, {in_dim: 384, num_clusters: [16]}]]"},
       {"MODEL.HEAD.PARAMS[0] = dino_head_fsdp", "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}},
      {{fsdp, "MODEL.TRUNK.NAME=small_cnn_fsdp"}, {"MODEL.TRUNK.NAME = small_cnn_fsdp"}},
  });
}

// VISSL's TRAINER.TASK_NAME picks the data-parallel engine: its SEER and DINO FSDP configs
// set self_supervision_fsdp_task without AUTO_SETUP_FSDP (FSDP with MODEL.FSDP_CONFIG as
// written: the _fsdp names and compute_dtype float16 compute copies), and its ShardedDDP task
// runs only beside the ZeRO optimizer (ZeRO-2).
TEST(TrainerConfigMappingTest, VisslTaskNamesChooseTheDataParallelEngine) {
  const std::string fsdp_task = "TRAINER.TASK_NAME=self_supervision_fsdp_task";
  const TrainerOptions seer = options_with(
      {fsdp_task,
       "MODEL.TRUNK.NAME=regnet_fsdp",
       "MODEL.TRUNK.REGNET={name: regnet_y_400mf}",
       "MODEL.HEAD.PARAMS=[[swav_head_fsdp, {dims: [440, 64, 16], num_clusters: [12]}]]",
       "LOSS.name=swav_loss",
       "MODEL.AMP_PARAMS.USE_AMP=True",
       "MODEL.FSDP_CONFIG.compute_dtype=float16"});
  EXPECT_EQ(seer.parallel.data_parallelism, parallel::DataParallelism::kFsdp);
  EXPECT_EQ(seer.model.trunk_name, "regnet");
  EXPECT_EQ(seer.parallel.fsdp.compute_dtype, at::kHalf);
  EXPECT_EQ(options_with({fsdp_task}).parallel.data_parallelism, parallel::DataParallelism::kFsdp)
      << "the FSDP task wraps a plain model too";
  const std::string sdp_task = "TRAINER.TASK_NAME=self_supervision_sdp_task";
  EXPECT_EQ(
      options_with({sdp_task, "OPTIMIZER.use_zero=True"}).parallel.data_parallelism,
      parallel::DataParallelism::kZero2);
  EXPECT_EQ(
      options_with({"OPTIMIZER.use_zero=True"}).parallel.data_parallelism,
      parallel::DataParallelism::kZero1);
  EXPECT_EQ(options_with({}).parallel.data_parallelism, parallel::DataParallelism::kDdp);
  expect_refused({
      {{sdp_task}, {"TRAINER.TASK_NAME = self_supervision_sdp_task", "OPTIMIZER.use_zero True"}},
      {{fsdp_task, "OPTIMIZER.use_zero=True"},
       {"TRAINER.TASK_NAME self_supervision_fsdp_task", "are both on"}},
      {{"TRAINER.TASK_NAME=classification_task"},
       {"TRAINER.TASK_NAME = classification_task", "one of VISSL's three tasks"}},
  });
}

TEST(TrainerConfigMappingTest, LinearEvaluationSettingsAndHeadsAreParsed) {
  Config config = Config::load(
      {},
      {"MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
       "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True",
       "MODEL.FEATURE_EVAL_SETTINGS.SHOULD_FLATTEN_FEATS=False",
       "MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res4, [AvgPool2d, [[8, 8], 3, "
       "0]]], "
       "[res5avg, [Identity, []]]]",
       "MODEL.HEAD.PARAMS=[[eval_mlp, {in_channels: 1024, dims: [9216, 1000]}], "
       "[mlp, {dims: [2048, 1000]}]]"});
  EXPECT_TRUE(trainer_options_from_config(config).model.feature_eval.enabled());
  models::ModelOptions model = model_options_from(config);
  const models::FeatureEvalOptions& eval = model.feature_eval;
  EXPECT_TRUE(eval.enabled());
  EXPECT_FALSE(eval.should_flatten_feats);
  ASSERT_EQ(eval.taps.size(), 2u);
  EXPECT_EQ(eval.taps[0].feature, "res4");
  EXPECT_EQ(eval.taps[0].pool, "AvgPool2d");
  EXPECT_EQ(eval.taps[0].kernel_size, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(eval.taps[0].stride, 3);
  EXPECT_EQ(eval.taps[1].pool, "Identity");
  ASSERT_EQ(eval.heads.size(), 2u);
  EXPECT_EQ(eval.heads[0].name, "eval_mlp");
  EXPECT_EQ(eval.heads[0].in_channels, 1024);
  EXPECT_EQ(eval.heads[1].dims, (std::vector<int64_t>{2048, 1000}));
  EXPECT_TRUE(model.head_dims.empty());
  // Without taps, several mlp heads run one after another (SimCLR's projection, or a
  // classifier's hidden layers); one eval_mlp head runs on the trunk's output
  // (ALoneEvalMlpHeadIsBatchNormThenMlpOnTheTrunksOutput, below), several are an error.
  const models::ModelOptions chained = model_options_from(
      Config::load({}, {"MODEL.HEAD.PARAMS=[[mlp, {dims: [8, 6], use_relu: True}], [mlp, {dims: "
                        "[6, 4]}]]"}));
  ASSERT_EQ(chained.head_chain.size(), 2u);
  EXPECT_TRUE(chained.head_chain[0].options.use_relu);
  EXPECT_EQ(chained.head_chain[1].dims, (std::vector<int64_t>{6, 4}));
  EXPECT_THROW(
      model_options_from(Config::load(
          {},
          {"MODEL.HEAD.PARAMS=[[eval_mlp, {in_channels: 8, dims: [8, 4]}], [eval_mlp, "
           "{in_channels: 8, dims: [8, 4]}]]"})),
      ConfigError);
}

// VISSL's fine-tuning fragments of SwAV checkpoints (fulltune/*/models/*_swav_head.yaml):
// a swav_head without prototypes, then the classifier's mlp, run one after another.
TEST(TrainerConfigMappingTest, SwavHeadWithoutPrototypesIsTheProjectionBeforeAClassifier) {
  const std::string chain =
      "MODEL.HEAD.PARAMS=[[swav_head, {dims: [8, 6], use_bn: True, num_clusters: []}], "
      "[mlp, {dims: [6, 4]}]]";
  const models::ModelOptions model = model_options_from(Config::load({}, {chain}));
  ASSERT_EQ(model.head_chain.size(), 2U);
  const models::MlpHeadSpec& projection = model.head_chain[0];
  EXPECT_EQ(projection.dims, (std::vector<int64_t>{8, 6}));
  EXPECT_EQ(projection.vissl_module, "projection_head");
  EXPECT_TRUE(projection.options.use_bn);
  EXPECT_TRUE(projection.options.use_relu);
  EXPECT_TRUE(projection.options.skip_last_layer_relu_bn); // VISSL's skip_last_bn default
  EXPECT_TRUE(projection.normalize_output);                // and normalize_feats'
  EXPECT_EQ(model.head_chain[1].dims, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(model.head_chain[1].vissl_module, "clf");
  EXPECT_TRUE(model.swav_head.dims.empty());
  const models::ModelOptions written_out = model_options_from(Config::load(
      {},
      {"MODEL.HEAD.PARAMS=[[swav_head, {dims: [8, 6], use_bn: False, skip_last_bn: False, "
       "normalize_feats: False, num_clusters: []}], [mlp, {dims: [6, 4]}]]"}));
  EXPECT_FALSE(written_out.head_chain[0].options.skip_last_layer_relu_bn);
  EXPECT_FALSE(written_out.head_chain[0].normalize_output);

  EXPECT_NE(
      mapping_error(
          {"MODEL.HEAD.PARAMS=[[swav_head, {dims: [8, 6], num_clusters: [3]}], [mlp, {dims: "
           "[6, 4]}]]"})
          .find("MODEL.HEAD.PARAMS[0].num_clusters"),
      std::string::npos);
  EXPECT_NE(
      mapping_error({"MODEL.HEAD.PARAMS=[[swav_head, {dims: [8, 6], num_clusters: [], "
                     "activation_name: GELU}], [mlp, {dims: [6, 4]}]]"})
          .find("MODEL.HEAD.PARAMS[0].activation_name"),
      std::string::npos);
  EXPECT_NE(
      mapping_error({"MODEL.HEAD.PARAMS=[[swav_head, {dims: [8, 6], num_clusters: []}], [eval_mlp, "
                     "{in_channels: 6, dims: [6, 4]}]]"})
          .find("MODEL.HEAD.PARAMS[1]"),
      std::string::npos);
  // Alone, a swav_head is SwAV's and needs its prototypes.
  EXPECT_NE(
      mapping_error({"MODEL.HEAD.PARAMS=[[swav_head, {dims: [8, 6], num_clusters: []}]]"})
          .find("MODEL.HEAD.PARAMS[0].num_clusters"),
      std::string::npos);
}

// VISSL's benchmark fragments for RegNet (models/regnet16gf.yaml) and ViT
// (models/dino_deit_s16.yaml) tap by the trunks' own names; a name the trunk lacks is refused
// by its key, listing the trunk's features.
TEST(TrainerConfigMappingTest, RegNetAndVitLinearEvaluationTapsAreParsed) {
  const std::vector<std::string> frozen{
      "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
      "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True"};
  std::vector<std::string> regnet = frozen;
  regnet.insert(
      regnet.end(),
      {"MODEL.TRUNK.NAME=regnet",
       "MODEL.TRUNK.REGNET={name: regnet_y_16gf}",
       "MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res4, [AdaptiveAvgPool2d, "
       "[[4, 2]]]], [res5, [AdaptiveAvgPool2d, [[2, 2]]]], [avgpool, [Identity, []]], [conv1, "
       "[Identity, []]]]",
       "MODEL.HEAD.PARAMS=[[eval_mlp, {in_channels: 1232, dims: [9856, 10]}], [eval_mlp, "
       "{in_channels: 3024, dims: [12096, 10]}], [eval_mlp, {in_channels: 3024, dims: [3024, "
       "10]}], [mlp, {dims: [32, 10]}]]"});
  const models::FeatureEvalOptions regnet_eval = options_with(regnet).model.feature_eval;
  ASSERT_EQ(regnet_eval.taps.size(), 4u);
  EXPECT_EQ(regnet_eval.taps[0].feature, "res4");
  EXPECT_EQ(regnet_eval.taps[0].kernel_size, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(regnet_eval.taps[2].feature, "avgpool");
  EXPECT_EQ(regnet_eval.heads[1].in_channels, 3024);

  std::vector<std::string> vit = frozen;
  vit.insert(
      vit.end(),
      {"MODEL.TRUNK.NAME=vision_transformer",
       "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=384",
       "MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[concatCLS4, [Identity, []]], "
       "[lastCLS, [Identity, []]], [blkCLS11, [Identity, []]]]",
       "MODEL.HEAD.PARAMS=[[eval_mlp, {in_channels: 1536, dims: [1536, 10]}], [eval_mlp, "
       "{in_channels: 384, dims: [384, 10]}], [mlp, {dims: [384, 10]}]]"});
  const models::FeatureEvalOptions vit_eval = options_with(vit).model.feature_eval;
  ASSERT_EQ(vit_eval.taps.size(), 3u);
  EXPECT_EQ(vit_eval.taps[0].feature, "concatCLS4");
  EXPECT_EQ(vit_eval.taps[2].feature, "blkCLS11");

  std::vector<std::string> resnet_name = regnet;
  resnet_name[4] =
      "MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res4, [Identity, []]], "
      "[res5avg, [Identity, []]], [avgpool, [Identity, []]], [conv1, [Identity, []]]]";
  std::vector<std::string> map_name = vit;
  map_name[4] =
      "MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[concatCLS4, [Identity, []]], "
      "[lastMAP, [Identity, []]], [lastCLS, [Identity, []]]]";
  expect_refused({
      {resnet_name,
       {"MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP[1] = res5avg",
        "a regnet feature: conv1 (the stem), res2 .. res<S+1>",
        "avgpool, flatten"}},
      {map_name,
       {"MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP[1] = lastMAP",
        "lastCLS, blkCLS<i>",
        "concatPOOL<n>",
        "MODEL.TRUNK.VISION_TRANSFORMERS.CLASSIFIER"}},
  });
}

// LOSS.swav_loss, LOSS.simclr_info_nce_loss, the swav_head and the frozen-parameter map reach
// the trainer's options as VISSL's configs write them.
// VISSL's DINO keys (configs/config/pretrain/dino/dino_16gpus_deits16.yaml's, other values):
// the loss's, the teacher's and the dino_head's kwargs by VISSL's names.
TEST(TrainerConfigMappingTest, DeepClusterV2KeysReachTheTrainerOptions) {
  const std::string dc = "LOSS.deepclusterv2_loss.";
  const TrainerOptions options = options_with(
      {"LOSS.name=deepclusterv2_loss",
       dc + "temperature=0.2",
       dc + "num_clusters=[30, 20]",
       dc + "kmeans_iters=4",
       dc + "memory_params.crops_for_mb=[0, 1]",
       dc + "memory_params.embedding_dim=64",
       // VISSL overwrites these from the data and the dataset: set to anything, they are not read
       dc + "num_train_samples=1281167",
       dc + "BATCHSIZE_PER_REPLICA=64",
       dc + "num_crops=8",
       dc + "DROP_LAST=False"});
  const SelfSupervisedLossOptions& ssl = options.self_supervised;
  EXPECT_TRUE(ssl.is_deepclusterv2());
  EXPECT_TRUE(ssl.trains_projection());
  EXPECT_FALSE(ssl.compares_two_views());
  EXPECT_EQ(ssl.deepclusterv2.temperature, 0.2);
  EXPECT_EQ(ssl.deepclusterv2_memory.num_clusters, (std::vector<int64_t>{30, 20}));
  EXPECT_EQ(ssl.deepclusterv2_memory.kmeans_iters, 4);
  EXPECT_EQ(ssl.deepclusterv2_memory.crops_for_mb, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(ssl.deepclusterv2_memory.embedding_dim, 64);
  EXPECT_EQ(ssl.projection_width(), 64);
  EXPECT_EQ(ssl.projection_width_key(), dc + "memory_params.embedding_dim");
  EXPECT_THROW(options_with({"LOSS.name=deepclusterv2_loss", dc + "num_clusters=[]"}), ConfigError);
  EXPECT_THROW(
      options_with({"LOSS.name=deepclusterv2_loss", dc + "memory_params.crops_for_mb=[]"}),
      ConfigError);
  EXPECT_THROW(options_with({"LOSS.name=deepclusterv2_loss", dc + "temperature=0"}), ConfigError);
}

TEST(TrainerConfigMappingTest, DinoKeysReachTheTrainerOptions) {
  const std::string dino = "LOSS.dino_loss.";
  const TrainerOptions options = options_with(
      {"LOSS.name=dino_loss",
       dino + "momentum=0.99",
       dino + "student_temp=0.2",
       dino + "teacher_temp_min=0.03",
       dino + "teacher_temp_max=0.06",
       dino + "teacher_temp_warmup_iters=100",
       dino + "crops_for_teacher=[1, 0]",
       dino + "ema_center=0.8",
       "MODEL.HEAD.PARAMS=[[dino_head, {in_dim: 384, num_clusters: [1000], use_bn: True, "
       "normalize_last_layer: False, num_layers: 2, hidden_dim: 64, bottleneck_dim: 32}]]",
       "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0.prototypes0.weight_v', 1251]]"});
  const SelfSupervisedLossOptions& ssl = options.self_supervised;
  EXPECT_TRUE(ssl.is_dino());
  EXPECT_EQ(ssl.dino_momentum, 0.99);
  EXPECT_EQ(ssl.dino.student_temp, 0.2);
  EXPECT_EQ(ssl.dino.teacher_temp_min, 0.03);
  EXPECT_EQ(ssl.dino.teacher_temp_max, 0.06);
  EXPECT_EQ(ssl.dino.teacher_temp_warmup_iters, 100);
  EXPECT_EQ(ssl.dino.crops_for_teacher, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(ssl.dino.center_momentum, 0.8);
  ASSERT_TRUE(options.model.dino.has_value());
  EXPECT_EQ(options.model.dino->crops_for_teacher, (std::vector<int64_t>{1, 0}));
  ASSERT_EQ(ssl.frozen_parameters.size(), 1u);
  EXPECT_EQ(ssl.frozen_parameters[0].first, "head.0.prototypes0.weight_v");
  const models::DinoHeadOptions& head = options.model.dino_head;
  EXPECT_EQ(head.in_dim, 384);
  EXPECT_EQ(head.num_clusters, 1000);
  EXPECT_TRUE(head.use_bn);
  EXPECT_FALSE(head.normalize_last_layer);
  EXPECT_EQ(head.num_layers, 2);
  EXPECT_EQ(head.hidden_dim, 64);
  EXPECT_EQ(head.bottleneck_dim, 32);
  EXPECT_FALSE(options_with({}).model.dino.has_value());
}

TEST(TrainerConfigMappingTest, SelfSupervisedKeysReachTheTrainerOptions) {
  const std::string swav = "LOSS.swav_loss.";
  const TrainerOptions options = options_with(
      {"LOSS.name=swav_loss",
       swav + "temperature=0.2",
       swav + "epsilon=0.03",
       swav + "num_iters=5",
       swav + "crops_for_assign=[1]",
       swav + "use_double_precision=True",
       swav + "normalize_last_layer=False",
       swav + "temp_hard_assignment_iters=7",
       swav + "queue.queue_length=3840",
       swav + "queue.start_iter=15000",
       "MODEL.HEAD.PARAMS=[[swav_head, {dims: [2048, 2048, 128], use_bn: True, num_clusters: "
       "[3000, 100], activation_name: GELU}]]",
       "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0.prototypes0.weight', 313]]"});
  const SelfSupervisedLossOptions& ssl = options.self_supervised;
  EXPECT_TRUE(ssl.is_swav());
  EXPECT_EQ(ssl.swav.temperature, 0.2);
  EXPECT_EQ(ssl.swav.epsilon, 0.03);
  EXPECT_EQ(ssl.swav.num_iters, 5);
  EXPECT_EQ(ssl.swav.crops_for_assign, (std::vector<int64_t>{1}));
  EXPECT_TRUE(ssl.swav.use_double_precision);
  EXPECT_FALSE(ssl.normalize_last_layer);
  EXPECT_EQ(ssl.temp_hard_assignment_iters, 7);
  EXPECT_EQ(ssl.queue_length, 3840);
  EXPECT_EQ(ssl.queue_start_iter, 15000);
  ASSERT_EQ(ssl.frozen_parameters.size(), 1u);
  EXPECT_EQ(ssl.frozen_parameters[0].first, "head.0.prototypes0.weight");
  EXPECT_EQ(ssl.frozen_parameters[0].second, 313);
  const models::SwavHeadOptions& head = options.model.swav_head;
  EXPECT_EQ(head.dims, (std::vector<int64_t>{2048, 2048, 128}));
  EXPECT_TRUE(head.use_bn);
  EXPECT_EQ(head.num_clusters, (std::vector<int64_t>{3000, 100}));
  EXPECT_EQ(head.activation, "GELU");

  const TrainerOptions simclr = options_with(
      {"LOSS.name=simclr_info_nce_loss",
       "LOSS.simclr_info_nce_loss.temperature=0.5",
       "LOSS.simclr_info_nce_loss.buffer_params.embedding_dim=64"});
  EXPECT_EQ(simclr.self_supervised.name, "simclr_info_nce_loss");
  EXPECT_EQ(simclr.self_supervised.simclr.temperature, 0.5);
  EXPECT_EQ(simclr.self_supervised.simclr_embedding_dim, 64);
  const TrainerOptions barlow_twins = options_with(
      {"LOSS.name=barlow_twins_loss",
       "LOSS.barlow_twins_loss.lambda_=0.01",
       "LOSS.barlow_twins_loss.scale_loss=0.5",
       "LOSS.barlow_twins_loss.embedding_dim=32"});
  const TrainerOptions moco = options_with(
      {"LOSS.name=moco_loss",
       "LOSS.moco_loss.embedding_dim=64",
       "LOSS.moco_loss.queue_size=1024",
       "LOSS.moco_loss.momentum=0.99",
       "LOSS.moco_loss.temperature=0.07",
       "LOSS.moco_loss.shuffle_batch=False",
       "SEED_VALUE=5"});
  EXPECT_TRUE(moco.self_supervised.is_moco());
  EXPECT_EQ(moco.self_supervised.moco_embedding_dim, 64);
  EXPECT_EQ(moco.self_supervised.moco_queue_size, 1024);
  EXPECT_EQ(moco.self_supervised.moco.temperature, 0.07);
  ASSERT_TRUE(moco.model.moco.has_value());
  EXPECT_EQ(moco.model.moco->momentum, 0.99);
  EXPECT_FALSE(moco.model.moco->shuffle_batch);
  EXPECT_EQ(moco.model.moco->shuffle_seed, 5u);
  EXPECT_FALSE(barlow_twins.model.moco.has_value());
  EXPECT_TRUE(barlow_twins.self_supervised.is_barlow_twins());
  EXPECT_EQ(barlow_twins.self_supervised.barlow_twins.lambda, 0.01);
  EXPECT_EQ(barlow_twins.self_supervised.barlow_twins.scale_loss, 0.5);
  EXPECT_EQ(barlow_twins.self_supervised.projection_width(), 32);
  EXPECT_THROW(
      options_with({"LOSS.name=barlow_twins_loss", "LOSS.barlow_twins_loss.lambda_=-1"}),
      ConfigError);
  EXPECT_THROW(
      options_with({"LOSS.name=barlow_twins_loss", "LOSS.barlow_twins_loss.scale_loss=0"}),
      ConfigError);
  EXPECT_THROW(options_with({"LOSS.name=swav_loss", swav + "temperature=0"}), ConfigError);
  EXPECT_THROW(
      options_with({"MODEL.HEAD.PARAMS=[[swav_head, {dims: [8, 4], num_clusters: [3], "
                    "return_embeddings: False}]]"}),
      ConfigError);
}

// The schedules VISSL adds are read from lr, lr_head and composite entries (whose keys the
// config layer cannot check), and step_with_fixed_gamma's num_epochs is held to the run's.
TEST(TrainerConfigMappingTest, VisslSchedulesAreReadFromTheConfig) {
  const std::string lr = "OPTIMIZER.param_schedulers.lr.";
  TrainerOptions options = options_with(
      {"OPTIMIZER.num_epochs=40",
       lr + "name=cosine_warm_restart",
       lr + "start_value=0.3",
       lr + "end_value=0.003",
       lr + "restart_interval_length=0.25",
       lr + "wave_type=full",
       lr + "lr_multiplier=0.5",
       lr + "is_adaptive=True",
       "OPTIMIZER.param_schedulers.lr_head.name=step_with_fixed_gamma",
       "OPTIMIZER.param_schedulers.lr_head.base_value=0.2",
       "OPTIMIZER.param_schedulers.lr_head.num_decays=2",
       "OPTIMIZER.param_schedulers.lr_head.gamma=0.5",
       "OPTIMIZER.param_schedulers.lr_head.num_epochs=40"});
  const optim::ScheduleOptions& restart = options.optimizer.lr;
  EXPECT_EQ(restart.name, "cosine_warm_restart");
  EXPECT_EQ(restart.restart_interval_length, 0.25);
  EXPECT_EQ(restart.wave_type, "full");
  EXPECT_EQ(restart.lr_multiplier, 0.5);
  EXPECT_TRUE(restart.is_adaptive);
  const optim::ScheduleOptions& step = options.optimizer.lr_head;
  EXPECT_EQ(step.base_value, 0.2);
  EXPECT_EQ(step.num_decays, 2);
  EXPECT_EQ(step.gamma, 0.5);

  TrainerOptions composite = options_with(
      {lr + "name=composite",
       lr + "schedulers=[{name: linear, start_value: 0.0, end_value: 4.8}, {name: inverse_sqrt, "
            "start_value: 4.8, warmup_interval_length: 0.1}, {name: polynomial, base_value: "
            "0.2, power: 2}]",
       lr + "lengths=[0.1, 0.6, 0.3]",
       lr + "interval_scaling=[rescaled, fixed, rescaled]"});
  ASSERT_EQ(composite.optimizer.lr.schedulers.size(), 3u);
  EXPECT_EQ(composite.optimizer.lr.schedulers[1].warmup_interval_length, 0.1);
  EXPECT_EQ(composite.optimizer.lr.schedulers[2].power, 2.0);

  try {
    options_with(
        {"OPTIMIZER.num_epochs=40", lr + "name=step_with_fixed_gamma", lr + "num_epochs=120"});
    ADD_FAILURE() << "a num_epochs other than OPTIMIZER.num_epochs was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lr.num_epochs = 120"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("OPTIMIZER.num_epochs (40)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      options_with(
          {lr + "name=composite",
           lr + "schedulers=[{name: polynomial, powr: 2}]",
           lr + "lengths=[1.0]"}),
      ConfigError);
  // The library's own rule, named by the key the user wrote (not as a library option).
  try {
    options_with({lr + "name=cosine_warm_restart", lr + "wave_type=quarter"});
    ADD_FAILURE() << "wave_type quarter was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "config key OPTIMIZER.param_schedulers.lr.wave_type = quarter: expected half or full"),
        std::string::npos)
        << e.what();
  }
}

// VISSL's other self-supervised and distillation losses are refused by name, as features
// Largo lacks, not as unexpected values.
TEST(TrainerConfigMappingTest, VisslLossesLargoLacksAreRefusedByName) {
  for (const char* loss :
       {"swav_momentum_loss", "multicrop_simclr_info_nce_loss", "ibot_loss", "msn_loss"}) {
    try {
      options_with({std::string("LOSS.name=") + loss});
      ADD_FAILURE() << loss << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(
          std::string(e.what()).find(std::string("VISSL's ") + loss + " is not available"),
          std::string::npos)
          << e.what();
    }
  }
}

// MODEL.TRUNK.NAME resnet_sk reads MODEL.TRUNK.RESNETS_SK (VISSL's keys and defaults) into
// the trunk it builds; values the trunk cannot take are refused naming the key.
TEST(TrainerConfigMappingTest, ResNetSkKeysReachTheModel) {
  const TrainerOptions defaults = options_with({"MODEL.TRUNK.NAME=resnet_sk"});
  EXPECT_EQ(defaults.model.trunk_name, "resnet_sk");
  EXPECT_EQ(defaults.model.resnet_sk.depth, 152);
  EXPECT_EQ(defaults.model.resnet_sk.width_multiplier, 3);
  EXPECT_EQ(defaults.model.resnet_sk.sk_ratio, 0.0625);
  const TrainerOptions options = options_with(
      {"MODEL.TRUNK.NAME=resnet_sk",
       "MODEL.TRUNK.RESNETS_SK={DEPTH: 152, WIDTH_MULTIPLIER: 1, SK_RATIO: 0.5}"});
  EXPECT_EQ(options.model.resnet_sk.width_multiplier, 1);
  EXPECT_EQ(options.model.resnet_sk.sk_ratio, 0.5);
  // The model is built from them (blocks cut short here: depth 152 has 50 blocks).
  models::ModelOptions model = options.model;
  model.in_channels = 3;
  model.image_size = 32;
  model.num_classes = 10;
  model.resnet_sk.blocks_per_stage = {1, 1, 1, 1};
  models::TrunkHeadModel built = models::build_model(model);
  EXPECT_EQ(built->trunk_output_dim(), 2048);
  // max(64 * 0.5, 32) = 32 channels in the first block's mixing conv
  EXPECT_EQ(built->trunk_block(1)->named_parameters()["net.2.mixing_conv.0.weight"].size(0), 32);
  EXPECT_EQ(built->trunk_block(0)->named_parameters()["0.weight"].size(0), 32); // 64 * 1 / 2
  expect_refused({
      {{"MODEL.TRUNK.NAME=resnet_sk", "MODEL.TRUNK.RESNETS_SK.WIDTH_MULTIPLIER=0"},
       {"MODEL.TRUNK.RESNETS_SK.WIDTH_MULTIPLIER", "0"}},
      {{"MODEL.TRUNK.NAME=resnet_sk", "MODEL.TRUNK.RESNETS_SK.SK_RATIO=-0.5"},
       {"MODEL.TRUNK.RESNETS_SK.SK_RATIO", "-0.5"}},
  });
}

// VISSL never reads MODEL.TRUNK.TRUNK_PARAMS; a few of its configs write the trunk's keys
// there. Largo loads them where they repeat the values in effect and refuses them otherwise,
// naming both keys.
TEST(TrainerConfigMappingTest, TrunkParamsLoadOnlyWhereTheyRepeatTheTrunkKeys) {
  EXPECT_EQ(mapping_error({"MODEL.TRUNK.TRUNK_PARAMS={RESNETS: {DEPTH: 50}}"}), "(accepted)");
  const TrainerOptions deeper = options_with(
      {"MODEL.TRUNK.RESNETS.DEPTH=101", "MODEL.TRUNK.TRUNK_PARAMS={RESNETS: {DEPTH: 101}}"});
  EXPECT_EQ(deeper.model.resnet.depth, 101);
  expect_refused({
      {{"MODEL.TRUNK.TRUNK_PARAMS={RESNETS: {DEPTH: 101}}"},
       {"MODEL.TRUNK.TRUNK_PARAMS.RESNETS.DEPTH = 101", "MODEL.TRUNK.RESNETS.DEPTH (50)"}},
      {{"MODEL.TRUNK.NAME=regnet",
        "MODEL.TRUNK.REGNET={name: regnet_y_400mf}",
        "MODEL.TRUNK.TRUNK_PARAMS={REGNET: {name: regnet_y_128gf}}"},
       {"MODEL.TRUNK.TRUNK_PARAMS.REGNET.name", "regnet_y_400mf"}},
      {{"MODEL.TRUNK.TRUNK_PARAMS={RESNETS: {DEPTHS: 50}}"},
       {"MODEL.TRUNK.TRUNK_PARAMS.RESNETS.DEPTHS", "unset"}},
  });
}

// A lone eval_mlp head without feature taps is VISSL's LinearEvalMLP on the trunk's output:
// BatchNorm2d over its channels ([b, c] seen as [b, c, 1, 1]), then the mlp, under VISSL's
// names (heads.0.channel_bn.*, heads.0.clf.clf.0.*).
TEST(TrainerConfigMappingTest, ALoneEvalMlpHeadIsBatchNormThenMlpOnTheTrunksOutput) {
  const std::vector<std::string> overrides{
      "MODEL.TRUNK.NAME=mlp",
      "MODEL.TRUNK.MLP.HIDDEN_DIMS=[8]",
      "MODEL.HEAD.PARAMS=[[eval_mlp, {in_channels: 8, dims: [8, 3]}]]"};
  models::ModelOptions model = options_with(overrides).model;
  EXPECT_EQ(model.head_channel_bn, 8);
  EXPECT_EQ(model.head_dims, (std::vector<int64_t>{8, 3}));
  model.in_channels = 1;
  model.image_size = 2;
  model.num_classes = 3;
  models::TrunkHeadModel built = models::build_model(model);
  auto parameters = built->named_parameters();
  const Config config = Config::load({}, overrides);
  const auto rename = weights_init_options_from(config, model).rename;
  for (const std::string vissl : {"heads.0.channel_bn.weight", "heads.0.clf.clf.0.weight"}) {
    EXPECT_TRUE(parameters.contains(rename(vissl))) << vissl << " -> " << rename(vissl);
  }
  torch::NoGradGuard no_grad;
  built->eval();
  const at::Tensor bn_weight = parameters["head.0.channel_bn.weight"];
  const at::Tensor bn_bias = parameters["head.0.channel_bn.bias"];
  bn_weight.copy_(at::linspace(0.5, 2.0, 8));
  bn_bias.copy_(at::linspace(-1.0, 1.0, 8));
  at::Tensor mean = built->named_buffers()["head.0.channel_bn.running_mean"];
  at::Tensor var = built->named_buffers()["head.0.channel_bn.running_var"];
  mean.copy_(at::linspace(-0.2, 0.3, 8));
  var.copy_(at::linspace(0.5, 1.5, 8));
  const at::Tensor features = at::randn({4, 8});
  const at::Tensor normalized = (features - mean) / at::sqrt(var + 1e-5) * bn_weight + bn_bias;
  const at::Tensor expected = at::linear(
      normalized, parameters["head.0.clf.clf.0.weight"], parameters["head.0.clf.clf.0.bias"]);
  // float32, the same operations in the same order up to BatchNorm's fused form: a few ulps
  EXPECT_TRUE(at::allclose(built->forward_head(features), expected, 1e-5, 1e-6));

  model.head_channel_bn = 4; // not the trunk's width
  EXPECT_THROW(models::build_model(model), ConfigError);
  expect_refused({
      {{"MODEL.TRUNK.NAME=mlp", "MODEL.HEAD.PARAMS=[[eval_mlp, {dims: [256, 3]}]]"},
       {"MODEL.HEAD.PARAMS[0].in_channels", "0"}},
      {{"MODEL.TRUNK.NAME=mlp",
        "MODEL.HEAD.PARAMS=[[eval_mlp, {in_channels: 256, dims: [256, 3]}], [eval_mlp, "
        "{in_channels: 256, dims: [256, 3]}]]"},
       {"MODEL.HEAD.PARAMS", "LINEAR_EVAL_FEAT_POOL_OPS_MAP"}},
  });
}

} // namespace
} // namespace largo::train::trainer_config_mapping_test
