// The fast per-pixel kernels (pil_hue_shift.cpp, pil_box_blur.cpp, the ColorJitter blends)
// against PIL's formulas written plainly, pixel by pixel (as Largo had them before it sped
// them up): equal bytes on every hue case and tie, every shift, tiny images, radii larger
// than the image, extrapolating blends. The parity tests pin the formulas to PIL itself.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "largo/data/blur_transforms.h"
#include "largo/data/color_transforms.h"

namespace largo::data::pil_kernels_test {
namespace {

// ---- the plain formulas ------------------------------------------------------------------

uint8_t luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

uint8_t blend(int degenerate, int value, float alpha) {
  const float mixed =
      static_cast<float>(degenerate) + alpha * static_cast<float>(value - degenerate);
  if (alpha >= 0 && alpha <= 1.0f) {
    return static_cast<uint8_t>(mixed);
  }
  return mixed <= 0.0f ? 0 : mixed >= 255.0f ? 255 : static_cast<uint8_t>(mixed);
}

// degenerate(pixel) per pixel, or a constant when `constant` >= 0.
void plain_blend(Image& image, double factor, int constant) {
  const auto alpha = static_cast<float>(factor);
  for (int64_t i = 0; i < image.width * image.height; ++i) {
    uint8_t* rgb = image.pixels.data() + 3 * i;
    const int base = constant >= 0 ? constant : luma(rgb);
    for (int c = 0; c < 3; ++c) {
      rgb[c] = blend(base, rgb[c], alpha);
    }
  }
}

uint8_t clip8(int value) {
  return static_cast<uint8_t>(std::clamp(value, 0, 255));
}

void rgb_to_hsv(const uint8_t* rgb, uint8_t* hsv) {
  const uint8_t r = rgb[0];
  const uint8_t g = rgb[1];
  const uint8_t b = rgb[2];
  const uint8_t maxc = std::max(r, std::max(g, b));
  const uint8_t minc = std::min(r, std::min(g, b));
  uint8_t hue = 0;
  uint8_t saturation = 0;
  if (minc != maxc) {
    const auto cr = static_cast<float>(maxc - minc);
    const float s = cr / static_cast<float>(maxc);
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
    hue = clip8(static_cast<int>(h * 255.0));
    saturation = clip8(static_cast<int>(s * 255.0));
  }
  hsv[0] = hue;
  hsv[1] = saturation;
  hsv[2] = maxc;
}

void hsv_to_rgb(const uint8_t* hsv, uint8_t* rgb) {
  const uint8_t h = hsv[0];
  const uint8_t s = hsv[1];
  const uint8_t v = hsv[2];
  if (s == 0) {
    rgb[0] = rgb[1] = rgb[2] = v;
    return;
  }
  const int i = static_cast<int>(std::floor(static_cast<float>(h) * 6.0 / 255.0));
  const auto f = static_cast<float>(static_cast<float>(h) * 6.0 / 255.0 - static_cast<float>(i));
  const auto fs = static_cast<float>(static_cast<float>(s) / 255.0);
  const uint8_t p = clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs))));
  const uint8_t q = clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs * f))));
  const uint8_t t =
      clip8(static_cast<int>(std::round(static_cast<float>(v) * (1.0 - fs * (1.0 - f)))));
  const uint8_t table[6][3] = {{v, t, p}, {q, v, p}, {p, v, t}, {p, q, v}, {t, p, v}, {v, p, q}};
  const uint8_t* out = table[i % 6];
  rgb[0] = out[0];
  rgb[1] = out[1];
  rgb[2] = out[2];
}

// PIL's box radius for a Gaussian of `radius` made of `passes` box blurs.
void plain_hue(Image& image, uint8_t shift) {
  for (int64_t i = 0; i < image.width * image.height; ++i) {
    uint8_t* rgb = image.pixels.data() + 3 * i;
    uint8_t hsv[3];
    rgb_to_hsv(rgb, hsv);
    hsv[0] = static_cast<uint8_t>(hsv[0] + shift);
    hsv_to_rgb(hsv, rgb);
  }
}

float box_radius(float radius, int passes) {
  const float sigma2 = radius * radius / static_cast<float>(passes);
  const auto length = static_cast<float>(std::sqrt(12.0 * sigma2 + 1.0));
  const auto l = static_cast<float>(std::floor((length - 1.0) / 2.0));
  float a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2);
  a /= 6 * (sigma2 - (l + 1) * (l + 1));
  return l + a;
}

// One extended box blur along a line of `count` RGB pixels `stride` bytes apart:
// out[x] = ww * sum(in[x-r .. x+r]) + fw * (in[x-r-1] + in[x+r+1]), edges extended.
void box_blur_line(
    uint8_t* line,
    int64_t count,
    int64_t stride,
    float float_radius,
    std::vector<uint8_t>& scratch) {
  const auto radius = static_cast<int64_t>(float_radius);
  const auto ww = static_cast<uint32_t>(static_cast<float>(1 << 24) / (float_radius * 2 + 1));
  const uint32_t fw = ((1u << 24) - static_cast<uint32_t>(radius * 2 + 1) * ww) / 2;
  scratch.resize(static_cast<size_t>(count * 3));
  auto value = [&](int64_t i, int c) -> uint32_t {
    return line[std::clamp<int64_t>(i, 0, count - 1) * stride + c];
  };
  for (int c = 0; c < 3; ++c) {
    uint32_t acc = 0;
    for (int64_t k = -radius - 1; k <= radius - 1; ++k) {
      acc += value(k, c); // the window centred on pixel -1
    }
    for (int64_t x = 0; x < count; ++x) {
      acc += value(x + radius, c) - value(x - radius - 1, c);
      const uint32_t bulk = acc * ww + (value(x - radius - 1, c) + value(x + radius + 1, c)) * fw;
      scratch[static_cast<size_t>(x * 3 + c)] = static_cast<uint8_t>((bulk + (1u << 23)) >> 24);
    }
  }
  for (int64_t x = 0; x < count; ++x) {
    std::copy_n(scratch.data() + x * 3, 3, line + x * stride);
  }
}

void plain_pil_blur(Image& image, double radius) {
  const float float_radius = box_radius(static_cast<float>(radius), 3);
  std::vector<uint8_t> scratch;
  for (int pass = 0; pass < 3; ++pass) {
    for (int64_t y = 0; y < image.height; ++y) {
      box_blur_line(image.row(y), image.width, 3, float_radius, scratch);
    }
  }
  for (int pass = 0; pass < 3; ++pass) {
    for (int64_t x = 0; x < image.width; ++x) {
      box_blur_line(
          image.pixels.data() + x * 3, image.height, image.width * 3, float_radius, scratch);
    }
  }
}

// ---- cases -------------------------------------------------------------------------------

Image random_image(int64_t width, int64_t height, std::mt19937& rng) {
  Image image;
  image.reshape(width, height);
  for (uint8_t& value : image.pixels) {
    value = static_cast<uint8_t>(rng() % 256);
  }
  return image;
}

// Every colour on a grid of step 5 per channel (with 255), so every hue case, tie and range.
Image colour_grid() {
  std::vector<int> levels;
  for (int v = 0; v < 256; v += 5) {
    levels.push_back(v);
  }
  levels.push_back(254);
  Image image;
  const auto n = static_cast<int64_t>(levels.size());
  image.reshape(n * n, n);
  uint8_t* out = image.pixels.data();
  for (const int r : levels) {
    for (const int g : levels) {
      for (const int b : levels) {
        *out++ = static_cast<uint8_t>(r);
        *out++ = static_cast<uint8_t>(g);
        *out++ = static_cast<uint8_t>(b);
      }
    }
  }
  return image;
}

TEST(PilKernels, HueShiftEqualsPilsRgbHsvRoundTripForEveryShift) {
  const Image grid = colour_grid();
  std::vector<int> shifts = {1, 2, 127, 129, 254, 255}; // 128: no factor in [-0.5, 0.5] gives it
  for (int shift = 0; shift < 256; shift += 7) {
    shifts.push_back(shift);
  }
  for (const int shift : shifts) {
    const double factor = shift <= 127 ? (shift + 0.5) / 255 : (shift - 256 - 0.5) / 255;
    Image fast = grid;
    Image plain = grid;
    adjust_hue(fast, factor);
    plain_hue(plain, static_cast<uint8_t>(shift));
    ASSERT_EQ(fast.pixels, plain.pixels) << "shift " << shift;
  }
}

TEST(PilKernels, BlendsEqualPilsBlendIncludingExtrapolation) {
  std::mt19937 rng(7);
  const Image grid = colour_grid();
  const Image noise = random_image(61, 17, rng);
  for (const double factor : {0.0, 1e-8, 0.3, 0.5, 0.99999994, 1.0, 1.0000001, 1.37, 1.8, 2.0}) {
    for (const Image* source : {&grid, &noise}) {
      Image fast = *source;
      Image plain = *source;
      adjust_brightness(fast, factor);
      plain_blend(plain, factor, 0);
      EXPECT_EQ(fast.pixels, plain.pixels) << "brightness " << factor;
      fast = *source;
      plain = *source;
      adjust_saturation(fast, factor);
      plain_blend(plain, factor, -1);
      EXPECT_EQ(fast.pixels, plain.pixels) << "saturation " << factor;
      fast = *source;
      adjust_contrast(fast, factor);
      plain = *source;
      int64_t sum = 0;
      for (int64_t i = 0; i < plain.width * plain.height; ++i) {
        sum += luma(plain.pixels.data() + 3 * i);
      }
      const double mean =
          static_cast<double>(sum) / static_cast<double>(plain.width * plain.height);
      plain_blend(plain, factor, static_cast<int>(mean + 0.5));
      EXPECT_EQ(fast.pixels, plain.pixels) << "contrast " << factor;
    }
  }
}

TEST(PilKernels, BoxBlurEqualsPilsLineByLineBlurOnAnySizeAndRadius) {
  std::mt19937 rng(11);
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1}, {1, 7}, {7, 1}, {2, 3}, {37, 23}, {96, 96}};
  for (const auto& [width, height] : sizes) {
    const Image source = random_image(width, height, rng);
    for (const double radius : {0.0, 0.1, 0.3, 0.99, 1.0, 1.7, 2.0, 6.0, 40.0}) {
      Image fast = source;
      Image plain = source;
      pil_gaussian_blur(fast, radius);
      plain_pil_blur(plain, radius);
      ASSERT_EQ(fast.pixels, plain.pixels) << width << "x" << height << " radius " << radius;
    }
  }
}

} // namespace
} // namespace largo::data::pil_kernels_test
