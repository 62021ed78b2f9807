// JPEG/PNG decoding: PIL's colour conversions (against PIL's own decode of the fixtures),
// exact region decoding at every scale, and every kind of bad file failing with a DataError
// that names it -- without crashing or hanging.
#include "largo/data/image_decoder.h"

#include <sys/stat.h>
#include <zlib.h>

#include <gtest/gtest.h>

#include "data/image_test_util.h"
#include "data/temp_dir.h"
#include "largo/core/error.h"

namespace largo::data::image_decoder_test {
namespace {

namespace fs = std::filesystem;
using testing::decode_file;
using testing::image_baseline_dir;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

fs::path fixture(const std::string& name) {
  return image_baseline_dir() / "fixtures" / name;
}

// Decoding `bytes` must throw a DataError whose message names `name` and contains `what`.
void expect_bad(
    const std::vector<uint8_t>& bytes,
    const std::string& name,
    const std::string& what,
    DecodeOptions options = {}) {
  try {
    EncodedImage encoded(bytes.data(), bytes.size(), name, options);
    Image image;
    encoded.decode(image);
    FAIL() << name << ": decoded without an error";
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(name), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

TEST(ImageDecoder, ConvertsToRgbAsPilDoes) {
  // Grayscale and CMYK JPEG, gray, palette and RGBA PNG: byte-equal to PIL's convert("RGB").
  for (const std::string name : {"gray.jpg", "cmyk.jpg", "gray.png", "palette.png", "rgba.png"}) {
    std::string decoded_name = name;
    decoded_name[decoded_name.find('.')] = '_';
    const Image expected = decode_file(image_baseline_dir() / "decoded" / (decoded_name + ".png"));
    const Image actual = decode_file(fixture(name));
    EXPECT_EQ(testing::max_abs_difference(actual, expected), 0) << name;
  }
}

TEST(ImageDecoder, RegionsEqualTheFullDecodeAtEveryScale) {
  for (const std::string name :
       {"rgb420.jpg",
        "rgb444.jpg",
        "progressive.jpg",
        "gray.jpg",
        "cmyk.jpg",
        "large.jpg",
        "rgb.png",
        "palette.png"}) {
    const std::vector<uint8_t> bytes = read_bytes(fixture(name));
    const EncodedImage encoded(bytes.data(), bytes.size(), name, {});
    for (const int denominator : {1, 2, 4, 8}) {
      if (denominator > 1 && !encoded.supports_scaled_decoding()) {
        continue;
      }
      const int64_t width = EncodedImage::scaled_extent(encoded.width(), denominator);
      const int64_t height = EncodedImage::scaled_extent(encoded.height(), denominator);
      Image full;
      encoded.decode(PixelRegion{0, 0, width, height}, denominator, full);
      ASSERT_EQ(full.width, width);
      // Regions touching each edge, odd offsets inside iMCUs, single rows and columns.
      const PixelRegion regions[] = {
          {0, 0, width, 1},
          {width - 1, height - 1, 1, 1},
          {1, 3, width / 2, height / 3},
          {width / 3, height / 2, width - width / 3, height - height / 2},
          {7 % width, 9 % height, 1, height - 9 % height},
          {width / 2, 0, width - width / 2, height}};
      for (const PixelRegion& region : regions) {
        Image part;
        encoded.decode(region, denominator, part);
        ASSERT_EQ(part.width, region.width);
        ASSERT_EQ(part.height, region.height);
        int worst = 0;
        for (int64_t y = 0; y < region.height; ++y) {
          for (int64_t x = 0; x < region.width * 3; ++x) {
            worst = std::max(
                worst,
                std::abs(int(part.row(y)[x]) - int(full.row(region.y + y)[region.x * 3 + x])));
          }
        }
        EXPECT_EQ(worst, 0) << name << " 1/" << denominator << " region x=" << region.x
                            << " y=" << region.y << " " << region.width << "x" << region.height;
      }
    }
  }
}

TEST(ImageDecoder, ReadsInterlacedPngs) {
  const Image image = testing::pattern_image(37, 23, 3);
  const std::vector<uint8_t> bytes = testing::encode_png(image, /*interlaced=*/true);
  Image decoded;
  EncodedImage(bytes.data(), bytes.size(), "adam7.png", {})
      .decode(PixelRegion{5, 4, 20, 11}, 1, decoded);
  for (int64_t y = 0; y < 11; ++y) {
    ASSERT_EQ(std::memcmp(decoded.row(y), image.row(4 + y) + 15, 60), 0) << "row " << y;
  }
}

TEST(ImageDecoder, TruncatedAndCorruptFilesNameTheFile) {
  const std::vector<uint8_t> jpeg = read_bytes(fixture("large.jpg"));
  expect_bad(
      {jpeg.begin(), jpeg.begin() + static_cast<std::ptrdiff_t>(jpeg.size() * 6 / 10)},
      "cut.jpg",
      "truncated");
  expect_bad({jpeg.begin(), jpeg.begin() + 300}, "header_only.jpg", "cannot decode this JPEG");
  std::vector<uint8_t> garbage = jpeg;
  std::fill(garbage.begin() + 3, garbage.begin() + 400, uint8_t{0x5A});
  expect_bad(garbage, "garbage.jpg", "cannot decode this JPEG");

  const std::vector<uint8_t> png = read_bytes(fixture("rgb.png"));
  expect_bad(
      {png.begin(), png.begin() + static_cast<std::ptrdiff_t>(png.size() / 2)},
      "cut.png",
      "truncated");
  std::vector<uint8_t> bad_crc = png;
  bad_crc[bad_crc.size() / 2] ^= 0xFF; // inside the image data: its CRC no longer matches
  expect_bad(bad_crc, "crc.png", "cannot decode this PNG");
}

TEST(ImageDecoder, NonImagesAndOtherFormatsNameTheFile) {
  const std::string text = "just some notes, not an image";
  expect_bad({text.begin(), text.end()}, "notes.jpg", "Largo decodes JPEG and PNG files only");
  expect_bad({}, "empty.jpg", "an empty file");
  expect_bad({'B', 'M', 0, 0, 0, 0}, "old.bmp", "a BMP image");
  expect_bad({'G', 'I', 'F', '8', '9', 'a'}, "anim.gif", "a GIF image");
}

TEST(ImageDecoder, RefusesDecompressionBombs) {
  // A real JPEG whose frame header claims 30000 x 30000 pixels: refused from the header.
  std::vector<uint8_t> jpeg = read_bytes(fixture("rgb420.jpg"));
  size_t sof = 2;
  while (!(jpeg[sof] == 0xFF && jpeg[sof + 1] == 0xC0)) {
    sof += 2 + (size_t(jpeg[sof + 2]) << 8 | jpeg[sof + 3]);
  }
  jpeg[sof + 5] = 30000 >> 8; // height
  jpeg[sof + 6] = 30000 & 0xFF;
  jpeg[sof + 7] = 30000 >> 8; // width
  jpeg[sof + 8] = 30000 & 0xFF;
  expect_bad(jpeg, "bomb.jpg", "decompression bomb");

  // A PNG whose IHDR (CRC fixed up) claims 20000 x 20000.
  std::vector<uint8_t> png = read_bytes(fixture("rgb.png"));
  for (int i = 0; i < 2; ++i) {
    png[16 + 4 * i] = 0;
    png[17 + 4 * i] = 0;
    png[18 + 4 * i] = 20000 >> 8;
    png[19 + 4 * i] = 20000 & 0xFF;
  }
  const uLong crc = crc32(crc32(0, nullptr, 0), png.data() + 12, 17);
  for (int b = 0; b < 4; ++b) {
    png[29 + b] = static_cast<uint8_t>(crc >> (24 - 8 * b));
  }
  expect_bad(png, "bomb.png", "decompression bomb");

  // The limit is an option: 64 x 48 = 3072 pixels are refused under a limit of 3000 ...
  const std::vector<uint8_t> small = read_bytes(fixture("gray.png"));
  DecodeOptions strict;
  strict.max_pixels = 3000;
  expect_bad(small, "gray.png", "more than the limit of 3000", strict);
  // ... and 0 turns the check off.
  DecodeOptions unlimited;
  unlimited.max_pixels = 0;
  EXPECT_NO_THROW(EncodedImage(jpeg.data(), jpeg.size(), "bomb.jpg", unlimited));
}

TEST(ImageDecoder, UnreadableFilesFailWithoutHanging) {
  TempDir dir;
  std::vector<uint8_t> bytes;
  const fs::path fifo = dir.path() / "pipe.jpg"; // opening it for reading would block
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW(read_file_bytes(fifo, bytes), DataError);
  const fs::path dangling = dir.path() / "gone.jpg";
  fs::create_symlink(dir.path() / "missing.jpg", dangling);
  try {
    read_file_bytes(dangling, bytes);
    FAIL() << "read a dangling symlink";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("gone.jpg"), std::string::npos) << error.what();
  }
  fs::create_directory(dir.path() / "folder.jpg");
  EXPECT_THROW(read_file_bytes(dir.path() / "folder.jpg", bytes), DataError);
}

} // namespace
} // namespace largo::data::image_decoder_test
