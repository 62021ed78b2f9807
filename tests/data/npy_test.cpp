// The .npy reader against files NumPy wrote (baselines from gen_image_baselines.py), the
// writer byte for byte against NumPy, and malformed files.
#include "largo/data/npy.h"

#include <gtest/gtest.h>

#include "data/image_test_util.h"
#include "data/temp_dir.h"
#include "largo/core/error.h"

namespace largo::data::npy_test {
namespace {

using testing::TempDir;

// Base64 -> bytes (the baselines store NumPy's files that way).
std::vector<uint8_t> from_base64(const std::string& text) {
  static const std::string alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> bytes;
  uint32_t buffer = 0;
  int bits = 0;
  for (const char c : text) {
    const size_t value = alphabet.find(c);
    if (value == std::string::npos) {
      continue; // '=' padding
    }
    buffer = (buffer << 6) | static_cast<uint32_t>(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<uint8_t>((buffer >> bits) & 0xFF));
    }
  }
  return bytes;
}

class NumpyFiles : public ::testing::Test {
 protected:
  std::filesystem::path numpy_file(const std::string& name) {
    const auto path = dir_.path() / name;
    testing::write_bytes(
        path, from_base64(testing::image_baselines()["npy"][name].get<std::string>()));
    return path;
  }
  TempDir dir_;
};

TEST_F(NumpyFiles, ReadsStringsAndIntegersNumpyWrote) {
  const auto unicode = numpy_file("paths_unicode.npy");
  EXPECT_EQ(
      npy_strings(read_npy(unicode), unicode),
      (std::vector<std::string>{"/data/a/1.jpg", "/data/é/2.png", ""}));
  const auto bytes = numpy_file("paths_bytes.npy");
  EXPECT_EQ(
      npy_strings(read_npy(bytes), bytes), (std::vector<std::string>{"/x/1.jpg", "/yy/22.jpg"}));
  const auto int64 = numpy_file("labels_int64.npy");
  EXPECT_EQ(npy_integers(read_npy(int64), int64), (std::vector<int64_t>{0, 5, 2, 9}));
  const auto int32 = numpy_file("labels_int32_big.npy"); // big-endian '>i4'
  EXPECT_EQ(npy_integers(read_npy(int32), int32), (std::vector<int64_t>{3, 1, 70000}));
  const NpyArray floats = read_npy(numpy_file("floats_2d.npy"));
  EXPECT_EQ(floats.descr, "<f4");
  EXPECT_EQ(floats.shape, (std::vector<int64_t>{2, 3}));
}

TEST_F(NumpyFiles, WritesWhatNumpyWrites) {
  auto same_bytes = [&](const std::string& numpy_name, const std::filesystem::path& ours) {
    EXPECT_EQ(testing::read_bytes(ours), testing::read_bytes(numpy_file(numpy_name))) << numpy_name;
  };
  const auto strings = dir_.path() / "strings.npy";
  write_npy_strings(strings, {"/data/a/1.jpg", "/data/é/2.png", ""});
  same_bytes("paths_unicode.npy", strings);
  const auto labels = dir_.path() / "labels.npy";
  write_npy(labels, at::tensor(std::vector<int64_t>{0, 5, 2, 9}, at::kLong));
  same_bytes("labels_int64.npy", labels);
  const auto floats = dir_.path() / "floats.npy";
  write_npy(floats, at::arange(6, at::kFloat).view({2, 3}).div(4));
  same_bytes("floats_2d.npy", floats);
}

TEST_F(NumpyFiles, MalformedFilesNameTheFile) {
  const auto good = testing::read_bytes(numpy_file("labels_int64.npy"));
  auto expect_error = [&](const std::vector<uint8_t>& bytes, const std::string& what) {
    const auto path = dir_.path() / "bad.npy";
    testing::write_bytes(path, bytes);
    try {
      npy_integers(read_npy(path), path);
      FAIL() << "no error for " << what;
    } catch (const DataError& error) {
      EXPECT_NE(std::string(error.what()).find("bad.npy"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(what), std::string::npos) << error.what();
    }
  };
  expect_error({good.begin(), good.end() - 3}, "promises 32 bytes");
  expect_error({'n', 'o', 't', ' ', 'n', 'p', 'y', '!', 0, 0, 0, 0}, "magic");
  std::string object(good.begin(), good.end());
  object.replace(object.find("<i8"), 3, "|O8");
  expect_error({object.begin(), object.end()}, "object arrays are pickles");
  EXPECT_THROW(read_npy(dir_.path() / "missing.npy"), DataError);
  // A catalog entry naming a folder where a file list belongs (it opens, then fails to read).
  std::filesystem::create_directories(dir_.path() / "folder.npy");
  try {
    read_npy(dir_.path() / "folder.npy");
    FAIL() << "no error for a directory";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("folder.npy"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("is a directory"), std::string::npos) << error.what();
  }
  const auto strings = numpy_file("paths_unicode.npy");
  EXPECT_THROW(npy_integers(read_npy(strings), strings), DataError); // strings are not labels
}

} // namespace
} // namespace largo::data::npy_test
