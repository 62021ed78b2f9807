// VISSL's dataset catalog (train/dataset_catalog.h): DATASET_NAMES without DATA_PATHS read
// their paths from it, per split, as VISSL's get_data_files does; what it cannot resolve is
// refused naming the key, the dataset and the file, never left at Largo's default path.
#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/train/dataset_catalog.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace largo::train::dataset_catalog_test {
namespace {
namespace fs = std::filesystem;

class DatasetCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("largo_dataset_catalog_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    catalog_ = dir_ / "dataset_catalog.json";
    std::ofstream(catalog_) << R"({
    "in1k_folder": {"train": ["/in1k/train", "<unused>"], "val": ["/in1k/val", "<unused>"]},
    "in1k_filelist": {"train": ["/l/train_images.npy", "/l/train_labels.npy"],
                      "val": ["/l/val_images.npy", "/l/val_labels.npy"]},
    "train_only": {"train": ["/t/train", ""]}
})";
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }
  static Config with(const std::vector<std::string>& overrides) {
    Config config = Config::defaults();
    for (const std::string& assignment : overrides) {
      config.apply_override(assignment);
    }
    return config;
  }
  fs::path dir_;
  fs::path catalog_;
};

TEST_F(DatasetCatalogTest, EachSplitReadsItsOwnEntryAndFileListsTheirLabels) {
  Config config = with(
      {"DATA.TRAIN.DATA_SOURCES=[disk_folder]",
       "DATA.TRAIN.DATASET_NAMES=[in1k_folder]",
       "DATA.TEST.DATA_SOURCES=[disk_filelist]",
       "DATA.TEST.LABEL_SOURCES=[disk_filelist]",
       "DATA.TEST.DATASET_NAMES=[in1k_filelist]"});
  const std::vector<std::string> notes = resolve_dataset_names(config, catalog_);
  EXPECT_EQ(
      config.get_string_list("DATA.TRAIN.DATA_PATHS"), std::vector<std::string>{"/in1k/train"});
  EXPECT_TRUE(config.get_string_list("DATA.TRAIN.LABEL_PATHS").empty()); // folders are labels
  EXPECT_EQ(
      config.get_string_list("DATA.TEST.DATA_PATHS"),
      std::vector<std::string>{"/l/val_images.npy"});
  EXPECT_EQ(
      config.get_string_list("DATA.TEST.LABEL_PATHS"),
      std::vector<std::string>{"/l/val_labels.npy"});
  ASSERT_EQ(notes.size(), 2U);
  EXPECT_NE(
      notes[0].find(
          "DATA.TRAIN.DATASET_NAMES [in1k_folder] through the dataset catalog " +
          catalog_.string()),
      std::string::npos)
      << notes[0];
}

TEST_F(DatasetCatalogTest, GivenPathsAndLargosOwnDefaultsAreLeftAsTheyAre) {
  Config given = with(
      {"DATA.TRAIN.DATA_SOURCES=[disk_folder]",
       "DATA.TRAIN.DATASET_NAMES=[in1k_folder]",
       "DATA.TRAIN.DATA_PATHS=[/mine]"});
  EXPECT_TRUE(resolve_dataset_names(given, catalog_).empty());
  EXPECT_EQ(given.get_string_list("DATA.TRAIN.DATA_PATHS"), std::vector<std::string>{"/mine"});
  // Largo's default dataset named as the defaults name it: its default path is no guess.
  Config defaults = with({"DATA.TRAIN.DATASET_NAMES=[FashionMNIST]"});
  EXPECT_TRUE(resolve_dataset_names(defaults, std::nullopt).empty());
  Config synthetic =
      with({"DATA.TRAIN.DATA_SOURCES=[synthetic]", "DATA.TRAIN.DATASET_NAMES=[anything]"});
  EXPECT_TRUE(resolve_dataset_names(synthetic, std::nullopt).empty());
}

TEST_F(DatasetCatalogTest, WhatCannotBeResolvedIsRefusedNamingKeyDatasetAndFile) {
  auto message = [&](const std::vector<std::string>& overrides,
                     const std::optional<fs::path>& catalog) {
    Config config = with(overrides);
    try {
      resolve_dataset_names(config, catalog);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string no_catalog = message({"DATA.TRAIN.DATASET_NAMES=[in1k_folder]"}, std::nullopt);
  EXPECT_NE(
      no_catalog.find("config key DATA.TRAIN.DATASET_NAMES = [in1k_folder]"), std::string::npos)
      << no_catalog;
  EXPECT_NE(no_catalog.find("VISSL_DATASET_CATALOG_PATH"), std::string::npos) << no_catalog;
  const std::string no_split = message({"DATA.TEST.DATASET_NAMES=[train_only]"}, catalog_);
  EXPECT_NE(
      no_split.find(catalog_.string() + " has no \"val\" split of train_only"), std::string::npos)
      << no_split;
  // An explicitly empty DATA_PATHS asks the catalog too (VISSL's own default).
  const std::string unknown =
      message({"DATA.TRAIN.DATASET_NAMES=[FashionMNIST]", "DATA.TRAIN.DATA_PATHS=[]"}, catalog_);
  EXPECT_NE(
      unknown.find("no \"train\" split of FashionMNIST (it names: in1k_filelist, "
                   "in1k_folder, train_only)"),
      std::string::npos)
      << unknown;
  std::ofstream(dir_ / "bad.json") << "[1, 2]";
  EXPECT_THROW(DatasetCatalog::read(dir_ / "bad.json"), ConfigError);
  std::ofstream(dir_ / "bad_split.json") << R"({"x": {"train": "/not/a/list"}})";
  try {
    DatasetCatalog::read(dir_ / "bad_split.json");
    FAIL() << "a split that is no list was read";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"x\".\"train\" is not a list"), std::string::npos)
        << e.what();
  }
}

TEST_F(DatasetCatalogTest, TheCatalogIsVisslsVariableElseTheOneBesideTheConfigs) {
  auto no_variable = [](const char*) -> const char* { return nullptr; };
  EXPECT_FALSE(find_dataset_catalog(dir_ / "configs", no_variable));
  fs::create_directories(dir_ / "configs" / "config");
  fs::copy_file(catalog_, dir_ / "configs" / "config" / "dataset_catalog.json");
  EXPECT_EQ(
      find_dataset_catalog(dir_ / "configs", no_variable),
      dir_ / "configs" / "config" / "dataset_catalog.json");
  const std::string variable = catalog_.string();
  auto set = [&](const char*) -> const char* { return variable.c_str(); };
  EXPECT_EQ(find_dataset_catalog(dir_ / "configs", set), catalog_);
  auto missing = [](const char*) -> const char* { return "/no/such/catalog.json"; };
  EXPECT_THROW(find_dataset_catalog(dir_ / "configs", missing), ConfigError);
}

} // namespace
} // namespace largo::train::dataset_catalog_test
