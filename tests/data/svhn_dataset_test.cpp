// SVHN's MAT-files, written by scipy.io.savemat (tests/reference/gen_svhn_mat_files.py: an
// independent writer of the format), compressed as SVHN's own files are and not.
#include "largo/data/svhn_dataset.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "largo/core/error.h"
#include "largo/data/matlab_file.h"
#include "temp_dir.h"
#include "test_paths.h"

namespace largo::data::svhn_dataset_test {
namespace {

using testing::TempDir;
using testing::write_file;

class SvhnDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string(LARGO_PYTHON).empty()) {
      GTEST_SKIP() << "no Python with scipy (LARGO_PYTHON)";
    }
    const std::string command = fmt::format(
        LARGO_PYTHON " {}/reference/gen_svhn_mat_files.py {}",
        largo::test_paths::data_dir(),
        dir_.path().string());
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  std::string error_of(const std::string& case_name) {
    try {
      SvhnDataset::load(dir_.path() / case_name, Split::kTest);
    } catch (const DataError& error) {
      return error.what();
    }
    return "(accepted)";
  }
  TempDir dir_;
};

// Every pixel of every image is (n + 3c + 5h + 7w) % 256 at [n, c, h, w], as torchvision's
// transpose of X (3, 2, 0, 1) gives it; label 10 reads as the digit 0.
void expect_images_and_labels(const SvhnDataset& dataset, const std::vector<int64_t>& labels) {
  ASSERT_EQ(dataset.size(), static_cast<int64_t>(labels.size()));
  ASSERT_EQ(dataset.images().sizes(), (at::IntArrayRef{dataset.size(), 3, 32, 32}));
  EXPECT_TRUE(dataset.labels().equal(at::tensor(labels, at::kLong))) << dataset.labels();
  const at::Tensor images = dataset.images();
  const auto pixels = images.accessor<uint8_t, 4>();
  for (int64_t n = 0; n < dataset.size(); ++n) {
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t h = 0; h < 32; ++h) {
        for (int64_t w = 0; w < 32; ++w) {
          ASSERT_EQ(pixels[n][c][h][w], (n + 3 * c + 5 * h + 7 * w) % 256)
              << "image " << n << " pixel " << c << "," << h << "," << w;
        }
      }
    }
  }
}

TEST_F(SvhnDatasetTest, ReadsCompressedAndPlainFilesAsTorchvisionDoes) {
  expect_images_and_labels(SvhnDataset::load(dir_.path() / "compressed", Split::kTrain), {0, 1, 7});
  expect_images_and_labels(SvhnDataset::load(dir_.path() / "plain", Split::kTest), {5, 0});
  const auto arrays = read_matlab_arrays(dir_.path() / "plain" / "test_32x32.mat", {"X", "y"});
  EXPECT_EQ(arrays.at("X").dims, (std::vector<int64_t>{32, 32, 3, 2}));
  EXPECT_EQ(arrays.at("y").values.scalar_type(), at::kByte);
}

TEST_F(SvhnDatasetTest, BadFilesAreRefusedNamingTheFile) {
  std::string message = error_of("bad_label");
  EXPECT_NE(message.find("labels must be the integers 1..10, found 0..3"), std::string::npos)
      << message;
  message = error_of("not_integer");
  EXPECT_NE(message.find("labels must be the integers 1..10"), std::string::npos) << message;
  message = error_of("wrong_shape");
  EXPECT_NE(message.find("X is [32, 32, 1, 2] of Byte, expected uint8 [32, 32, 3, N]"),
            std::string::npos)
      << message;
  message = error_of("missing");
  EXPECT_NE(message.find("missing/test_32x32.mat does not exist"), std::string::npos) << message;
  // Not a MAT-file, a truncated one, a -v7.3 (HDF5) one, a variable that is absent.
  std::filesystem::create_directories(dir_.path() / "junk");
  write_file(dir_.path() / "junk" / "test_32x32.mat", std::string(200, 'x'));
  message = error_of("junk");
  EXPECT_NE(message.find("is not a MATLAB 5.0 MAT-file"), std::string::npos) << message;
  write_file(
      dir_.path() / "junk" / "test_32x32.mat", "MATLAB 7.3 MAT-file, Platform: x" +
                                                   std::string(200, ' '));
  message = error_of("junk");
  EXPECT_NE(message.find("-v7.3, an HDF5 file"), std::string::npos) << message;
  const auto plain = dir_.path() / "plain" / "test_32x32.mat";
  std::string bytes;
  {
    std::ifstream in(plain, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  write_file(dir_.path() / "junk" / "test_32x32.mat", bytes.substr(0, bytes.size() - 100));
  message = error_of("junk");
  EXPECT_NE(message.find("truncated or corrupt"), std::string::npos) << message;
  EXPECT_NE(message.find("junk/test_32x32.mat"), std::string::npos) << message;
  try {
    read_matlab_arrays(plain, {"X", "Z"});
    ADD_FAILURE() << "a missing variable was accepted";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("has no variable 'Z'"), std::string::npos)
        << error.what();
  }
}

} // namespace
} // namespace largo::data::svhn_dataset_test
