// CIFAR-100 binary parsing with synthetic files written by the test.
#include "largo/data/cifar100_dataset.h"

#include <fstream>

#include <gtest/gtest.h>

#include "largo/core/error.h"
#include "temp_dir.h"

namespace largo::data::cifar100_dataset_test {
namespace {

using testing::TempDir;
using testing::write_file;

// One record per (coarse, fine) pair; image byte (c, h, w) of record n = (n + 3c + 5h + 7w) %
// 256, as the format lays it out: coarse label, fine label, then the channels one by one.
std::string cifar100_bytes(const std::vector<std::pair<uint8_t, uint8_t>>& labels) {
  std::string bytes;
  for (size_t n = 0; n < labels.size(); ++n) {
    bytes.push_back(static_cast<char>(labels[n].first));
    bytes.push_back(static_cast<char>(labels[n].second));
    for (int c = 0; c < 3; ++c) {
      for (int h = 0; h < 32; ++h) {
        for (int w = 0; w < 32; ++w) {
          bytes.push_back(static_cast<char>((n + 3 * c + 5 * h + 7 * w) % 256));
        }
      }
    }
  }
  return bytes;
}

TEST(Cifar100Dataset, ReadsTheFineLabelsAndChannelMajorImages) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "cifar-100-binary");
  write_file(dir.path() / "cifar-100-binary" / "test.bin", cifar100_bytes({{3, 99}, {19, 0}}));
  const Cifar100Dataset dataset = Cifar100Dataset::load(dir.path(), Split::kTest);
  ASSERT_EQ(dataset.size(), 2);
  EXPECT_EQ(dataset.num_classes(), 100);
  EXPECT_EQ(dataset.sample_shape(), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_EQ(dataset.labels()[0].item<int64_t>(), 99);
  EXPECT_EQ(dataset.labels()[1].item<int64_t>(), 0);
  const at::Tensor images = dataset.images();
  for (int64_t n : {0, 1}) {
    for (int64_t c : {0, 2}) {
      for (int64_t h : {0, 17, 31}) {
        for (int64_t w : {0, 5, 31}) {
          EXPECT_EQ(images[n][c][h][w].item<int64_t>(), (n + 3 * c + 5 * h + 7 * w) % 256);
        }
      }
    }
  }
}

TEST(Cifar100Dataset, MissingSplitNamesBothPlacesTried) {
  TempDir dir;
  write_file(dir.path() / "test.bin", cifar100_bytes({{0, 1}}));
  try {
    Cifar100Dataset::load(dir.path(), Split::kTrain);
    FAIL() << "expected a DataError";
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find((dir.path() / "train.bin").string()), std::string::npos) << message;
    EXPECT_NE(message.find("cifar-100-binary.tar.gz"), std::string::npos) << message;
  }
}

// A CIFAR-10 file (3073-byte records) is not a whole number of CIFAR-100 records.
TEST(Cifar100Dataset, FileOfAnotherRecordSizeIsADataErrorNamingIt) {
  TempDir dir;
  write_file(dir.path() / "train.bin", std::string(3073 * 2, '\0'));
  try {
    Cifar100Dataset::load(dir.path(), Split::kTrain);
    FAIL() << "expected a DataError";
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find((dir.path() / "train.bin").string()), std::string::npos) << message;
    EXPECT_NE(message.find("3074"), std::string::npos) << message;
  }
}

TEST(Cifar100Dataset, FineLabelOutOfRangeIsRefused) {
  TempDir dir;
  write_file(dir.path() / "train.bin", cifar100_bytes({{0, 100}}));
  EXPECT_THROW(Cifar100Dataset::load(dir.path(), Split::kTrain), DataError);
}

} // namespace
} // namespace largo::data::cifar100_dataset_test
