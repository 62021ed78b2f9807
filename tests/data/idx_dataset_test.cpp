// idx (MNIST / Fashion-MNIST) parsing: small files written by the test, raw and gzip,
// every malformed-file error, and the real Fashion-MNIST when it is installed.
#include "largo/data/idx_dataset.h"

#include <fstream>

#include <gtest/gtest.h>
#include <zlib.h>

#include "largo/core/error.h"
#include "largo/data/dataset_factory.h"
#include "temp_dir.h"

namespace largo::data::idx_dataset_test {
namespace {

using testing::TempDir;

void append_u32(std::string& bytes, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) {
    bytes.push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

// An idx3 image file: num_images images of rows x cols, pixel (n, r, c) = n*31 + r*7 + c.
std::string image_file_bytes(
    uint32_t num_images, uint32_t rows, uint32_t cols, uint32_t magic = IdxDataset::kImagesMagic) {
  std::string bytes;
  append_u32(bytes, magic);
  append_u32(bytes, num_images);
  append_u32(bytes, rows);
  append_u32(bytes, cols);
  for (uint32_t n = 0; n < num_images; ++n) {
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t c = 0; c < cols; ++c) {
        bytes.push_back(static_cast<char>((n * 31 + r * 7 + c) & 0xff));
      }
    }
  }
  return bytes;
}

std::string label_file_bytes(const std::vector<uint8_t>& labels) {
  std::string bytes;
  append_u32(bytes, IdxDataset::kLabelsMagic);
  append_u32(bytes, static_cast<uint32_t>(labels.size()));
  for (uint8_t label : labels) {
    bytes.push_back(static_cast<char>(label));
  }
  return bytes;
}

void write_raw(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gzip(const std::filesystem::path& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(
      gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
      static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

// Runs `load` and returns the DataError message (fails the test if none is thrown).
template <typename Fn>
std::string data_error_message(Fn&& load) {
  try {
    load();
  } catch (const DataError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a DataError";
  return "";
}

TEST(IdxDataset, LoadsRawFiles) {
  TempDir dir;
  write_raw(dir.path() / "train-images-idx3-ubyte", image_file_bytes(3, 4, 5));
  write_raw(dir.path() / "train-labels-idx1-ubyte", label_file_bytes({7, 0, 9}));

  const IdxDataset dataset = IdxDataset::load(dir.path(), Split::kTrain);
  EXPECT_EQ(dataset.size(), 3);
  EXPECT_EQ(dataset.sample_shape(), (std::vector<int64_t>{1, 4, 5}));
  EXPECT_EQ(dataset.num_classes(), 10);
  const at::Tensor images = dataset.images();
  ASSERT_EQ(images.sizes().vec(), (std::vector<int64_t>{3, 1, 4, 5}));
  EXPECT_EQ(images.scalar_type(), at::kByte);
  EXPECT_EQ(images[2][0][3][4].item<int64_t>(), 2 * 31 + 3 * 7 + 4);
  EXPECT_EQ(images[1][0][0][1].item<int64_t>(), 31 + 1);
  const at::Tensor labels = dataset.labels();
  EXPECT_EQ(labels.scalar_type(), at::kLong);
  EXPECT_TRUE(labels.equal(at::tensor({7, 0, 9}, at::kLong)));
}

TEST(IdxDataset, LoadsGzipFilesAndTheTestSplit) {
  TempDir dir;
  write_gzip(dir.path() / "t10k-images-idx3-ubyte.gz", image_file_bytes(2, 3, 3));
  write_gzip(dir.path() / "t10k-labels-idx1-ubyte.gz", label_file_bytes({4, 5}));

  const IdxDataset dataset = IdxDataset::load(dir.path(), Split::kTest);
  EXPECT_EQ(dataset.size(), 2);
  EXPECT_EQ(dataset.images()[1][0][2][1].item<int64_t>(), 31 + 2 * 7 + 1);
  EXPECT_TRUE(dataset.labels().equal(at::tensor({4, 5}, at::kLong)));
  // The train split is not there: asking for it must fail, not return the test split.
  EXPECT_THROW(IdxDataset::load(dir.path(), Split::kTrain), DataError);
}

TEST(IdxDataset, TruncatedFileNamesTheFileAndTheExpectedAndActualBytes) {
  TempDir dir;
  const auto path = dir.path() / "train-images-idx3-ubyte";
  std::string bytes = image_file_bytes(3, 4, 5); // 16 + 60 bytes
  bytes.resize(16 + 40);
  write_raw(path, bytes);
  const std::string message = data_error_message([&] { IdxDataset::read_images(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find("76"), std::string::npos) << message; // expected
  EXPECT_NE(message.find("56"), std::string::npos) << message; // actual
}

TEST(IdxDataset, HeaderClaimingBillionsOfImagesIsRefusedBeforeAllocating) {
  // 2^32 - 1 images of 28x28 would be 3.4 TB; the file has a few bytes. Raw and gzip.
  TempDir dir;
  std::string bytes = image_file_bytes(2, 28, 28);
  bytes[4] = bytes[5] = bytes[6] = bytes[7] = static_cast<char>(0xff);
  for (const auto& name : {"train-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz"}) {
    const auto path = dir.path() / name;
    if (path.extension() == ".gz") {
      write_gzip(path, bytes);
    } else {
      write_raw(path, bytes);
    }
    const std::string message = data_error_message([&] { IdxDataset::read_images(path); });
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find("4294967295 images of 28x28"), std::string::npos) << message;
    EXPECT_NE(message.find("truncated or damaged"), std::string::npos) << message;
  }
  std::string labels = label_file_bytes({1, 2});
  labels[4] = labels[5] = labels[6] = labels[7] = static_cast<char>(0xff);
  write_raw(dir.path() / "l", labels);
  const std::string message = data_error_message([&] { IdxDataset::read_labels(dir.path() / "l"); });
  EXPECT_NE(message.find("4294967295 labels"), std::string::npos) << message;
}

TEST(IdxDataset, TruncatedGzipContentIsReportedInDecompressedBytes) {
  TempDir dir;
  const auto path = dir.path() / "train-labels-idx1-ubyte.gz";
  std::string bytes = label_file_bytes({1, 2, 3, 4, 5}); // 8 + 5 bytes
  bytes.resize(8 + 2);
  write_gzip(path, bytes);
  const std::string message = data_error_message([&] { IdxDataset::read_labels(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("13 bytes after decompression"), std::string::npos) << message;
  EXPECT_NE(message.find("has 10"), std::string::npos) << message;
}

TEST(IdxDataset, CutGzipStreamIsADataErrorNamingTheFile) {
  TempDir dir;
  const auto whole = dir.path() / "whole.gz";
  write_gzip(whole, image_file_bytes(40, 28, 28));
  std::ifstream in(whole, std::ios::binary);
  std::string compressed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto cut = dir.path() / "train-images-idx3-ubyte.gz";
  write_raw(cut, compressed.substr(0, compressed.size() / 2));
  const std::string message = data_error_message([&] { IdxDataset::read_images(cut); });
  EXPECT_NE(message.find(cut.string()), std::string::npos) << message;
}

TEST(IdxDataset, FileLongerThanItsHeaderIsRejected) {
  TempDir dir;
  const auto path = dir.path() / "labels";
  write_raw(path, label_file_bytes({1, 2}) + "xyz");
  const std::string message = data_error_message([&] { IdxDataset::read_labels(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("expected 10 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("has 13"), std::string::npos) << message;
}

TEST(IdxDataset, BadMagicNumberIsRejected) {
  TempDir dir;
  const auto path = dir.path() / "train-images-idx3-ubyte";
  write_raw(path, image_file_bytes(1, 2, 2, /*magic=*/2049));
  const std::string message = data_error_message([&] { IdxDataset::read_images(path); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("2049"), std::string::npos) << message;
  EXPECT_NE(message.find("expected 2051"), std::string::npos) << message;
}

TEST(IdxDataset, MissingFilesListThePathsTriedAndHowToGetTheData) {
  TempDir dir;
  const std::string message =
      data_error_message([&] { IdxDataset::load(dir.path(), Split::kTrain); });
  EXPECT_NE(message.find((dir.path() / "train-images-idx3-ubyte").string()), std::string::npos)
      << message;
  EXPECT_NE(message.find((dir.path() / "train-images-idx3-ubyte.gz").string()), std::string::npos)
      << message;
  EXPECT_NE(message.find("apt-get install dataset-fashion-mnist"), std::string::npos) << message;
  EXPECT_NE(message.find("DataSourceOptions::path (train split)"), std::string::npos) << message;
}

TEST(IdxDataset, ImageAndLabelCountsMustMatch) {
  TempDir dir;
  write_raw(dir.path() / "train-images-idx3-ubyte", image_file_bytes(3, 2, 2));
  write_raw(dir.path() / "train-labels-idx1-ubyte", label_file_bytes({1, 2}));
  const std::string message =
      data_error_message([&] { IdxDataset::load(dir.path(), Split::kTrain); });
  EXPECT_NE(message.find("3 images"), std::string::npos) << message;
  EXPECT_NE(message.find("2 labels"), std::string::npos) << message;
}

TEST(IdxDataset, LabelOutOfRangeIsRejected) {
  TempDir dir;
  write_raw(dir.path() / "train-images-idx3-ubyte", image_file_bytes(2, 2, 2));
  write_raw(dir.path() / "train-labels-idx1-ubyte", label_file_bytes({3, 10}));
  const std::string message =
      data_error_message([&] { IdxDataset::load(dir.path(), Split::kTrain); });
  EXPECT_NE(message.find("label 10"), std::string::npos) << message;
}

// The model is planned for MNIST's 28x28 before the files are read: a test split of 27x28
// images is refused when opened, naming the split, the file and both sizes (not a shape error
// in the first layer).
TEST(IdxDataset, ImagesOfAnotherSizeThanMnistsAreRefusedNamingTheFile) {
  TempDir dir;
  write_raw(dir.path() / "t10k-images-idx3-ubyte", image_file_bytes(2, 27, 28));
  write_raw(dir.path() / "t10k-labels-idx1-ubyte", label_file_bytes({1, 2}));
  DataSourceOptions options;
  options.source = "torchvision_dataset";
  options.dataset_name = "FashionMNIST";
  options.path = dir.path();
  const std::string message =
      data_error_message([&] { open_dataset(options, Split::kTest, /*seed=*/0); });
  EXPECT_NE(
      message.find(
          "DataSplitOptions (test split): " + (dir.path() / "t10k-images-idx3-ubyte").string() +
          " holds 27x28 images"),
      std::string::npos)
      << message;
  EXPECT_NE(message.find("FashionMNIST images are 28x28"), std::string::npos) << message;

  write_raw(dir.path() / "t10k-images-idx3-ubyte", image_file_bytes(2, 28, 28));
  EXPECT_EQ(open_dataset(options, Split::kTest, 0).sample_shape, (std::vector<int64_t>{1, 28, 28}));
}

TEST(IdxDataset, RealFashionMnist) {
  if (!std::filesystem::is_directory(kFashionMnistSystemDir)) {
    GTEST_SKIP() << kFashionMnistSystemDir << " is absent (apt-get install dataset-fashion-mnist)";
  }
  const IdxDataset train = IdxDataset::load(kFashionMnistSystemDir, Split::kTrain);
  ASSERT_EQ(train.size(), 60000);
  EXPECT_EQ(train.sample_shape(), (std::vector<int64_t>{1, 28, 28}));
  // Reference values from Python (numpy over the decompressed files): the first labels,
  // 6000 samples per class, the sum of the first image and of all images.
  EXPECT_TRUE(
      train.labels().narrow(0, 0, 10).equal(at::tensor({9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, at::kLong)));
  EXPECT_TRUE(at::bincount(train.labels()).equal(at::full({10}, 6000, at::kLong)));
  EXPECT_EQ(train.images()[0].sum().item<int64_t>(), 76247);
  EXPECT_EQ(train.images().sum(at::kLong).item<int64_t>(), 3431114169LL);

  const IdxDataset test = IdxDataset::load(kFashionMnistSystemDir, Split::kTest);
  ASSERT_EQ(test.size(), 10000);
  EXPECT_EQ(test.sample_shape(), (std::vector<int64_t>{1, 28, 28}));
  EXPECT_EQ(test.labels().min().item<int64_t>(), 0);
  EXPECT_EQ(test.labels().max().item<int64_t>(), 9);
}

} // namespace
} // namespace largo::data::idx_dataset_test
