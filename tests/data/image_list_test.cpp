// disk_folder lists exactly what torchvision's ImageFolder lists, in its order (baseline:
// torchvision run on the same tree of names); disk_filelist reads VISSL's .npy pair.
#include "largo/data/image_list.h"

#include <fstream>

#include <gtest/gtest.h>

#include "data/image_test_util.h"
#include "data/temp_dir.h"
#include "largo/core/error.h"
#include "largo/data/npy.h"

namespace largo::data::image_list_test {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

void touch(const fs::path& path) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "x";
}

TEST(ImageFolder, ListsTorchvisionsClassesAndSampleOrder) {
  TempDir dir;
  const auto& reference = testing::image_baselines()["image_folder"];
  for (const auto& relative : reference["files"]) {
    touch(dir.path() / relative.get<std::string>());
  }
  const ImageList list = list_image_folder(dir.path());
  EXPECT_EQ(list.class_names, reference["classes"].get<std::vector<std::string>>());
  ASSERT_EQ(list.paths.size(), reference["samples"].size());
  for (size_t i = 0; i < list.paths.size(); ++i) {
    EXPECT_EQ(
        fs::path(list.paths[i]).lexically_relative(dir.path()).string(),
        reference["samples"][i][0].get<std::string>())
        << "sample " << i;
    EXPECT_EQ(list.labels[i], reference["samples"][i][1].get<int64_t>()) << "sample " << i;
  }
  EXPECT_EQ(list.num_classes(), static_cast<int64_t>(list.class_names.size()));
}

TEST(ImageFolder, FollowsSymlinkedClassFolders) {
  TempDir dir;
  touch(dir.path() / "elsewhere" / "b.jpg");
  touch(dir.path() / "root" / "real" / "a.jpg");
  fs::create_directory_symlink(dir.path() / "elsewhere", dir.path() / "root" / "linked");
  const ImageList list = list_image_folder(dir.path() / "root");
  EXPECT_EQ(list.class_names, (std::vector<std::string>{"linked", "real"}));
  EXPECT_EQ(list.labels, (std::vector<int64_t>{0, 1}));
}

TEST(ImageFolder, EmptyClassesAndMissingRootsAreErrors) {
  TempDir dir;
  touch(dir.path() / "cat" / "1.jpg");
  touch(dir.path() / "dog" / "readme.txt"); // no image: an empty class
  try {
    list_image_folder(dir.path());
    FAIL() << "an empty class folder was accepted";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("dog"), std::string::npos) << error.what();
  }
  // Allowed, the class keeps its label (as torchvision's allow_empty would).
  const ImageList list = list_image_folder(dir.path(), /*allow_empty_classes=*/true);
  EXPECT_EQ(list.class_names, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(list.num_classes(), 2);
  EXPECT_EQ(list.size(), 1);
  EXPECT_THROW(list_image_folder(dir.path() / "nowhere"), DataError);
  TempDir flat;
  touch(flat.path() / "1.jpg");
  EXPECT_THROW(list_image_folder(flat.path()), DataError); // no class folder
}

TEST(ImageFilelist, ReadsVisslsNpyPair) {
  TempDir dir;
  write_npy_strings(
      dir.path() / "paths.npy", {"/old/root/a.jpg", "/old/root/b.png", "/other/c.jpg"});
  write_npy(dir.path() / "labels.npy", at::tensor(std::vector<int32_t>{2, 0, 1}, at::kInt));
  const ImageList list =
      list_image_filelist(dir.path() / "paths.npy", dir.path() / "labels.npy", "/old/root", "/new");
  EXPECT_EQ(list.paths, (std::vector<std::string>{"/new/a.jpg", "/new/b.png", "/other/c.jpg"}));
  EXPECT_EQ(list.labels, (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(list.num_classes(), 3);

  write_npy(dir.path() / "short.npy", at::tensor(std::vector<int64_t>{1, 2}, at::kLong));
  EXPECT_THROW(list_image_filelist(dir.path() / "paths.npy", dir.path() / "short.npy"), DataError);
  write_npy(dir.path() / "negative.npy", at::tensor(std::vector<int64_t>{1, -1, 0}, at::kLong));
  EXPECT_THROW(
      list_image_filelist(dir.path() / "paths.npy", dir.path() / "negative.npy"), DataError);
  EXPECT_THROW(
      list_image_filelist(dir.path() / "labels.npy", dir.path() / "labels.npy"), DataError);
}

} // namespace
} // namespace largo::data::image_list_test
