// PIL's colour arithmetic (Pillow 9: Blend.c for ImageEnhance, Convert.c for L and HSV),
// written from its published formulas, with the same float/double/int types so the bytes
// match.
#include "largo/data/color_transforms.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "largo/core/error.h"

namespace largo::data {
namespace {

// PIL's RGB -> L (ITU-R 601-2 luma), 16-bit fixed point.
inline uint8_t luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

// PIL's Image.blend(degenerate, image, alpha) for one value: interpolation truncates,
// extrapolation clips then truncates. alpha is a C float in PIL.
inline uint8_t blend(int degenerate, int value, float alpha) {
  const float mixed =
      static_cast<float>(degenerate) + alpha * static_cast<float>(value - degenerate);
  if (alpha >= 0 && alpha <= 1.0f) {
    return static_cast<uint8_t>(mixed);
  }
  if (mixed <= 0.0f) {
    return 0;
  }
  if (mixed >= 255.0f) {
    return 255;
  }
  return static_cast<uint8_t>(mixed);
}

// Blends every value of `image` with `degenerate(pixel, channel)`; alpha 0 and 1 are PIL's
// copy shortcuts.
template <typename Degenerate>
void blend_image(Image& image, double factor, Degenerate degenerate) {
  const auto alpha = static_cast<float>(factor);
  if (alpha == 1.0f) {
    return;
  }
  const int64_t pixels = image.width * image.height;
  uint8_t* data = image.pixels.data();
  for (int64_t i = 0; i < pixels; ++i) {
    uint8_t* rgb = data + 3 * i;
    const int base = degenerate(rgb);
    for (int c = 0; c < 3; ++c) {
      rgb[c] = alpha == 0.0f ? static_cast<uint8_t>(base) : blend(base, rgb[c], alpha);
    }
  }
}

inline uint8_t clip8(int value) {
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

ColorJitter::Range
checked_range(ColorJitter::Range range, const std::string& what, double low, double high) {
  if (range && !(range->first >= low && range->first <= range->second && range->second <= high)) {
    throw ConfigError(fmt::format(
        "ColorJitter: {} range must satisfy {} <= min <= max <= {}, got [{}, {}]",
        what,
        low,
        high,
        range->first,
        range->second));
  }
  return range;
}

} // namespace

void adjust_brightness(Image& image, double factor) {
  blend_image(image, factor, [](const uint8_t*) { return 0; });
}

void adjust_contrast(Image& image, double factor) {
  // int(ImageStat.Stat(image.convert("L")).mean[0] + 0.5)
  const int64_t pixels = image.width * image.height;
  int64_t sum = 0;
  for (int64_t i = 0; i < pixels; ++i) {
    sum += luma(image.pixels.data() + 3 * i);
  }
  const double mean = pixels > 0 ? static_cast<double>(sum) / static_cast<double>(pixels) : 0.0;
  const int degenerate = static_cast<int>(mean + 0.5);
  blend_image(image, factor, [degenerate](const uint8_t*) { return degenerate; });
}

void adjust_saturation(Image& image, double factor) {
  blend_image(image, factor, [](const uint8_t* rgb) { return static_cast<int>(luma(rgb)); });
}

void adjust_hue(Image& image, double factor) {
  if (!(factor >= -0.5 && factor <= 0.5)) {
    throw DataError(fmt::format("adjust_hue: factor must be in [-0.5, 0.5], got {}", factor));
  }
  // np.uint8(factor * 255): the C conversion, which wraps negative values modulo 256.
  const auto shift = static_cast<uint8_t>(static_cast<int>(factor * 255));
  const int64_t pixels = image.width * image.height;
  for (int64_t i = 0; i < pixels; ++i) {
    uint8_t* rgb = image.pixels.data() + 3 * i;
    uint8_t hsv[3];
    rgb_to_hsv(rgb, hsv);
    hsv[0] = static_cast<uint8_t>(hsv[0] + shift);
    hsv_to_rgb(hsv, rgb);
  }
}

void to_grayscale(Image& image) {
  const int64_t pixels = image.width * image.height;
  for (int64_t i = 0; i < pixels; ++i) {
    uint8_t* rgb = image.pixels.data() + 3 * i;
    rgb[0] = rgb[1] = rgb[2] = luma(rgb);
  }
}

void solarize(Image& image, int threshold) {
  for (uint8_t& value : image.pixels) {
    if (value >= threshold) {
      value = static_cast<uint8_t>(255 - value);
    }
  }
}

// ---- ColorJitter ------------------------------------------------------------------------

ColorJitter::ColorJitter(Range brightness, Range contrast, Range saturation, Range hue)
    : brightness_(checked_range(brightness, "brightness", 0.0, INFINITY)),
      contrast_(checked_range(contrast, "contrast", 0.0, INFINITY)),
      saturation_(checked_range(saturation, "saturation", 0.0, INFINITY)),
      hue_(checked_range(hue, "hue", -0.5, 0.5)) {}

ColorJitter::Range ColorJitter::factor_range(double strength, const std::string& what) {
  if (!(strength >= 0)) {
    throw ConfigError(fmt::format("ColorJitter: {} must be >= 0, got {}", what, strength));
  }
  if (strength == 0) {
    return std::nullopt;
  }
  return std::make_pair(std::max(0.0, 1.0 - strength), 1.0 + strength);
}

ColorJitter::Range ColorJitter::hue_range(double strength) {
  if (!(strength >= 0 && strength <= 0.5)) {
    throw ConfigError(fmt::format("ColorJitter: hue must be in [0, 0.5], got {}", strength));
  }
  if (strength == 0) {
    return std::nullopt;
  }
  return std::make_pair(-strength, strength);
}

void ColorJitter::apply(SampleImage& image, at::Generator& gen) const {
  // torchvision's get_params: the order first, then one factor per enabled property.
  const at::Tensor order = at::randperm(4, gen, at::kLong);
  double factors[4] = {0, 0, 0, 0};
  const Range* ranges[4] = {&brightness_, &contrast_, &saturation_, &hue_};
  for (int k = 0; k < 4; ++k) {
    if (*ranges[k]) {
      factors[k] = draw_uniform((*ranges[k])->first, (*ranges[k])->second, gen);
    }
  }
  Image& pixels = image.pixels();
  for (int k = 0; k < 4; ++k) {
    const int64_t which = order[k].item<int64_t>();
    if (!*ranges[which]) {
      continue;
    }
    switch (which) {
    case 0:
      adjust_brightness(pixels, factors[0]);
      break;
    case 1:
      adjust_contrast(pixels, factors[1]);
      break;
    case 2:
      adjust_saturation(pixels, factors[2]);
      break;
    default:
      adjust_hue(pixels, factors[3]);
      break;
    }
  }
}

std::string ColorJitter::name() const {
  return "ColorJitter";
}

// ---- RandomGrayscale --------------------------------------------------------------------

RandomGrayscale::RandomGrayscale(double p) : p_(checked_probability(p, "RandomGrayscale: p")) {}

void RandomGrayscale::apply(SampleImage& image, at::Generator& gen) const {
  if (draw_below(p_, gen)) {
    to_grayscale(image.pixels());
  }
}

std::string RandomGrayscale::name() const {
  return "RandomGrayscale";
}

// ---- ImgPilRandomSolarize ---------------------------------------------------------------

ImgPilRandomSolarize::ImgPilRandomSolarize(double prob)
    : prob_(checked_probability(prob, "ImgPilRandomSolarize: prob")) {}

void ImgPilRandomSolarize::apply(SampleImage& image, at::Generator& gen) const {
  // RandomApply: `if self.p < torch.rand(1): return img`.
  if (at::rand({1}, gen).gt(prob_).item<bool>()) {
    return;
  }
  const auto threshold = at::randint(0, 257, {1}, gen, at::kLong).item<int64_t>();
  solarize(image.pixels(), static_cast<int>(threshold));
}

std::string ImgPilRandomSolarize::name() const {
  return "ImgPilRandomSolarize";
}

// ---- ImgPilColorDistortion --------------------------------------------------------------

namespace {

// VISSL's ColorJitter(0.8 s, 0.8 s, 0.8 s, 0.2 s).
ColorJitter distortion_jitter(double strength) {
  // torchvision refuses a hue above 0.5: checked here to name the strength, not the hue.
  if (!(strength >= 0.0 && strength <= 2.5)) {
    throw ConfigError(fmt::format(
        "ImgPilColorDistortion: strength must be in [0, 2.5] (hue = 0.2 * strength <= 0.5), "
        "got {}",
        strength));
  }
  return ColorJitter(
      ColorJitter::factor_range(0.8 * strength, "brightness"),
      ColorJitter::factor_range(0.8 * strength, "contrast"),
      ColorJitter::factor_range(0.8 * strength, "saturation"),
      ColorJitter::hue_range(0.2 * strength));
}

} // namespace

ImgPilColorDistortion::ImgPilColorDistortion(double strength)
    : jitter_(distortion_jitter(strength)) {}

void ImgPilColorDistortion::apply(SampleImage& image, at::Generator& gen) const {
  // RandomApply: `if self.p < torch.rand(1): return img` (no jitter draws then).
  if (!at::rand({1}, gen).gt(kJitterProbability).item<bool>()) {
    jitter_.apply(image, gen);
  }
  grayscale_.apply(image, gen);
}

std::string ImgPilColorDistortion::name() const {
  return "ImgPilColorDistortion";
}

} // namespace largo::data
