// Config parsing, merging, overrides and every error path of the config layer.
#include <largo/core/config.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <limits>
#include <fstream>

namespace largo::config_test {
namespace {

// Runs `fn` and returns the ConfigError's message; fails the test if nothing is thrown.
template <typename Fn>
std::string config_error_message(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

TEST(ConfigTest, DefaultsAreVisslDefaults) {
  Config config = Config::defaults();
  EXPECT_EQ(config.get_int("LOG_FREQUENCY"), 10);
  EXPECT_EQ(config.get_string("OPTIMIZER.name"), "sgd");
  EXPECT_DOUBLE_EQ(config.get_double("OPTIMIZER.momentum"), 0.9);
  EXPECT_DOUBLE_EQ(config.get_double("OPTIMIZER.larc_config.eps"), 1e-8);
  EXPECT_EQ(config.get_int_list("OPTIMIZER.param_schedulers.lr.milestones"),
            (std::vector<int64_t>{30, 60}));
  EXPECT_FALSE(config.get_bool("MODEL.AMP_PARAMS.USE_AMP"));
  EXPECT_EQ(config.get_string("MODEL.FSDP_CONFIG.AMP_TYPE"), "01"); // quoted digits stay a string
}

TEST(ConfigTest, MergesVisslLayoutAndBareFragments) {
  Config config = Config::defaults();
  config.merge_yaml(R"(# @package _global_
config:
  OPTIMIZER:
    momentum: .5
    weight_decay: 1e-5
VERSION: 1
engine_name: train
)",
                    "vissl.yaml");
  EXPECT_DOUBLE_EQ(config.get_double("OPTIMIZER.momentum"), 0.5);
  EXPECT_DOUBLE_EQ(config.get_double("OPTIMIZER.weight_decay"), 1e-5);
  config.merge_yaml("OPTIMIZER:\n  nesterov: True\n", "fragment.yaml");
  EXPECT_TRUE(config.get_bool("OPTIMIZER.nesterov"));
  // Untouched keys keep their defaults.
  EXPECT_EQ(config.get_int("OPTIMIZER.num_epochs"), 90);
}

// VISSL's engine_name (Hydra's top level): from a file in VISSL's layout or beside a bare
// fragment, or from an override, the last one given winning; written back by to_yaml, so a
// run's train_config.yaml keeps it; anything but a name is refused naming the key.
TEST(ConfigTest, KeepsVisslsEngineName) {
  Config config = Config::defaults();
  EXPECT_EQ(config.engine_name(), "train"); // VISSL's default
  config.merge_yaml("engine_name: extract_features\nconfig:\n  SEED_VALUE: 3\n", "a.yaml");
  EXPECT_EQ(config.engine_name(), "extract_features");
  EXPECT_EQ(config.get_int("SEED_VALUE"), 3);
  config.merge_yaml("engine_name: extract_cluster\nSEED_VALUE: 4\n", "bare.yaml");
  EXPECT_EQ(config.engine_name(), "extract_cluster");
  EXPECT_EQ(config.get_int("SEED_VALUE"), 4);
  config.merge_yaml("config:\n  SEED_VALUE: 5\n", "no_engine.yaml");
  EXPECT_EQ(config.engine_name(), "extract_cluster"); // a file without one leaves it
  config.apply_override("engine_name=extract_features");
  EXPECT_EQ(config.engine_name(), "extract_features");

  Config reloaded = Config::defaults();
  reloaded.merge_yaml(config.to_yaml(), "train_config.yaml");
  EXPECT_EQ(reloaded.engine_name(), "extract_features");
  EXPECT_EQ(reloaded.get_int("SEED_VALUE"), 5);

  EXPECT_THROW(
      {
        try {
          config.merge_yaml("engine_name: [train]\nconfig: {}\n", "list.yaml");
        } catch (const ConfigError& e) {
          EXPECT_NE(std::string(e.what()).find("list.yaml: engine_name = "), std::string::npos)
              << e.what();
          throw;
        }
      },
      ConfigError);
  // Under config: it is no key of Largo's tree (nor of VISSL's).
  EXPECT_THROW(config.apply_override("config.engine_name=train"), ConfigError);
}

TEST(ConfigTest, SeedSnippetsParseVerbatim) {
  Config config = Config::defaults();
  config.merge_yaml(R"(
OPTIMIZER:
  name: "sgd"
  use_larc: False  # supported for SGD only for now
  larc_config:
    clip: False
    eps: 1e-08
    trust_coefficient: 0.001
)",
                    "larc snippet");
  config.merge_yaml(R"(
MODEL:
  AMP_PARAMS:
    USE_AMP: True
    AMP_ARGS: {"opt_level": "O3", "keep_batchnorm_fp32": True, "master_weights": True, "loss_scale": "dynamic"}
)",
                    "amp snippet");
  config.merge_yaml(R"(
OPTIMIZER:
  name: zero
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
)",
                    "zero snippet");
  config.merge_yaml(R"(
DATA:
  TRAIN:
    USE_STATEFUL_DISTRIBUTED_SAMPLER: True
  TEST:
    USE_STATEFUL_DISTRIBUTED_SAMPLER: True
MODEL:
  ACTIVATION_CHECKPOINTING:
    USE_ACTIVATION_CHECKPOINTING: True
    NUM_ACTIVATION_CHECKPOINTING_SPLITS: 8
  SHARDED_DDP_SETUP:
    USE_SDP: True
    reduce_buffer_size: -1
  FSDP_CONFIG:
    AUTO_SETUP_FSDP: True
    AUTO_WRAP_THRESHOLD: 0
    AMP_TYPE: "01"
    flatten_parameters: True
    mixed_precision: True
    fp32_reduce_scatter: False
    compute_dtype: float32
    bucket_cap_mb: 0
    clear_autocast_cache: True
    verbose: True
DISTRIBUTED:
  MANUAL_GRADIENT_REDUCTION: True
)",
                    "large-scale snippets");
  EXPECT_EQ(config.get_string("OPTIMIZER.base_optimizer.name"), "sgd");
  EXPECT_EQ(config.get_int("MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS"), 8);
  EXPECT_EQ(config.node("MODEL.AMP_PARAMS.AMP_ARGS")["opt_level"].Scalar(), "O3");
}

TEST(ConfigTest, OverridesInBothForms) {
  Config config = Config::load({}, {"config.OPTIMIZER.momentum=0.8", "OPTIMIZER.nesterov=true",
                                    "OPTIMIZER.param_schedulers.lr.milestones=[10,20]",
                                    "+OPTIMIZER.base_optimizer.name=sgd"});
  EXPECT_DOUBLE_EQ(config.get_double("OPTIMIZER.momentum"), 0.8);
  EXPECT_TRUE(config.get_bool("OPTIMIZER.nesterov"));
  EXPECT_EQ(config.get_int_list("OPTIMIZER.param_schedulers.lr.milestones"),
            (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(config.get_string("OPTIMIZER.base_optimizer.name"), "sgd"); // a keyword map
}

// Hydra's "+KEY=VALUE" is checked like any override: a key nothing reads is refused.
TEST(ConfigTest, AddedKeysNothingReadsAreRefused) {
  auto message = config_error_message([] { Config::load({}, {"+MY.NEW_KEY=42"}); });
  EXPECT_NE(message.find("unknown config key MY;"), std::string::npos) << message;
  message = config_error_message([] { Config::load({}, {"+OPTIMIZER.momentun=0.9"}); });
  EXPECT_NE(message.find("did you mean OPTIMIZER.momentum"), std::string::npos) << message;
  EXPECT_DOUBLE_EQ(
      Config::load({}, {"+OPTIMIZER.momentum=0.5"}).get_double("OPTIMIZER.momentum"), 0.5);
}

// VISSL's keys that Largo lacks (configs/vissl_keys.yaml) load at VISSL's default, which
// changes nothing, and are refused at any other value as a VISSL feature, not as unknown.
TEST(ConfigTest, VisslKeysLargoLacksLoadAtTheirDefaultOnly) {
  Config config = Config::defaults();
  config.merge_yaml(
      R"(config:
  SLURM:
    USE_SLURM: false
    MEM_GB: 250
  LOSS:
    msn_loss:
      momentum: 0.996
      temperature: 0.1
  MODEL:
    TRUNK:
      XCIT: {NUM_LAYERS: 12, QKV_BIAS: True}
    TEMP_FROZEN_PARAMS_ITER_MAP: []
)",
      "vissl.yaml");
  EXPECT_FALSE(config.has("SLURM.USE_SLURM")) << "accepted, not merged: nothing reads it";

  auto message = config_error_message([] { Config::load({}, {"SLURM.USE_SLURM=true"}); });
  EXPECT_NE(
      message.find("SLURM.USE_SLURM = true: VISSL's SLURM is not available"), std::string::npos)
      << message;
  EXPECT_NE(message.find("VISSL's default, false"), std::string::npos) << message;
  EXPECT_NE(message.find("`srun largo train CONFIG` in an sbatch script"), std::string::npos)
      << "the way to run under SLURM instead:\n"
      << message;
  message = config_error_message([] {
    Config::load(
        {}, {"MODEL.NON_TRAINABLE_PARAMS=[module.heads.0.prototypes0.weight]"});
  });
  EXPECT_NE(
      message.find("VISSL's MODEL.NON_TRAINABLE_PARAMS is not available"), std::string::npos)
      << message;
  message = config_error_message([] {
    Config defaults = Config::defaults();
    defaults.merge_yaml("LOSS:\n  msn_loss:\n    momentum: 0.9\n", "user.yaml");
  });
  EXPECT_NE(
      message.find("user.yaml: config key LOSS.msn_loss.momentum = 0.9: VISSL's "
                   "LOSS.msn_loss is not available"),
      std::string::npos)
      << message;
  message = config_error_message([] { Config::load({}, {"+LOSS.msn_loss.momentm=0.996"}); });
  EXPECT_NE(message.find("unknown config key LOSS.msn_loss.momentm"), std::string::npos) << message;
  EXPECT_NE(message.find("neither Largo nor VISSL"), std::string::npos) << message;
}

// VISSL reads SLURM's other keys only to submit the job under USE_SLURM (refused above): with
// it off, VISSL's configs that name a CONSTRAINT or a PARTITION load; a map where VISSL has a
// value, or a name VISSL lacks, is still refused.
TEST(ConfigTest, SlurmKeysLoadAtAnyValueWhileUseSlurmIsOff) {
  Config config = Config::defaults();
  config.merge_yaml(
      "config:\n  SLURM:\n    CONSTRAINT: volta32gb\n    PARTITION: learnfair\n"
      "    MEM_GB: 480\n    ADDITIONAL_PARAMETERS: {exclusive: true}\n",
      "vissl.yaml");
  EXPECT_FALSE(config.has("SLURM.CONSTRAINT")) << "accepted, not merged: nothing reads it";
  auto message = config_error_message([] { Config::load({}, {"SLURM.CONSTRAINT={a: 1}"}); });
  EXPECT_NE(message.find("config key SLURM.CONSTRAINT"), std::string::npos) << message;
  message = config_error_message([] { Config::load({}, {"+SLURM.CONSTRANT=volta"}); });
  EXPECT_NE(message.find("unknown config key SLURM.CONSTRANT"), std::string::npos) << message;
}

// "Billion laughs": nine levels of aliases, each a list (or map) of nine of the level below,
// are 1 KB of YAML and 9^9 values. Refused at once, not walked for hours.
TEST(ConfigTest, NestedAliasBombsAreRefused) {
  for (const bool as_map : {false, true}) {
    std::string text = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n";
    for (int level = 1; level < 9; ++level) {
      std::string entries;
      for (int i = 0; i < 9; ++i) {
        const std::string alias = fmt::format("*a{}", level - 1);
        entries += (i ? ", " : "") + (as_map ? fmt::format("k{}: {}", i, alias) : alias);
      }
      text += fmt::format(
          "a{0}: &a{0} {1}{2}{3}\n", level, as_map ? "{" : "[", entries, as_map ? "}" : "]");
    }
    ASSERT_LT(text.size(), 2048u);
    Config config = Config::defaults();
    const std::string message =
        config_error_message([&] { config.merge_yaml(text, "laughs.yaml"); });
    EXPECT_NE(
        message.find("laughs.yaml: holds more than 262144 values once its YAML aliases"),
        std::string::npos)
        << message;
  }
  // A few aliases, as configs use them, are fine.
  Config config = Config::defaults();
  config.merge_yaml("OPTIMIZER:\n  betas: &b [0.9, 0.99]\n", "anchors.yaml");
  EXPECT_EQ(config.get_double_list("OPTIMIZER.betas"), (std::vector<double>{0.9, 0.99}));
}

TEST(ConfigTest, UnknownKeyNamesClosestValidKey) {
  auto message = config_error_message(
      [] { Config::load({}, {"OPTIMIZER.momentun=0.9"}); });
  EXPECT_NE(message.find("OPTIMIZER.momentun"), std::string::npos) << message;
  EXPECT_NE(message.find("did you mean OPTIMIZER.momentum"), std::string::npos) << message;

  // A key under the wrong parent: the suggestion is where the key really lives.
  Config config = Config::defaults();
  message = config_error_message(
      [&] { config.merge_yaml("DATA:\n  BATCHSIZE_PER_REPLICA: 32\n", "user.yaml"); });
  EXPECT_NE(message.find("user.yaml"), std::string::npos) << message;
  EXPECT_NE(message.find("DATA.TRAIN.BATCHSIZE_PER_REPLICA"), std::string::npos) << message;
}

TEST(ConfigTest, WrongTypeNamesKeyValueAndExpectation) {
  auto message =
      config_error_message([] { Config::load({}, {"DATA.TRAIN.BATCHSIZE_PER_REPLICA=abc"}); });
  EXPECT_NE(message.find("DATA.TRAIN.BATCHSIZE_PER_REPLICA = abc"), std::string::npos) << message;
  EXPECT_NE(message.find("an integer"), std::string::npos) << message;

  message = config_error_message([] { Config::load({}, {"OPTIMIZER.nesterov=3"}); });
  EXPECT_NE(message.find("a boolean"), std::string::npos) << message;

  message = config_error_message([] { Config::load({}, {"OPTIMIZER.betas=[0.9,x]"}); });
  EXPECT_NE(message.find("a list of numbers"), std::string::npos) << message;

  message = config_error_message([] { Config::load({}, {"OPTIMIZER=3"}); });
  EXPECT_NE(message.find("a map"), std::string::npos) << message;
}

TEST(ConfigTest, MalformedInputsAreClearErrors) {
  Config config = Config::defaults();
  auto message = config_error_message([&] { config.merge_yaml("OPTIMIZER: [\n", "broken.yaml"); });
  EXPECT_NE(message.find("broken.yaml: not valid YAML"), std::string::npos) << message;

  message = config_error_message([] { Config::load({"/nonexistent/largo.yaml"}); });
  EXPECT_NE(message.find("/nonexistent/largo.yaml"), std::string::npos) << message;

  message = config_error_message([] { Config::load({}, {"OPTIMIZER.momentum"}); });
  EXPECT_NE(message.find("expected KEY=VALUE"), std::string::npos) << message;

  message = config_error_message(
      [&] { config.merge_yaml("config:\n  SEED_VALUE: 1\nextra: 2\n", "top.yaml"); });
  EXPECT_NE(message.find("unknown top-level key 'extra'"), std::string::npos) << message;
}

TEST(ConfigTest, EffectiveConfigRoundTrips) {
  Config config = Config::load({}, {"SEED_VALUE=7", "OPTIMIZER.momentum=0.25"});
  Config again = Config::defaults();
  again.merge_yaml(config.to_yaml(), "effective.yaml");
  EXPECT_EQ(again.get_int("SEED_VALUE"), 7);
  EXPECT_DOUBLE_EQ(again.get_double("OPTIMIZER.momentum"), 0.25);
}

TEST(ConfigTest, FilesMergeInOrder) {
  auto dir = std::filesystem::temp_directory_path() / "largo_config_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a.yaml") << "config:\n  SEED_VALUE: 1\n  LOG_FREQUENCY: 5\n";
  std::ofstream(dir / "b.yaml") << "SEED_VALUE: 2\n";
  Config config = Config::load({dir / "a.yaml", dir / "b.yaml"}, {"LOG_FREQUENCY=3"});
  EXPECT_EQ(config.get_int("SEED_VALUE"), 2);
  EXPECT_EQ(config.get_int("LOG_FREQUENCY"), 3);
  std::filesystem::remove_all(dir);
}

// Issue 19: inputs a careless or hostile user gives, each refused in well under a second
// with a message that names the key or the file (and never the whole megabyte-long input).
TEST(ConfigTest, HugeIntegerIsRefusedNotACrash) {
  const std::string digits(50000, '7');
  auto message = config_error_message([&] { Config::load({}, {"SEED_VALUE=" + digits}); });
  EXPECT_NE(message.find("SEED_VALUE"), std::string::npos) << message;
  EXPECT_NE(message.find("between -9223372036854775808 and 9223372036854775807"),
            std::string::npos)
      << message;
  EXPECT_LT(message.size(), 400u);
  Config config = Config::defaults();
  message = config_error_message(
      [&] { config.merge_yaml("SEED_VALUE: 1000000000000000000000000000000\n", "big.yaml"); });
  EXPECT_NE(message.find("big.yaml: config key SEED_VALUE"), std::string::npos) << message;
  EXPECT_EQ(Config::load({}, {"SEED_VALUE=-9223372036854775808"}).get_int("SEED_VALUE"),
            std::numeric_limits<int64_t>::min());
}

TEST(ConfigTest, HugeUnknownKeyIsAbbreviatedAndQuick) {
  const std::string key(100000, 'A');
  const auto start = std::chrono::steady_clock::now();
  auto message = config_error_message([&] { Config::load({}, {"DATA." + key + "=1"}); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_NE(message.find("unknown config key DATA.AAAA"), std::string::npos) << message;
  EXPECT_NE(message.find("(100005 characters)"), std::string::npos) << message;
  EXPECT_LT(message.size(), 600u);
}

TEST(ConfigTest, OversizedConfigIsRefusedBeforeParsing) {
  std::string yaml = "config:\n  DATA:\n    TRAIN:\n      DATA_PATHS: [0";
  while (yaml.size() < 300 * 1024) {
    yaml += ",0";
  }
  yaml += "]\n";
  Config config = Config::defaults();
  const auto start = std::chrono::steady_clock::now();
  auto message = config_error_message([&] { config.merge_yaml(yaml, "big.yaml"); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_NE(message.find("big.yaml"), std::string::npos) << message;
  EXPECT_NE(message.find("at most 256 KiB"), std::string::npos) << message;
}

TEST(ConfigTest, DuplicateKeysSecondDocumentsAndNonScalarKeysAreRefused) {
  Config config = Config::defaults();
  auto message = config_error_message(
      [&] { config.merge_yaml("config:\n  SEED_VALUE: 1\n  SEED_VALUE: 2\n", "dup.yaml"); });
  EXPECT_NE(message.find("dup.yaml (line 3, column 3): key 'SEED_VALUE' appears twice"),
            std::string::npos)
      << message;
  // Inside a list of maps too (a transform given two names).
  message = config_error_message([&] {
    config.merge_yaml("DATA:\n  TRAIN:\n    TRANSFORMS:\n      - {name: ToTensor, name: Foo}\n",
                      "t.yaml");
  });
  EXPECT_NE(message.find("key 'name' appears twice"), std::string::npos) << message;
  message = config_error_message(
      [&] { config.merge_yaml("SEED_VALUE: 1\n---\nSEED_VALUE: 2\n", "two.yaml"); });
  EXPECT_NE(message.find("two.yaml: holds 2 YAML documents"), std::string::npos) << message;
  message = config_error_message([&] { config.merge_yaml("config:\n  [1, 2]: 3\n", "k.yaml"); });
  EXPECT_NE(message.find("k.yaml (line 2, column 3): a map key must be a name, got [1, 2]"),
            std::string::npos)
      << message;
  message = config_error_message([&] { Config::load({std::filesystem::temp_directory_path()}); });
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
}

TEST(ConfigTest, EditDistance) {
  EXPECT_EQ(edit_distance("momentum", "momentun"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

} // namespace
} // namespace largo::config_test

namespace largo::config_given_test {
namespace {

// What a file or an override set is told apart from Largo's defaults, even at the default's
// value; a resolution of the config (set_resolved) is not counted as given.
TEST(ConfigGivenTest, KeysSetByFilesAndOverridesAreGivenAndDefaultsAreNot) {
  Config config = Config::defaults();
  config.merge_yaml("config: {DATA: {TRAIN: {BATCHSIZE_PER_REPLICA: 32}}}", "test");
  config.apply_override("OPTIMIZER.momentum=0.9"); // the default's value
  EXPECT_TRUE(config.given("DATA.TRAIN.BATCHSIZE_PER_REPLICA"));
  EXPECT_TRUE(config.given("DATA.TRAIN")); // a key under it was set
  EXPECT_TRUE(config.given("OPTIMIZER.momentum"));
  EXPECT_FALSE(config.given("DATA.TRAIN.DATA_PATHS"));
  EXPECT_FALSE(config.given("DATA.TEST"));
  EXPECT_FALSE(config.given("DATA.TRAIN.BATCHSIZE")); // a prefix of a name is not a parent
  config.set_resolved("DATA.TRAIN.DATA_PATHS", YAML::Load("[/data/x]"));
  EXPECT_EQ(config.get_string_list("DATA.TRAIN.DATA_PATHS"), std::vector<std::string>{"/data/x"});
  EXPECT_FALSE(config.given("DATA.TRAIN.DATA_PATHS"));
  EXPECT_THROW(config.set_resolved("DATA.TRAIN.NO_SUCH_KEY", YAML::Load("1")), ConfigError);
  config.apply_override("DATA.TRAIN.DATA_PATHS=[/y]"); // recording resumed after the refusal
  EXPECT_TRUE(config.given("DATA.TRAIN.DATA_PATHS"));
}

} // namespace
} // namespace largo::config_given_test
