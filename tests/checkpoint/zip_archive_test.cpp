// The zip layer under every checkpoint read: CRC-32 checks that refuse a flipped bit in a
// tensor or in the pickle (naming the file and the entry), and the damaged or foreign files
// (a directory, truncated, not a zip) that must be refused before anything is allocated.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/zip_archive.h>
#include <largo/core/error.h>

#include "checkpoint/checkpoint_test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace largo::checkpoint::zip_archive_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::checkpoint_error;
using largo::testing::flip_bits_in_entry;

class ZipArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format(
               "largo_zip_{}_{}",
               ::getpid(),
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    StateDict state = make_state_dict();
    state.insert("model", torch::arange(1000, torch::kFloat));
    state.insert("epoch", int64_t{4});
    save_checkpoint(dir_ / "good.torch", state);
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }

  // A copy of good.torch with a bit flipped in the middle of entry `entry`.
  fs::path flipped(const std::string& entry) {
    const fs::path copy = dir_ / "flipped.torch";
    fs::copy_file(dir_ / "good.torch", copy, fs::copy_options::overwrite_existing);
    flip_bits_in_entry(copy, entry, ZipArchive(copy).find(entry)->size / 2);
    return copy;
  }

  std::string refusal(const fs::path& path) {
    return checkpoint_error([&] { load_checkpoint(path); });
  }

  fs::path dir_;
};

TEST_F(ZipArchiveTest, EntriesAndTheirCrcsAreRead) {
  ZipArchive archive(dir_ / "good.torch");
  EXPECT_NE(archive.find("archive/data.pkl"), nullptr);
  const ZipArchive::Entry* data = archive.find("archive/data/0");
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(data->size, 4000u);
  std::vector<float> values(1000);
  archive.read_into(*data, values.data());
  EXPECT_EQ(values[999], 999.0f);
  EXPECT_NO_THROW(archive.verify_all());
}

TEST_F(ZipArchiveTest, FlippedBitInTensorDataIsRefusedNamingFileAndEntry) {
  const fs::path path = flipped("archive/data/0");
  const std::string message = refusal(path);
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("archive/data/0"), std::string::npos) << message;
  EXPECT_NE(message.find("CRC-32"), std::string::npos) << message;
  EXPECT_THROW(ZipArchive(path).verify_all(), CheckpointError);
}

TEST_F(ZipArchiveTest, FlippedBitInThePickleIsRefused) {
  const std::string message = refusal(flipped("archive/data.pkl"));
  EXPECT_NE(message.find("archive/data.pkl"), std::string::npos) << message;
  EXPECT_NE(message.find("CRC-32"), std::string::npos) << message;
}

TEST_F(ZipArchiveTest, DirectoryTruncatedAndForeignFilesAreRefused) {
  fs::create_directories(dir_ / "dir.torch");
  std::string message = refusal(dir_ / "dir.torch");
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;

  // Every cut of the file is refused (the directory sits at its end).
  const auto size = fs::file_size(dir_ / "good.torch");
  for (uint64_t cut : {uint64_t{1}, size / 3, size - 30, size - 1}) {
    fs::copy_file(dir_ / "good.torch", dir_ / "cut.torch", fs::copy_options::overwrite_existing);
    fs::resize_file(dir_ / "cut.torch", cut);
    message = refusal(dir_ / "cut.torch");
    EXPECT_NE(message.find("cut.torch"), std::string::npos) << cut << ": " << message;
  }
  std::ofstream(dir_ / "text.torch") << "this is not a checkpoint\n";
  message = refusal(dir_ / "text.torch");
  EXPECT_NE(message.find("not a torch file"), std::string::npos) << message;
}

TEST(Crc32, MatchesTheZipReferenceValue) {
  // The check value of CRC-32/ISO-HDLC, the zip polynomial.
  EXPECT_EQ(crc32_of("123456789", 9), 0xcbf43926u);
  EXPECT_EQ(crc32_of("6789", 4, crc32_of("12345", 5)), 0xcbf43926u);
}

} // namespace
} // namespace largo::checkpoint::zip_archive_test
