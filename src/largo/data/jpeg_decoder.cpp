// JPEG through libjpeg-turbo's libjpeg API (not TurboJPEG: Debian 12 ships libjpeg-turbo
// 2.1, whose TurboJPEG API has scaling but no cropping; the libjpeg API has both,
// jpeg_crop_scanline and jpeg_skip_scanlines, and decodes at the same speed).
//
// libjpeg reports errors by calling error_exit, which must not return: it longjmps back to
// run_guarded(). Nothing between that setjmp and the libjpeg call owns a C++ object with
// a destructor, so the jump skips no destructor; the DataError is thrown after it lands.
#include "image_codecs.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <jerror.h>
#include <jpeglib.h>

#include "largo/core/error.h"

namespace largo::data::detail {
namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings about corrupt data are ignored, as PIL ignores them, except running out of data:
// libjpeg would pad a truncated file with gray, PIL refuses it ("image file is truncated").
void on_emit_message(j_common_ptr cinfo, int level) {
  if (level >= 0) {
    return; // trace messages
  }
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
    std::snprintf(
        err->message, sizeof(err->message), "the file is truncated (premature end of JPEG data)");
    std::longjmp(err->jump, 1);
  }
  ++cinfo->err->num_warnings;
}

// A decompressor over an in-memory file; destroyed with its owner.
struct JpegSession {
  jpeg_decompress_struct cinfo{};
  ErrorManager err{};

  JpegSession(const uint8_t* data, size_t size) {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error_exit;
    err.pub.emit_message = on_emit_message;
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  }
  ~JpegSession() {
    jpeg_destroy_decompress(&cinfo);
  }
  JpegSession(const JpegSession&) = delete;
  JpegSession& operator=(const JpegSession&) = delete;
};

// Runs fn() with `session` catching libjpeg errors; false (and the message in
// session.err.message) when libjpeg raised one.
template <typename Fn>
bool run_guarded(JpegSession& session, Fn&& fn) {
  if (setjmp(session.err.jump) != 0) {
    return false;
  }
  fn();
  return true;
}

[[noreturn]] void throw_jpeg_error(const JpegSession& session, const std::string& name) {
  throw DataError(fmt::format("{}: cannot decode this JPEG: {}", name, session.err.message));
}

// PIL's CMYK -> RGB (Convert.c cmyk2rgb): with nk = 255 - k, channel = nk - c * nk / 255
// (rounded as MULDIV255 rounds). Adobe files store inverted CMYK; PIL reads them inverted
// ("CMYK;I"), so the stored values are flipped first.
inline uint8_t cmyk_channel(int c, int nk) {
  const int product = c * nk + 128;
  return static_cast<uint8_t>(std::clamp(nk - (((product >> 8) + product) >> 8), 0, 255));
}

void cmyk_row_to_rgb(const uint8_t* cmyk, int64_t width, bool inverted, uint8_t* rgb) {
  for (int64_t x = 0; x < width; ++x) {
    int c = cmyk[4 * x];
    int m = cmyk[4 * x + 1];
    int y = cmyk[4 * x + 2];
    int k = cmyk[4 * x + 3];
    if (inverted) {
      c = 255 - c;
      m = 255 - m;
      y = 255 - y;
      k = 255 - k;
    }
    const int nk = 255 - k;
    rgb[3 * x] = cmyk_channel(c, nk);
    rgb[3 * x + 1] = cmyk_channel(m, nk);
    rgb[3 * x + 2] = cmyk_channel(y, nk);
  }
}

// The libjpeg calls of one region decode. Reads rows [region.y, region.y + height) of the
// scaled image into `rows` (one decoded row of `row_stride` bytes each, starting at
// column *first_column), decoding only the iMCU columns that cover the region.
struct JpegRegionDecode {
  const PixelRegion* region;
  int denominator;
  std::vector<uint8_t>* rows; // decoded rows when they cannot go straight into `out`
  Image* out;
  bool direct = false; // rows decoded straight into `out`
  JDIMENSION first_column = 0;
  JDIMENSION decoded_width = 0;
  int components = 3;
  bool cmyk = false;
  bool adobe = false;
};

void start_region(jpeg_decompress_struct& cinfo, JpegRegionDecode& job) {
  jpeg_read_header(&cinfo, TRUE);
  job.cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  job.adobe = cinfo.saw_Adobe_marker != 0;
  cinfo.out_color_space = job.cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned int>(job.denominator);
  // PIL's settings, which are libjpeg's defaults: the accurate integer IDCT and fancy
  // (smooth) chroma upsampling.
  cinfo.dct_method = JDCT_ISLOW;
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);
  job.components = cinfo.output_components;
  const PixelRegion& region = *job.region;
  job.first_column = 0;
  job.decoded_width = cinfo.output_width;
  // jpeg_crop_scanline decodes whole iMCU columns, but fancy upsampling treats the crop's
  // edges as image edges (it replicates chroma instead of reading the neighbours), which
  // changes the outermost columns. A margin of one iMCU on each side keeps that out of the
  // region, so the region equals the full decode.
  const int64_t margin = int64_t{8} * cinfo.max_h_samp_factor;
  const int64_t left = std::max<int64_t>(region.x - margin, 0);
  const int64_t right = std::min<int64_t>(region.x + region.width + margin, cinfo.output_width);
  if (left > 0 || right < static_cast<int64_t>(cinfo.output_width)) {
    job.first_column = static_cast<JDIMENSION>(left);
    job.decoded_width = static_cast<JDIMENSION>(right - left);
    jpeg_crop_scanline(&cinfo, &job.first_column, &job.decoded_width);
  }
  const size_t stride =
      static_cast<size_t>(job.decoded_width) * static_cast<size_t>(job.components);
  job.direct =
      !job.cmyk && job.first_column == 0 && static_cast<int64_t>(job.decoded_width) == region.width;
  uint8_t* base = nullptr;
  if (job.direct) {
    job.out->reshape(region.width, region.height);
    base = job.out->pixels.data();
  } else {
    job.rows->resize(static_cast<size_t>(region.height) * stride);
    base = job.rows->data();
  }
  if (region.y > 0) {
    jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(region.y));
  }
  for (int64_t y = 0; y < region.height; ++y) {
    JSAMPROW row = base + static_cast<size_t>(y) * stride;
    while (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
      // jpeg_mem_src never suspends; a zero return would mean no progress.
      ERREXIT(&cinfo, JERR_BAD_BUFFER_MODE);
    }
  }
  // The rows below the region are never decoded.
  jpeg_abort_decompress(&cinfo);
}

} // namespace

ImageSize read_jpeg_size(const uint8_t* data, size_t size, const std::string& name) {
  JpegSession session(data, size);
  ImageSize image_size;
  if (!run_guarded(session, [&session] { jpeg_read_header(&session.cinfo, TRUE); })) {
    throw_jpeg_error(session, name);
  }
  image_size.width = session.cinfo.image_width;
  image_size.height = session.cinfo.image_height;
  return image_size;
}

void decode_jpeg(
    const uint8_t* data,
    size_t size,
    const std::string& name,
    const PixelRegion& region,
    int denominator,
    Image& out) {
  thread_local std::vector<uint8_t> rows; // reused: one allocation per loader thread
  JpegSession session(data, size);
  JpegRegionDecode job{&region, denominator, &rows, &out};
  if (!run_guarded(session, [&session, &job] { start_region(session.cinfo, job); })) {
    throw_jpeg_error(session, name);
  }
  if (job.direct) {
    return;
  }
  out.reshape(region.width, region.height);
  const size_t stride =
      static_cast<size_t>(job.decoded_width) * static_cast<size_t>(job.components);
  const int64_t skip = region.x - static_cast<int64_t>(job.first_column);
  for (int64_t y = 0; y < region.height; ++y) {
    const uint8_t* src = rows.data() + static_cast<size_t>(y) * stride + skip * job.components;
    if (job.cmyk) {
      cmyk_row_to_rgb(src, region.width, job.adobe, out.row(y));
    } else {
      std::memcpy(out.row(y), src, static_cast<size_t>(region.width * Image::kChannels));
    }
  }
}

} // namespace largo::data::detail
