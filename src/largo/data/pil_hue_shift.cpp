// PIL's rgb2hsv and hsv2rgb (Pillow 9 Convert.c) with its float/double types and order of
// operations, so the bytes match, but fast:
//  - RGB -> HSV costs PIL five divisions per pixel. Its hue depends only on which channel is
//    the largest and which the smallest (six cases), on max - min and on max - middle; its
//    saturation only on max and max - min. Both come from tables computed once with PIL's
//    formula (about 450 KiB).
//  - HSV -> RGB keeps PIL's float and double products, without libm calls (floor and round
//    reduce to exact integer steps on the ranges that occur) and computes only what the
//    pixel's sector uses: p (a table of s and v) and one of q and t. What depends on the
//    hue byte alone (sector, weight) comes from 256-entry tables.
#include "pil_hue_shift.h"

#include <algorithm>
#include <cmath>
#include <memory>

namespace largo::data::detail {
namespace {

// Of a pixel (r, g, b): which channel is largest and which smallest, as PIL's rgb2hsv
// branches (r wins ties, then g).
inline int hue_case(int r, int g, int b, int maxc) {
  if (r == maxc) {
    return g >= b ? 0 : 1;
  }
  if (g == maxc) {
    return b <= r ? 2 : 3;
  }
  return g <= r ? 4 : 5;
}

inline uint8_t clip8(int value) {
  return static_cast<uint8_t>(std::clamp(value, 0, 255));
}

// PIL's rgb2hsv for the hue, as written (for the table).
uint8_t pil_hue(int r, int g, int b) {
  const int maxc = std::max(r, std::max(g, b));
  const int minc = std::min(r, std::min(g, b));
  if (maxc == minc) {
    return 0;
  }
  const auto cr = static_cast<float>(maxc - minc);
  const float rc = static_cast<float>(maxc - r) / cr;
  const float gc = static_cast<float>(maxc - g) / cr;
  const float bc = static_cast<float>(maxc - b) / cr;
  float h = 0;
  if (r == maxc) {
    h = bc - gc;
  } else if (g == maxc) {
    h = static_cast<float>(2.0 + rc - bc);
  } else {
    h = static_cast<float>(4.0 + gc - rc);
  }
  h = static_cast<float>(std::fmod(h / 6.0 + 1.0, 1.0));
  return clip8(static_cast<int>(h * 255.0));
}

struct HsvTables {
  // RGB -> HSV
  uint8_t hue[6][256][256];     // [hue_case][max - min][max - middle]
  uint8_t saturation[256][256]; // [max][max - min]
  // HSV -> RGB, with f = h * 6.0 / 255.0 - floor(...) (a float) and fs = s / 255.0 (a float)
  uint8_t sector[256];          // floor(h * 6.0 / 255.0) % 6
  uint8_t p[256][256];          // [s][v]: round(v * (1.0 - fs))
  double weight[256];           // odd sectors use q (weight f), even ones t (weight 1.0 - f)
  bool float_product[256];      // q's product fs * f is a float one, t's a double one
  double saturation_float[256]; // fs
};

std::unique_ptr<HsvTables> build_tables() {
  auto t = std::make_unique<HsvTables>();
  // One pixel of each case per (range, middle offset), with min 0: the hue depends on
  // differences only. Entries a case cannot reach (e.g. case 1 with middle == min) are
  // filled from a pixel of another case and never read.
  for (int range = 0; range < 256; ++range) {
    for (int d = 0; d <= range; ++d) {
      const int mid = range - d;
      const int pixels[6][3] = {
          {range, mid, 0},
          {range, 0, mid},
          {mid, range, 0},
          {0, range, mid},
          {mid, 0, range},
          {0, mid, range}};
      for (int c = 0; c < 6; ++c) {
        t->hue[c][range][d] = pil_hue(pixels[c][0], pixels[c][1], pixels[c][2]);
      }
    }
  }
  for (int maxc = 0; maxc < 256; ++maxc) {
    for (int range = 0; range <= maxc; ++range) {
      const float s = maxc == 0 ? 0.0f : static_cast<float>(range) / static_cast<float>(maxc);
      t->saturation[maxc][range] = range == 0 ? 0 : clip8(static_cast<int>(s * 255.0));
    }
  }
  for (int x = 0; x < 256; ++x) {
    const double sixths = static_cast<float>(x) * 6.0 / 255.0;
    const int i = static_cast<int>(std::floor(sixths));
    const auto f = static_cast<float>(sixths - static_cast<float>(i));
    t->sector[x] = static_cast<uint8_t>(i % 6);
    t->weight[x] = t->sector[x] % 2 == 1 ? f : 1.0 - f;
    t->float_product[x] = t->sector[x] % 2 == 1;
    const auto fs = static_cast<float>(static_cast<float>(x) / 255.0);
    t->saturation_float[x] = fs;
    for (int v = 0; v < 256; ++v) {
      t->p[x][v] = static_cast<uint8_t>(std::round(static_cast<float>(v) * (1.0 - fs)));
    }
  }
  return t;
}

const HsvTables& hsv_tables() {
  static const std::unique_ptr<HsvTables> tables = build_tables();
  return *tables;
}

// Which of (v, p, q or t) each of R, G, B takes, per sector (PIL's switch).
constexpr uint8_t kSectorOutputs[6][3] = {
    {0, 2, 1}, {2, 0, 1}, {1, 0, 2}, {1, 2, 0}, {2, 1, 0}, {0, 1, 2}};

// std::round of x >= 0 (halves away from zero) without the libm call: x - int(x) is exact.
inline uint8_t round_nonnegative(double x) {
  const int whole = static_cast<int>(x);
  return static_cast<uint8_t>(whole + (x - whole >= 0.5 ? 1 : 0));
}

// PIL's hsv2rgb. Saturation 0 needs no special case: p, q and t all round back to v.
void hsv_to_rgb(uint8_t h, int s, int v, const HsvTables& tables, uint8_t* rgb) {
  // q = round(v * (1.0 - fs * f)) with PIL's float product fs * f, t = round(v * (1.0 - fs *
  // (1.0 - f))) with a double one. fs and f have 24 significant bits each: their double
  // product is exact, so rounding it to float gives PIL's float product.
  const double product = tables.saturation_float[s] * tables.weight[h];
  const double used = tables.float_product[h] ? static_cast<float>(product) : product;
  // All are in [0, v]: rounding needs no clipping.
  const uint8_t outputs[3] = {
      static_cast<uint8_t>(v),
      tables.p[s][v],
      round_nonnegative(static_cast<float>(v) * (1.0 - used))};
  const uint8_t* pick = kSectorOutputs[tables.sector[h]];
  rgb[0] = outputs[pick[0]];
  rgb[1] = outputs[pick[1]];
  rgb[2] = outputs[pick[2]];
}

} // namespace

void pil_shift_hue(uint8_t* rgb, int64_t count, uint8_t shift) {
  const HsvTables& tables = hsv_tables();
  for (int64_t i = 0; i < count; ++i, rgb += 3) {
    const int r = rgb[0];
    const int g = rgb[1];
    const int b = rgb[2];
    const int maxc = std::max(r, std::max(g, b));
    const int minc = std::min(r, std::min(g, b));
    const int range = maxc - minc;
    const int middle = r + g + b - maxc - minc;
    const uint8_t hue = tables.hue[hue_case(r, g, b, maxc)][range][maxc - middle];
    hsv_to_rgb(
        static_cast<uint8_t>(hue + shift), tables.saturation[maxc][range], maxc, tables, rgb);
  }
}

} // namespace largo::data::detail
