// VISSL's COPY_TO_LOCAL_DISK copy: what is copied where, what is reused, and what is refused
// rather than overwritten.
#include "largo/data/local_copy.h"

#include <fstream>

#include <gtest/gtest.h>

#include "largo/core/error.h"
#include "temp_dir.h"

namespace largo::data::local_copy_test {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string error_of(const fs::path& source, const fs::path& destination) {
  try {
    copy_to_local_disk(source, destination);
  } catch (const DataError& error) {
    return error.what();
  }
  return "";
}

TEST(LocalCopy, CopiesAFolderOnceAndReusesTheCompleteCopy) {
  TempDir dir;
  const fs::path source = dir.path() / "shared" / "train";
  write_text(source / "cat" / "1.png", "one");
  write_text(source / "dog" / "2.png", "two");
  const fs::path local = dir.path() / "local";
  const fs::path copy = copy_to_local_disk(source, local);
  EXPECT_EQ(copy, local / "train");
  EXPECT_EQ(local_copy_path(source, local), copy);
  EXPECT_EQ(read_text(copy / "cat" / "1.png"), "one");
  EXPECT_EQ(read_text(copy / "dog" / "2.png"), "two");
  EXPECT_TRUE(fs::is_regular_file(copy / "copy_complete"));
  // A complete copy is read as it is: a change to the source is not copied again.
  write_text(source / "cat" / "1.png", "changed");
  EXPECT_EQ(copy_to_local_disk(source, local), copy);
  EXPECT_EQ(read_text(copy / "cat" / "1.png"), "one");
  // Nothing but the copy is left in the destination (no temporary).
  EXPECT_EQ(std::distance(fs::directory_iterator(local), fs::directory_iterator()), 1);
}

TEST(LocalCopy, CopiesAFileAndReusesOneOfTheSameSize) {
  TempDir dir;
  const fs::path source = dir.path() / "lists" / "train_images.npy";
  write_text(source, "0123456789");
  const fs::path local = dir.path() / "local";
  EXPECT_EQ(copy_to_local_disk(source, local), local / "train_images.npy");
  EXPECT_EQ(read_text(local / "train_images.npy"), "0123456789");
  EXPECT_EQ(copy_to_local_disk(source, local), local / "train_images.npy");
  write_text(source, "a longer list");
  const std::string message = error_of(source, local);
  EXPECT_NE(message.find("another size"), std::string::npos) << message;
  EXPECT_EQ(read_text(local / "train_images.npy"), "0123456789"); // not overwritten
}

// What is in the way is the user's: an incomplete folder is named, never replaced.
TEST(LocalCopy, RefusesToReplaceAFolderThatIsNotACompleteCopy) {
  TempDir dir;
  const fs::path source = dir.path() / "shared" / "train";
  write_text(source / "a" / "1.png", "one");
  write_text(dir.path() / "local" / "train" / "mine.txt", "keep");
  const std::string message = error_of(source, dir.path() / "local");
  EXPECT_NE(message.find((dir.path() / "local" / "train").string()), std::string::npos) << message;
  EXPECT_NE(message.find("copy_complete"), std::string::npos) << message;
  EXPECT_EQ(read_text(dir.path() / "local" / "train" / "mine.txt"), "keep");
}

TEST(LocalCopy, RefusesAMissingSourceAndTheSourceItself) {
  TempDir dir;
  const std::string missing = error_of(dir.path() / "nothing", dir.path() / "local");
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;
  const fs::path source = dir.path() / "data" / "train";
  write_text(source / "a" / "1.png", "one");
  const std::string itself = error_of(source, dir.path() / "data");
  EXPECT_NE(itself.find("itself"), std::string::npos) << itself;
  EXPECT_FALSE(fs::exists(source / "copy_complete"));
}

} // namespace
} // namespace largo::data::local_copy_test
