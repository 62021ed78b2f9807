// CIFAR-10 binary parsing with synthetic files written by the test.
#include "largo/data/cifar10_dataset.h"

#include <fstream>

#include <gtest/gtest.h>

#include "largo/core/error.h"
#include "temp_dir.h"

namespace largo::data::cifar10_dataset_test {
namespace {

using testing::TempDir;
using testing::write_file;

// `labels.size()` records; image byte (c, h, w) of record n = (n + 3c + 5h + 7w) % 256.
std::string cifar_bytes(const std::vector<uint8_t>& labels) {
  std::string bytes;
  for (size_t n = 0; n < labels.size(); ++n) {
    bytes.push_back(static_cast<char>(labels[n]));
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

TEST(Cifar10Dataset, ParsesRecordsChannelMajor) {
  TempDir dir;
  write_file(dir.path() / "test_batch.bin", cifar_bytes({3, 9, 0}));
  const Cifar10Dataset dataset = Cifar10Dataset::load(dir.path(), Split::kTest);
  ASSERT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.sample_shape(), (std::vector<int64_t>{3, 32, 32}));
  EXPECT_TRUE(dataset.labels().equal(at::tensor({3, 9, 0}, at::kLong)));
  const at::Tensor images = dataset.images();
  EXPECT_EQ(images[0][0][0][0].item<int64_t>(), 0);
  EXPECT_EQ(images[1][2][4][6].item<int64_t>(), (1 + 6 + 20 + 42) % 256);
  EXPECT_EQ(images[2][1][31][31].item<int64_t>(), (2 + 3 + 155 + 217) % 256);
}

TEST(Cifar10Dataset, TrainSplitConcatenatesTheFiveBatchesInOrder) {
  TempDir dir;
  // The tarball extracts into cifar-10-batches-bin/; load() looks there too.
  const auto sub = dir.path() / "cifar-10-batches-bin";
  std::filesystem::create_directories(sub);
  for (int i = 1; i <= 5; ++i) {
    write_file(
        sub / ("data_batch_" + std::to_string(i) + ".bin"),
        cifar_bytes({static_cast<uint8_t>(i), static_cast<uint8_t>(i + 1)}));
  }
  const Cifar10Dataset dataset = Cifar10Dataset::load(dir.path(), Split::kTrain);
  ASSERT_EQ(dataset.size(), 10);
  EXPECT_TRUE(dataset.labels().equal(at::tensor({1, 2, 2, 3, 3, 4, 4, 5, 5, 6}, at::kLong)));
}

TEST(Cifar10Dataset, MissingTrainBatchIsADataErrorNamingIt) {
  TempDir dir;
  for (int i : {1, 2, 4, 5}) {
    write_file(dir.path() / ("data_batch_" + std::to_string(i) + ".bin"), cifar_bytes({1}));
  }
  try {
    Cifar10Dataset::load(dir.path(), Split::kTrain);
    FAIL() << "expected a DataError";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("data_batch_3.bin"), std::string::npos)
        << error.what();
  }
}

TEST(Cifar10Dataset, MissingDirectoryIsADataError) {
  TempDir dir;
  try {
    Cifar10Dataset::load(dir.path() / "nowhere", Split::kTest);
    FAIL() << "expected a DataError";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("test_batch.bin"), std::string::npos) << error.what();
  }
}

TEST(Cifar10Dataset, TruncatedFileIsADataErrorNamingTheFileAndSize) {
  TempDir dir;
  const auto path = dir.path() / "test_batch.bin";
  std::string bytes = cifar_bytes({1, 2});
  bytes.resize(bytes.size() - 100); // 6046 bytes
  write_file(path, bytes);
  try {
    Cifar10Dataset::load(dir.path(), Split::kTest);
    FAIL() << "expected a DataError";
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find("6046 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("3073"), std::string::npos) << message;
  }
}

TEST(Cifar10Dataset, LabelOutOfRangeIsRejected) {
  TempDir dir;
  write_file(dir.path() / "test_batch.bin", cifar_bytes({1, 57}));
  EXPECT_THROW(Cifar10Dataset::load(dir.path(), Split::kTest), DataError);
}

} // namespace
} // namespace largo::data::cifar10_dataset_test
