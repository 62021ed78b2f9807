// train/option_keys.h: the library's errors, which name its options, reach a `largo` user in
// the YAML keys they wrote, each in its own class; what no key sets stays as the library said.
#include <largo/core/error.h>
#include <largo/optim/adamw.h>
#include <largo/optim/sgd.h>
#include <largo/train/option_keys.h>

#include <gtest/gtest.h>

#include <string>

namespace largo::train {
namespace {

// What `throwing` throws once rethrown in YAML keys, caught as E.
template <typename E, typename Throwing>
std::string message_in_keys(Throwing&& throwing) {
  try {
    rethrow_with_yaml_keys(throwing);
  } catch (const E& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "another class: " << error.what();
    return "";
  }
  ADD_FAILURE() << "nothing thrown";
  return "";
}

TEST(OptionKeys, AnOptionErrorBecomesAConfigErrorNamingTheKey) {
  EXPECT_EQ(
      message_in_keys<ConfigError>([] {
        throw OptionError("ResNetOptions::depth", "7", "one of 18, 34, 50, 101, 152, 200");
      }),
      "config key MODEL.TRUNK.RESNETS.DEPTH = 7: expected one of 18, 34, 50, 101, 152, 200");
  // A field under a prefix entry, and the expectation's option names too.
  EXPECT_EQ(
      message_in_keys<ConfigError>(
          [] { throw OptionError("RegNetOptions::w_0", "12", "a multiple of 8, > 0"); }),
      "config key MODEL.TRUNK.REGNET.w_0 = 12: expected a multiple of 8, > 0");
  EXPECT_EQ(
      message_in_keys<ConfigError>([] {
        throw OptionError("VitOptions::num_heads", "5", "a divisor of VitOptions::hidden_dim 768");
      }),
      "config key MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS = 5: expected a divisor of "
      "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM 768");
}

TEST(OptionKeys, AnOptionNoKeySetsStaysTheLibrarysOptionError) {
  try {
    rethrow_with_yaml_keys([] { throw OptionError("MyOptions::width", "0", "> 0"); });
    FAIL() << "nothing thrown";
  } catch (const OptionError& error) {
    EXPECT_EQ(error.option(), "MyOptions::width");
  }
}

TEST(OptionKeys, OtherErrorsKeepTheirClassWithTheirMessageInKeys) {
  EXPECT_EQ(
      message_in_keys<DataError>([] {
        throw DataError("not found; point DataSourceOptions::path (test split) at its folder");
      }),
      "not found; point DATA.TEST.DATA_PATHS at its folder");
  EXPECT_EQ(
      message_in_keys<TrainingError>([] {
        throw TrainingError("use DistributedDataParallelOptions::manual_reduction = true");
      }),
      "use DISTRIBUTED.MANUAL_GRADIENT_REDUCTION = true");
  EXPECT_EQ(
      message_in_keys<CheckpointError>([] { throw CheckpointError("a file is truncated"); }),
      "a file is truncated");
}

// The optimizer's own message (optim/optimizer.cpp), through the table's phrases: the keys
// to set for either way on.
TEST(OptionKeys, AnOptimizerMismatchReadsInYamlKeys) {
  at::Tensor weight = torch::zeros({2}, torch::requires_grad());
  optim::ParamGroup group;
  group.params = {weight};
  group.names = {"weight"};
  optim::AdamW adamw({group}, optim::AdamWOptions{});
  optim::SGD sgd({group}, optim::SGDOptions{});
  const std::string message =
      message_in_keys<CheckpointError>([&] { sgd.load_state_dict(adamw.state_dict()); });
  EXPECT_NE(message.find("set OPTIMIZER.name to the checkpoint's optimizer"), std::string::npos)
      << message;
  EXPECT_NE(
      message.find("a new run (another CHECKPOINT.DIR) with MODEL.WEIGHTS_INIT.PARAMS_FILE set "
                   "to the checkpoint"),
      std::string::npos)
      << message;
}

} // namespace
} // namespace largo::train
