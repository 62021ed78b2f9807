// The forms of VISSL's command line (train/config_composition.h), sorted and looked up as
// Hydra does; the end-to-end merge order is tests/apps/vissl_command_line_test.cpp's.
#include <largo/core/error.h>
#include <largo/train/config_composition.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace largo::train::config_composition_test {
namespace {
namespace fs = std::filesystem;

TEST(ConfigCompositionTest, ArgumentsAreSortedByForm) {
  const ConfigArguments parsed = parse_config_arguments(
      {"config=pretrain/swav/swav_8node_resnet",
       "+config/pretrain/swav/models=regnet16Gf",
       "config.OPTIMIZER.num_epochs=2",
       "+MODEL.AMP_PARAMS.AMP_ARGS.opt_level=O1",
       "DATA.TRAIN.DATA_PATHS=[/x]"});
  EXPECT_FALSE(parsed.file);
  EXPECT_EQ(parsed.primary, "pretrain/swav/swav_8node_resnet");
  EXPECT_EQ(parsed.fragments, std::vector<std::string>{"pretrain/swav/models=regnet16Gf"});
  EXPECT_EQ(parsed.overrides.size(), 3U);
  const ConfigArguments file = parse_config_arguments({"run.yaml", "SEED_VALUE=3"});
  EXPECT_EQ(file.file, fs::path("run.yaml"));
  EXPECT_THROW(parse_config_arguments({"run.yaml", "config=a"}), ConfigError);
  EXPECT_THROW(parse_config_arguments({"config=a", "config=b"}), ConfigError);
  EXPECT_THROW(parse_config_arguments({"SEED_VALUE=3", "run.yaml"}), ConfigError);
}

TEST(ConfigCompositionTest, NamesAreLookedUpUnderTheRootsConfigTree) {
  const fs::path root = fs::temp_directory_path() / ("largo_compose_" + std::to_string(::getpid()));
  fs::create_directories(root / "config" / "a" / "models");
  std::ofstream(root / "config" / "a" / "base.yaml") << "config: {SEED_VALUE: 4}\n";
  std::ofstream(root / "config" / "a" / "models" / "m.yaml") << "config: {SEED_VALUE: 5}\n";
  EXPECT_EQ(primary_config_file(root, "a/base"), root / "config" / "a" / "base.yaml");
  EXPECT_EQ(primary_config_file(root, "a/base.yaml"), root / "config" / "a" / "base.yaml");
  EXPECT_EQ(fragment_file(root, "a/models=m"), root / "config" / "a" / "models" / "m.yaml");
  EXPECT_THROW(fragment_file(root, "a/models"), ConfigError); // no =option
  EXPECT_THROW(primary_config_file(root, ""), ConfigError);
  ConfigArguments arguments;
  arguments.primary = "a/base";
  EXPECT_EQ(compose_config(arguments, root).get_int("SEED_VALUE"), 4);
  arguments.fragments = {"a/models=m"};
  EXPECT_EQ(compose_config(arguments, root).get_int("SEED_VALUE"), 5);
  arguments.overrides = {"SEED_VALUE=6"};
  EXPECT_EQ(compose_config(arguments, root).get_int("SEED_VALUE"), 6);
  auto variable = [&](const char*) -> const char* { return "/vissl/configs"; };
  EXPECT_EQ(config_root(variable), fs::path("/vissl/configs"));
  EXPECT_EQ(config_root([](const char*) -> const char* { return nullptr; }), fs::path("configs"));
  fs::remove_all(root);
}

} // namespace
} // namespace largo::train::config_composition_test
