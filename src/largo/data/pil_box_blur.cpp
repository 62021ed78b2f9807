// PIL's extended box blur with PIL's arithmetic (uint32 sums, 8.24 weights, the same
// rounding), laid out for speed: PIL walks a line pixel by pixel with a running sum and
// clamped edge reads; here every pass is a loop over all the values of a line, without
// branches, that the compiler vectorises. Rows: the row with its edges extended, then prefix
// sums, so each output is a difference of two sums. Columns: one running sum per value of a
// row, so a whole output row is computed at once from four input rows. Both are also
// compiled for AVX2 (simd_clones.h).
#include "pil_box_blur.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "simd_clones.h"

namespace largo::data::detail {
namespace {

constexpr int64_t kChannels = Image::kChannels;

// PIL's weights for a box of float radius r: `whole` for each of the 2 * int(r) + 1 whole
// pixels, `fraction` for the two partly covered ones at the ends.
struct BoxWeights {
  int64_t radius; // int(r)
  uint32_t whole;
  uint32_t fraction;
};

BoxWeights box_weights(float radius) {
  const auto whole_radius = static_cast<int64_t>(radius);
  const auto whole = static_cast<uint32_t>(static_cast<float>(1 << 24) / (radius * 2 + 1));
  const uint32_t fraction = ((1u << 24) - static_cast<uint32_t>(whole_radius * 2 + 1) * whole) / 2;
  return {whole_radius, whole, fraction};
}

// One output value: `sum` of the whole pixels, `ends` the two partly covered ones.
inline uint8_t box_value(uint32_t sum, uint32_t ends, const BoxWeights& w) {
  return static_cast<uint8_t>((sum * w.whole + ends * w.fraction + (1u << 23)) >> 24);
}

// A row's buffers, kept per thread across rows and images.
struct RowScratch {
  std::vector<uint8_t> extended; // the row, its edge pixels repeated radius + 1 times each side
  std::vector<uint32_t> prefix;  // per channel: sum of extended[k - 3], extended[k - 6], ...
};

// One pass along a row of `width` pixels, in place.
LARGO_SIMD_CLONES void
blur_row(uint8_t* row, int64_t width, const BoxWeights& w, RowScratch& scratch) {
  const int64_t pad = w.radius + 1;
  const int64_t values = (width + 2 * pad) * kChannels;
  scratch.extended.resize(static_cast<size_t>(values));
  scratch.prefix.resize(static_cast<size_t>(values + kChannels));
  uint8_t* __restrict__ extended = scratch.extended.data();
  uint32_t* __restrict__ prefix = scratch.prefix.data();
  const uint8_t* last = row + (width - 1) * kChannels;
  for (int64_t k = 0; k < pad; ++k) {
    std::memcpy(extended + k * kChannels, row, kChannels);
    std::memcpy(extended + (pad + width + k) * kChannels, last, kChannels);
  }
  std::memcpy(extended + pad * kChannels, row, static_cast<size_t>(width * kChannels));
  // Three running sums in registers: the compiler would not keep prefix[k - 3] in one.
  uint32_t sums[kChannels] = {0, 0, 0};
  std::fill_n(prefix, kChannels, 0u);
  for (int64_t k = 0; k < values; k += kChannels) {
    for (int64_t c = 0; c < kChannels; ++c) {
      sums[c] += extended[k + c];
      prefix[k + kChannels + c] = sums[c];
    }
  }
  // Output pixel x: whole pixels extended[x + 1 .. x + 2r + 1] (row[x - r .. x + r]), ends
  // extended[x] and extended[x + 2r + 2] (in values: times 3, plus the channel).
  const int64_t span = (2 * w.radius + 2) * kChannels;
  uint8_t* __restrict__ out = row;
  for (int64_t j = 0; j < width * kChannels; ++j) {
    out[j] =
        box_value(prefix[j + span] - prefix[j + kChannels], extended[j] + extended[j + span], w);
  }
}

// One pass along the columns, `in` -> `out` (same size, another buffer); `sums` is scratch.
LARGO_SIMD_CLONES void
blur_columns(const Image& in, Image& out, const BoxWeights& w, std::vector<uint32_t>& sums) {
  const int64_t values = in.width * kChannels;
  auto row = [&](int64_t y) { return in.row(std::clamp<int64_t>(y, 0, in.height - 1)); };
  sums.assign(static_cast<size_t>(values), 0u);
  uint32_t* __restrict__ acc = sums.data();
  // The window of the row before the first: rows -r-1 .. r-1, edges extended.
  for (int64_t y = -w.radius - 1; y < w.radius; ++y) {
    const uint8_t* __restrict__ src = row(y);
    for (int64_t j = 0; j < values; ++j) {
      acc[j] += src[j];
    }
  }
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* __restrict__ enter = row(y + w.radius);
    const uint8_t* __restrict__ leave = row(y - w.radius - 1);
    const uint8_t* __restrict__ beyond = row(y + w.radius + 1);
    uint8_t* __restrict__ dst = out.row(y);
    for (int64_t j = 0; j < values; ++j) {
      acc[j] += static_cast<uint32_t>(enter[j]) - leave[j]; // wraps back: the sum is exact
      dst[j] = box_value(acc[j], leave[j] + beyond[j], w);
    }
  }
}

} // namespace

void pil_box_blur(Image& image, float radius, int passes) {
  if (image.width == 0 || image.height == 0) {
    return;
  }
  const BoxWeights w = box_weights(radius);
  thread_local RowScratch row_scratch;
  for (int64_t y = 0; y < image.height; ++y) {
    for (int pass = 0; pass < passes; ++pass) { // rows are independent: all passes at once
      blur_row(image.row(y), image.width, w, row_scratch);
    }
  }
  thread_local Image spare;
  thread_local std::vector<uint32_t> column_sums;
  spare.reshape(image.width, image.height);
  Image* src = &image;
  Image* dst = &spare;
  for (int pass = 0; pass < passes; ++pass) {
    blur_columns(*src, *dst, w, column_sums);
    std::swap(src, dst);
  }
  if (src != &image) {
    std::swap(image.pixels, spare.pixels); // the result; `spare` keeps the old buffer
  }
}

} // namespace largo::data::detail
