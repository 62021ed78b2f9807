// PNG through libpng, reading from memory. As with libjpeg, libpng's error callback must not
// return: it longjmps back to run_guarded(), which owns no C++ object with a destructor,
// and the DataError is thrown after the jump.
#include "image_codecs.h"

#include <algorithm>
#include <csetjmp>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <png.h>

#include "largo/core/error.h"

namespace largo::data::detail {
namespace {

constexpr uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

struct Reader {
  const uint8_t* data;
  size_t size;
  size_t offset = 0;
  char message[256] = {};
};

[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* reader = static_cast<Reader*>(png_get_error_ptr(png));
  std::snprintf(reader->message, sizeof(reader->message), "%s", message);
  png_longjmp(png, 1);
}

void on_warning(png_structp /*png*/, png_const_charp /*message*/) {
  // Ancillary-chunk problems (bad sRGB profile, CRC of a text chunk): PIL ignores them too.
}

void read_bytes(png_structp png, png_bytep out, png_size_t count) {
  auto* reader = static_cast<Reader*>(png_get_io_ptr(png));
  if (reader->size - reader->offset < count) {
    png_error(png, "the file is truncated (premature end of PNG data)");
  }
  std::memcpy(out, reader->data + reader->offset, count);
  reader->offset += count;
}

// A libpng reader over the file; destroyed with its owner.
struct PngSession {
  Reader reader;
  png_structp png = nullptr;
  png_infop info = nullptr;

  PngSession(const uint8_t* data, size_t size) : reader{data, size} {
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, on_error, on_warning);
    if (png != nullptr) {
      info = png_create_info_struct(png);
      png_set_read_fn(png, &reader, read_bytes);
    }
  }
  ~PngSession() {
    png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
  PngSession(const PngSession&) = delete;
  PngSession& operator=(const PngSession&) = delete;
};

template <typename Fn>
bool run_guarded(PngSession& session, Fn&& fn) {
  if (setjmp(png_jmpbuf(session.png)) != 0) {
    return false;
  }
  fn();
  return true;
}

struct PngRegionDecode {
  const PixelRegion* region;
  std::vector<uint8_t>* rows;
  Image* out;
};

// Every conversion PIL's convert("RGB") makes, done by libpng: 8-bit samples, palette
// expanded, gray replicated, alpha dropped (tRNS is never turned into alpha).
void set_rgb_output(png_structp png, png_infop info) {
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  if (bit_depth == 16) {
    png_set_strip_16(png);
  }
  if (color_type == PNG_COLOR_TYPE_PALETTE) {
    png_set_palette_to_rgb(png);
  }
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) {
    png_set_expand_gray_1_2_4_to_8(png);
  }
  if ((color_type & PNG_COLOR_MASK_ALPHA) != 0) {
    png_set_strip_alpha(png);
  }
  if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) {
    png_set_gray_to_rgb(png);
  }
}

void read_region(png_structp png, png_infop info, PngRegionDecode& job) {
  png_read_info(png, info);
  set_rgb_output(png, info);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  const PixelRegion& region = *job.region;
  const auto width = static_cast<int64_t>(png_get_image_width(png, info));
  if (row_bytes != static_cast<size_t>(width * Image::kChannels)) {
    png_error(png, "unexpected row size after conversion to RGB");
  }
  job.out->reshape(region.width, region.height);
  if (passes > 1) {
    // Interlaced: every pass touches every row, so the whole image is decoded.
    const auto height = static_cast<size_t>(png_get_image_height(png, info));
    job.rows->resize(height * row_bytes);
    for (int pass = 0; pass < passes; ++pass) {
      for (size_t y = 0; y < height; ++y) {
        png_read_row(png, job.rows->data() + y * row_bytes, nullptr);
      }
    }
    for (int64_t y = 0; y < region.height; ++y) {
      std::memcpy(
          job.out->row(y),
          job.rows->data() + static_cast<size_t>(region.y + y) * row_bytes +
              region.x * Image::kChannels,
          static_cast<size_t>(region.width * Image::kChannels));
    }
    return;
  }
  // Rows depend on the row above (filters), so rows before the region are decoded too;
  // rows after it are not read.
  job.rows->resize(row_bytes);
  for (int64_t y = 0; y < region.y + region.height; ++y) {
    png_read_row(png, job.rows->data(), nullptr);
    if (y >= region.y) {
      std::memcpy(
          job.out->row(y - region.y),
          job.rows->data() + region.x * Image::kChannels,
          static_cast<size_t>(region.width * Image::kChannels));
    }
  }
}

uint32_t big_endian_u32(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         bytes[3];
}

} // namespace

ImageSize read_png_size(const uint8_t* data, size_t size, const std::string& name) {
  // Signature, then the IHDR chunk: length 13, "IHDR", width and height (big-endian).
  if (size < 8 + 8 + 13 || std::memcmp(data, kSignature, 8) != 0 ||
      big_endian_u32(data + 8) != 13 || std::memcmp(data + 12, "IHDR", 4) != 0) {
    throw DataError(
        fmt::format("{}: cannot decode this PNG: its header (IHDR) is missing or cut short", name));
  }
  ImageSize image_size{big_endian_u32(data + 16), big_endian_u32(data + 20)};
  if (image_size.width == 0 || image_size.height == 0 || image_size.width > PNG_UINT_31_MAX ||
      image_size.height > PNG_UINT_31_MAX) {
    throw DataError(fmt::format(
        "{}: cannot decode this PNG: its header gives an invalid size {}x{}",
        name,
        image_size.width,
        image_size.height));
  }
  return image_size;
}

void decode_png(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    const PixelRegion& region,
    Image& out) {
  thread_local std::vector<uint8_t> rows;
  PngSession session(data, size);
  if (session.png == nullptr || session.info == nullptr) {
    throw DataError(
        fmt::format("{}: cannot decode this PNG: libpng could not start (out of memory?)", name));
  }
  PngRegionDecode job{&region, &rows, &out};
  if (!run_guarded(session, [&session, &job] { read_region(session.png, session.info, job); })) {
    throw DataError(fmt::format("{}: cannot decode this PNG: {}", name, session.reader.message));
  }
}

} // namespace largo::data::detail
