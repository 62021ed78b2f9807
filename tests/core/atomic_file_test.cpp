// Atomic file replacement: content lands whole, no temporary is left, errors name the path.
#include <largo/core/atomic_file.h>
#include <largo/core/error.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace largo::atomic_file_test {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(AtomicFileTest, ReplacesContentAndLeavesNoTemporary) {
  fs::path dir = fs::temp_directory_path() / "largo_atomic_file_test";
  fs::remove_all(dir);
  write_file_atomically(dir / "sub" / "a.txt", "first");
  write_file_atomically(dir / "sub" / "a.txt", "second, longer");
  EXPECT_EQ(read_all(dir / "sub" / "a.txt"), "second, longer");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "sub"), fs::directory_iterator()), 1);
  fs::remove_all(dir);
}

TEST(AtomicFileTest, FailureNamesThePathAndKeepsTheOldFile) {
  fs::path dir = fs::temp_directory_path() / "largo_atomic_file_fail";
  fs::remove_all(dir);
  write_file_atomically(dir / "keep.txt", "old");
  // Renaming a file onto a non-empty directory fails after the temporary was written.
  fs::create_directories(dir / "target" / "inside");
  try {
    write_file_atomically(dir / "target", "new");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_all(dir / "keep.txt"), "old");
  EXPECT_TRUE(fs::is_directory(dir / "target"));
  // The failed write cleaned up its temporary.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);
  fs::remove_all(dir);
}

} // namespace
} // namespace largo::atomic_file_test
