// STL-10 binary parsing with synthetic files written by the test, laid out as the dataset's
// files are (and as torchvision's STL10 reads them: reshape to [n, 3, 96, 96], swap the last
// two axes, labels minus 1).
#include "largo/data/stl10_dataset.h"

#include <fstream>

#include <gtest/gtest.h>

#include "largo/core/error.h"
#include "temp_dir.h"

namespace largo::data::stl10_dataset_test {
namespace {

using testing::TempDir;
using testing::write_file;

// The value of pixel (row h, column w) of channel c of image n.
int64_t pixel(int64_t n, int64_t c, int64_t h, int64_t w) {
  return (n + 3 * c + 5 * h + 11 * w) % 256;
}

// `count` images, each channel written column by column (the column's rows consecutive).
std::string stl10_images(int64_t count) {
  std::string bytes;
  for (int64_t n = 0; n < count; ++n) {
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t w = 0; w < 96; ++w) {
        for (int64_t h = 0; h < 96; ++h) {
          bytes.push_back(static_cast<char>(pixel(n, c, h, w)));
        }
      }
    }
  }
  return bytes;
}

TEST(Stl10Dataset, ReadsColumnMajorChannelsRowMajorAndLabelsFromZero) {
  TempDir dir;
  const auto folder = dir.path() / "stl10_binary";
  std::filesystem::create_directories(folder);
  write_file(folder / "train_X.bin", stl10_images(2));
  write_file(folder / "train_y.bin", std::string{'\x01', '\x0a'});
  const Stl10Dataset dataset = Stl10Dataset::load(dir.path(), Split::kTrain);
  ASSERT_EQ(dataset.size(), 2);
  EXPECT_EQ(dataset.sample_shape(), (std::vector<int64_t>{3, 96, 96}));
  EXPECT_EQ(dataset.labels()[0].item<int64_t>(), 0);
  EXPECT_EQ(dataset.labels()[1].item<int64_t>(), 9);
  const at::Tensor images = dataset.images();
  for (int64_t n : {0, 1}) {
    for (int64_t c : {0, 1, 2}) {
      for (int64_t h : {0, 1, 50, 95}) {
        for (int64_t w : {0, 2, 77, 95}) {
          EXPECT_EQ(images[n][c][h][w].item<int64_t>(), pixel(n, c, h, w))
              << n << " " << c << " " << h << " " << w;
        }
      }
    }
  }
}

TEST(Stl10Dataset, LabelAndImageCountsMustAgree) {
  TempDir dir;
  write_file(dir.path() / "test_X.bin", stl10_images(2));
  write_file(dir.path() / "test_y.bin", std::string{'\x01'});
  try {
    Stl10Dataset::load(dir.path(), Split::kTest);
    FAIL() << "expected a DataError";
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("2 images"), std::string::npos) << message;
    EXPECT_NE(message.find("1 labels"), std::string::npos) << message;
  }
}

TEST(Stl10Dataset, LabelZeroIsRefused) {
  TempDir dir;
  write_file(dir.path() / "test_X.bin", stl10_images(1));
  write_file(dir.path() / "test_y.bin", std::string{'\x00'});
  EXPECT_THROW(Stl10Dataset::load(dir.path(), Split::kTest), DataError);
}

TEST(Stl10Dataset, MissingLabelFileIsADataErrorNamingIt) {
  TempDir dir;
  write_file(dir.path() / "test_X.bin", stl10_images(1));
  try {
    Stl10Dataset::load(dir.path(), Split::kTest);
    FAIL() << "expected a DataError";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("test_y.bin"), std::string::npos) << error.what();
  }
}

} // namespace
} // namespace largo::data::stl10_dataset_test
