// Decoding JPEG (libjpeg-turbo) and PNG (libpng) files into RGB, reading no more than a
// sample needs: the header first (size known before any pixel is decoded, so random crops
// are planned on it), then only a region, optionally at 1/2, 1/4 or 1/8 scale.
//
// Colour: every image becomes 8-bit RGB the way PIL's Image.convert("RGB") makes it, so the
// pixels equal what torchvision's ImageFolder loader sees:
//   JPEG  YCbCr -> RGB and grayscale -> R=G=B by libjpeg with PIL's settings (islow IDCT,
//         fancy upsampling); CMYK/YCCK -> CMYK by libjpeg, then PIL's CMYK -> RGB formula
//         (Adobe files store inverted CMYK, as PIL assumes).
//   PNG   gray -> R=G=B (1/2/4-bit gray scaled to 0..255), palette -> its RGB entries,
//         alpha and tRNS dropped (PIL drops alpha in convert("RGB") without compositing),
//         16-bit samples -> their high byte (PIL does so for RGB; for 16-bit grayscale PIL
//         clips to 255 instead, which Largo does not copy).
// Region decoding is exact: a region equals the same pixels cut from a full decode (JPEG
// columns are decoded to iMCU boundaries with jpeg_crop_scanline, rows above the region
// are skipped with jpeg_skip_scanlines, rows below it are never read). Scaled decoding
// uses libjpeg-turbo's DCT-domain scaling: it changes pixels slightly (docs/data.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "largo/data/image.h"

namespace largo::data {

// PIL's Image.MAX_IMAGE_PIXELS: int(1024 * 1024 * 1024 // 4 // 3).
constexpr int64_t kPilMaxImagePixels = 89478485;

struct DecodeOptions {
  // Refuse images with more pixels than this (a decompression bomb: a small file that
  // claims a huge image); <= 0 disables the check. PIL warns above this count and refuses
  // above twice it; Largo refuses above it.
  int64_t max_pixels = kPilMaxImagePixels;
  // Let JPEGs decode at 1/2, 1/4 or 1/8 scale when the output is that much smaller.
  bool dct_scaling = true;
};

enum class ImageFormat { kJpeg, kPng };

// Reads a whole file into `bytes` (reusing its allocation). Only regular files are read:
// a FIFO or device named like an image would block forever. Throws DataError naming the
// file when it is missing, not a regular file or unreadable.
void read_file_bytes(const std::filesystem::path& path, std::vector<uint8_t>& bytes);

// An encoded image in memory with its header parsed. It views `data` (not copied): the
// bytes must outlive it.
class EncodedImage {
 public:
  // Throws DataError naming `name` for data that is neither JPEG nor PNG (other formats in
  // torchvision's extension list included: say which), a corrupt header, or more than
  // options.max_pixels pixels.
  EncodedImage(const uint8_t* data, size_t size, std::string name, const DecodeOptions& options);

  ImageFormat format() const;
  int64_t width() const;
  int64_t height() const;
  const std::string& name() const;
  // The scale denominators decode() accepts: {1, 2, 4, 8} for JPEG, {1} for PNG.
  bool supports_scaled_decoding() const;

  // The width or height of the image decoded at 1/denominator: ceil(extent / denominator),
  // as libjpeg computes it.
  static int64_t scaled_extent(int64_t extent, int denominator);

  // Decodes `region`, given in the pixel grid of the image scaled by 1/denominator (which
  // is scaled_extent(width()) x scaled_extent(height())), into `out` as RGB. Throws
  // DataError naming the file for a truncated or corrupt image or a region outside it.
  void decode(const PixelRegion& region, int denominator, Image& out) const;
  // The whole image at full size.
  void decode(Image& out) const;

 private:
  const uint8_t* data_;
  size_t size_;
  std::string name_;
  ImageFormat format_;
  int64_t width_ = 0;
  int64_t height_ = 0;
};

} // namespace largo::data
