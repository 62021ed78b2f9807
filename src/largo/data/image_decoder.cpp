// File reading, format detection by magic bytes, the size limit, and dispatch to the JPEG
// and PNG back ends (image_codecs.h).
#include "largo/data/image_decoder.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "image_codecs.h"
#include "largo/core/error.h"

namespace largo::data {
namespace {

bool starts_with(const uint8_t* data, size_t size, const char* magic, size_t magic_size) {
  return size >= magic_size && std::memcmp(data, magic, magic_size) == 0;
}

// What a file that is neither JPEG nor PNG looks like, for the error message.
std::string describe_other_format(const uint8_t* data, size_t size) {
  if (size == 0) {
    return "an empty file";
  }
  if (starts_with(data, size, "BM", 2)) {
    return "a BMP image";
  }
  if (starts_with(data, size, "GIF8", 4)) {
    return "a GIF image";
  }
  if (size >= 12 && std::memcmp(data, "RIFF", 4) == 0 && std::memcmp(data + 8, "WEBP", 4) == 0) {
    return "a WebP image";
  }
  if (starts_with(data, size, "II*\0", 4) || starts_with(data, size, "MM\0*", 4)) {
    return "a TIFF image";
  }
  if (size >= 2 && data[0] == 'P' && data[1] >= '1' && data[1] <= '7') {
    return "a PPM/PGM (Netpbm) image";
  }
  return fmt::format(
      "not an image Largo can read (it starts with bytes {:02x} {:02x} {:02x} {:02x})",
      data[0],
      size > 1 ? data[1] : 0,
      size > 2 ? data[2] : 0,
      size > 3 ? data[3] : 0);
}

} // namespace

void read_file_bytes(const std::filesystem::path& path, std::vector<uint8_t>& bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    throw DataError(
        fmt::format("{}: cannot open the image file: {}", path.string(), std::strerror(error)));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format(
        "{}: not a regular file (a folder, FIFO, socket or device named like an image); remove "
        "or rename it",
        path.string()));
  }
  bytes.resize(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got <= 0) {
      const int error = errno;
      ::close(fd);
      throw DataError(fmt::format(
          "{}: reading the image file failed after {} of {} bytes: {}",
          path.string(),
          done,
          bytes.size(),
          got == 0 ? "unexpected end of file" : std::strerror(error)));
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
}

EncodedImage::EncodedImage(
    const uint8_t* data, size_t size, std::string name, const DecodeOptions& options)
    : data_(data), size_(size), name_(std::move(name)) {
  static constexpr char kJpegMagic[] = "\xFF\xD8\xFF";
  static constexpr char kPngMagic[] = "\x89PNG\r\n\x1A\n";
  detail::ImageSize image_size;
  if (starts_with(data, size, kJpegMagic, 3)) {
    format_ = ImageFormat::kJpeg;
    image_size = detail::read_jpeg_size(data, size, name_);
  } else if (starts_with(data, size, kPngMagic, 8)) {
    format_ = ImageFormat::kPng;
    image_size = detail::read_png_size(data, size, name_);
  } else {
    throw DataError(fmt::format(
        "{}: {}; Largo decodes JPEG and PNG files only: convert or remove it",
        name_,
        describe_other_format(data, size)));
  }
  width_ = image_size.width;
  height_ = image_size.height;
  if (options.max_pixels > 0 && width_ * height_ > options.max_pixels) {
    throw DataError(fmt::format(
        "{}: the image is {}x{} = {} pixels, more than the limit of {} (a decompression "
        "bomb?); raise the pixel limit if the image is genuine",
        name_,
        width_,
        height_,
        width_ * height_,
        options.max_pixels));
  }
}

ImageFormat EncodedImage::format() const {
  return format_;
}

int64_t EncodedImage::width() const {
  return width_;
}

int64_t EncodedImage::height() const {
  return height_;
}

const std::string& EncodedImage::name() const {
  return name_;
}

bool EncodedImage::supports_scaled_decoding() const {
  return format_ == ImageFormat::kJpeg;
}

int64_t EncodedImage::scaled_extent(int64_t extent, int denominator) {
  return (extent + denominator - 1) / denominator;
}

void EncodedImage::decode(const PixelRegion& region, int denominator, Image& out) const {
  const bool scale_ok =
      denominator == 1 ||
      (supports_scaled_decoding() && (denominator == 2 || denominator == 4 || denominator == 8));
  const int64_t width = scaled_extent(width_, denominator);
  const int64_t height = scaled_extent(height_, denominator);
  if (!scale_ok || region.x < 0 || region.y < 0 || region.width <= 0 || region.height <= 0 ||
      region.x + region.width > width || region.y + region.height > height) {
    throw DataError(fmt::format(
        "{}: cannot decode region x={} y={} {}x{} at 1/{} scale of a {}x{} image",
        name_,
        region.x,
        region.y,
        region.width,
        region.height,
        denominator,
        width_,
        height_));
  }
  if (format_ == ImageFormat::kJpeg) {
    detail::decode_jpeg(data_, size_, name_, region, denominator, out);
  } else {
    detail::decode_png(data_, size_, name_, region, out);
  }
}

void EncodedImage::decode(Image& out) const {
  decode(PixelRegion{0, 0, width_, height_}, 1, out);
}

} // namespace largo::data
