// VISSL's command line as its users type it (train/config_composition.h): config=<name> and
// +config/<group>=<option> looked up under LARGO_CONFIG_ROOT, merged in order before the
// overrides, and DATASET_NAMES resolved through the dataset catalog
// (train/dataset_catalog.h) that VISSL_DATASET_CATALOG_PATH names, with the file named.
#include "apps/program_runner.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

namespace largo::testing::vissl_command_line_test {
namespace {

void write(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

// A config tree in VISSL's layout: a base config whose data is named with VISSL's empty
// DATA_PATHS, a fragment that changes its optimizer, and a catalog of that dataset. (`largo
// config` reads no data, so the catalog's paths need not exist.)
struct ViSSLTree {
  explicit ViSSLTree(const std::filesystem::path& root) : root(root) {
    write(root / "config/benchmark/eval_base.yaml", R"(# @package _global_
config:
  DATA:
    TRAIN: {DATA_SOURCES: [torchvision_dataset], DATASET_NAMES: [FashionMNIST], DATA_PATHS: [],
            BATCHSIZE_PER_REPLICA: 8}
    TEST: {DATA_SOURCES: [torchvision_dataset], DATASET_NAMES: [FashionMNIST], DATA_PATHS: [],
           BATCHSIZE_PER_REPLICA: 8}
  MODEL:
    TRUNK: {NAME: small_cnn}
  OPTIMIZER: {num_epochs: 3, param_schedulers: {lr: {name: constant, value: 0.1}}}
)");
    write(root / "config/benchmark/models/slow.yaml", R"(# @package _global_
config:
  OPTIMIZER: {num_epochs: 5, momentum: 0.8}
)");
    write(root / "config/dataset_catalog.json", R"({
    "FashionMNIST": {
        "train": ["/data/tiny/train", "<unused>"],
        "val": ["/data/tiny/val", "<unused>"]
    }
})");
  }
  std::filesystem::path root;
};

ProgramResult largo_config(
    const ViSSLTree& tree,
    const std::vector<std::string>& arguments,
    std::map<std::string, std::string> env = {}) {
  std::vector<std::string> argv = {largo_program(), "config"};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  env.emplace("LARGO_CONFIG_ROOT", tree.root.string());
  return run_program(argv, env, std::chrono::seconds(60));
}

TEST(VisslCommandLineTest, FragmentsMergeAfterThePrimaryConfigAndBeforeOverrides) {
  TestDir dir;
  const ViSSLTree tree(dir.path() / "configs");
  const ProgramResult run = largo_config(
      tree,
      {"config=benchmark/eval_base", "+config/benchmark/models=slow", "OPTIMIZER.num_epochs=7"});
  ASSERT_TRUE(run.exited_with(0)) << run.status() << "\n" << run.output;
  EXPECT_NE(run.output.find("momentum: 0.8"), std::string::npos) << run.output; // the fragment's
  EXPECT_NE(run.output.find("num_epochs: 7"), std::string::npos) << run.output; // the override's
  EXPECT_NE(run.output.find("BATCHSIZE_PER_REPLICA: 8"), std::string::npos) << run.output;
  // The catalog beside the tree resolved the dataset, and says which file it read.
  EXPECT_NE(run.output.find("/data/tiny/train"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("/data/tiny/val"), std::string::npos) << run.output;
  EXPECT_NE(
      run.output.find(
          "through the dataset catalog " + (tree.root / "config/dataset_catalog.json").string()),
      std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("fashion-mnist"), std::string::npos) << run.output;
}

TEST(VisslCommandLineTest, AMissingConfigOrFragmentNamesTheFileAndTheRoot) {
  TestDir dir;
  const ViSSLTree tree(dir.path() / "configs");
  for (const std::vector<std::string>& arguments :
       {std::vector<std::string>{"config=benchmark/nope"},
        std::vector<std::string>{"config=benchmark/eval_base", "+config/benchmark/models=nope"}}) {
    const ProgramResult run = largo_config(tree, arguments);
    EXPECT_TRUE(run.exited_with(2)) << run.status() << "\n" << run.output;
    EXPECT_NE(run.output.find("nope.yaml"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("LARGO_CONFIG_ROOT"), std::string::npos) << run.output;
  }
}

// A dataset the catalog lacks is refused naming the key, the dataset and the catalog: never
// Largo's default Fashion-MNIST path.
TEST(VisslCommandLineTest, ADatasetTheCatalogLacksIsRefusedNamingIt) {
  TestDir dir;
  const ViSSLTree tree(dir.path() / "configs");
  const ProgramResult run =
      largo_config(tree, {"config=benchmark/eval_base", "DATA.TEST.DATASET_NAMES=[MNIST]"});
  EXPECT_TRUE(run.exited_with(2)) << run.status() << "\n" << run.output;
  EXPECT_NE(run.output.find("DATA.TEST.DATASET_NAMES = [MNIST]"), std::string::npos) << run.output;
  EXPECT_NE(
      run.output.find("dataset_catalog.json has no \"val\" split of MNIST"), std::string::npos)
      << run.output;
  // VISSL's variable points at another catalog, which is used instead.
  write(
      dir.path() / "other.json",
      R"({"MNIST": {"train": ["/mnist/train", ""], "val": ["/mnist/val", ""]},
            "FashionMNIST": {"train": ["/t/train", ""], "val": ["/t/val", ""]}})");
  const ProgramResult other = largo_config(
      tree,
      {"config=benchmark/eval_base", "DATA.TEST.DATASET_NAMES=[MNIST]"},
      {{"VISSL_DATASET_CATALOG_PATH", (dir.path() / "other.json").string()}});
  ASSERT_TRUE(other.exited_with(0)) << other.status() << "\n" << other.output;
  EXPECT_NE(other.output.find("/mnist/val"), std::string::npos) << other.output;
  EXPECT_NE(other.output.find("/t/train"), std::string::npos) << other.output;
}

} // namespace
} // namespace largo::testing::vissl_command_line_test
