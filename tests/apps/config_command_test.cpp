// `largo config` refuses every combination `largo train` refuses, with the same message and
// before any data is read: both go through train::resolve_run. Each case points the data at
// a directory that does not exist, so a message about the data would mean it got that far.
#include "apps/program_runner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace largo::testing::config_command_test {
namespace {

struct RefusedConfig {
  std::string what;
  std::vector<std::string> overrides;
  std::string message; // a part of the error both commands print
};

std::vector<RefusedConfig> refused_configs() {
  const std::string fsdp = "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True";
  return {
      {"FSDP with ZeRO-1/2", {fsdp, "OPTIMIZER.use_zero=True"}, "are both on"},
      {"a linear evaluation with FSDP",
       {fsdp,
        "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
        "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True"},
       "FSDP shards trained units, and the frozen trunk is none"},
      {"fp32_reduce_scatter without AMP",
       {fsdp, "MODEL.FSDP_CONFIG.fp32_reduce_scatter=True"},
       "fp32_reduce_scatter needs mixed_precision"},
      {"compute copies without AMP",
       {fsdp, "MODEL.FSDP_CONFIG.compute_dtype=bfloat16"},
       "compute_dtype bfloat16 needs mixed_precision"},
      {"ZeRO with Apex O2 master weights",
       {"OPTIMIZER.use_zero=True",
        "MODEL.AMP_PARAMS.USE_AMP=True",
        "MODEL.AMP_PARAMS.DTYPE=bfloat16",
        "MODEL.AMP_PARAMS.AMP_ARGS={opt_level: O2}"},
       "sharding float32 master weights is not built"},
      {"more checkpointing splits than trunk blocks",
       {"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
        "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=9"},
       "NUM_ACTIVATION_CHECKPOINTING_SPLITS = 9"},
      {"test images of another size than the training images",
       {"DATA.TRAIN.TRANSFORMS=[{name: RandomCrop, size: 24}, {name: ToTensor}]"},
       "DATA.TEST yields 1x28x28 images but the model is built for DATA.TRAIN's 1x24x24"},
      {"more test classes than the head has",
       {"DATA.TEST.DATA_SOURCES=[synthetic]",
        "DATA.TEST.SYNTHETIC.NUM_CLASSES=20",
        "DATA.TEST.SYNTHETIC.IMAGE_SHAPE=[1,28,28]"},
       "DATA.TEST has 20 classes but the model's head has 10 outputs"},
      {"auto LR scaling without a batch to scale by",
       {"OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale=True",
        "OPTIMIZER.param_schedulers.lr.auto_lr_scaling.scaling_type=cubic"},
       "scaling_type"},
  };
}

TEST(ConfigCommandTest, RefusesWhatTrainRefusesBeforeReadingData) {
  TestDir dir;
  for (const RefusedConfig& refused : refused_configs()) {
    SCOPED_TRACE(refused.what);
    std::vector<std::string> overrides = {
        "DATA.TRAIN.DATA_PATHS=[" + (dir / "no_data").string() + "]",
        "DATA.TEST.DATA_PATHS=[" + (dir / "no_data").string() + "]",
        "MODEL.TRUNK.NAME=small_cnn",
        "CHECKPOINT.DIR=" + (dir / "run").string()};
    overrides.insert(overrides.end(), refused.overrides.begin(), refused.overrides.end());
    for (const std::string command : {"config", "train"}) {
      std::vector<std::string> argv = {largo_program(), command};
      argv.insert(argv.end(), overrides.begin(), overrides.end());
      const ProgramResult run = run_program(argv, {}, std::chrono::seconds(60));
      EXPECT_TRUE(run.exited_with(2)) << command << ": " << run.status() << "\n" << run.output;
      EXPECT_NE(run.output.find(refused.message), std::string::npos) << command << ":\n"
                                                                     << run.output;
      EXPECT_EQ(run.output.find("no_data"), std::string::npos) << command << ":\n" << run.output;
    }
  }
}

} // namespace
} // namespace largo::testing::config_command_test
