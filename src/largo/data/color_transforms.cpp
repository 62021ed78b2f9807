// PIL's colour arithmetic (Pillow 9: Blend.c for ImageEnhance, Convert.c for L and HSV),
// written from its published formulas, with the same float/double/int types so the bytes
// match.
#include "largo/data/color_transforms.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "largo/core/error.h"
#include "pil_hue_shift.h"

namespace largo::data {
namespace {

// PIL's RGB -> L (ITU-R 601-2 luma), 16-bit fixed point.
inline uint8_t luma(const uint8_t* rgb) {
  return static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

// PIL's Image.blend(degenerate, image, alpha) for one value: interpolation truncates,
// extrapolation clips then truncates (alpha is a C float in PIL). Clipping first then
// truncating covers both: an interpolation never leaves [0, 255], even rounded.
inline uint8_t blend(int degenerate, int value, float alpha) {
  const float mixed =
      static_cast<float>(degenerate) + alpha * static_cast<float>(value - degenerate);
  return static_cast<uint8_t>(std::clamp(mixed, 0.0f, 255.0f));
}

// Blends every value with one `degenerate` value: with it fixed, the blend is a function of
// the byte alone, a 256-entry table. alpha 1 is PIL's copy shortcut (the table would be the
// identity).
void blend_with_constant(Image& image, int degenerate, float alpha) {
  if (alpha == 1.0f) {
    return;
  }
  uint8_t table[256];
  for (int value = 0; value < 256; ++value) {
    table[value] = blend(degenerate, value, alpha);
  }
  for (uint8_t& value : image.pixels) {
    value = table[value];
  }
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
  blend_with_constant(image, 0, static_cast<float>(factor));
}

void adjust_contrast(Image& image, double factor) {
  // int(ImageStat.Stat(image.convert("L")).mean[0] + 0.5)
  const int64_t pixels = image.width * image.height;
  const uint8_t* rgb = image.pixels.data();
  int64_t sum = 0;
  for (int64_t i = 0; i < pixels; ++i) {
    sum += luma(rgb + 3 * i);
  }
  const double mean = pixels > 0 ? static_cast<double>(sum) / static_cast<double>(pixels) : 0.0;
  blend_with_constant(image, static_cast<int>(mean + 0.5), static_cast<float>(factor));
}

void adjust_saturation(Image& image, double factor) {
  const auto alpha = static_cast<float>(factor);
  if (alpha == 1.0f) {
    return;
  }
  // Each pixel blends with its own luma: PIL's product alpha * (value - luma) comes from a
  // table of the 511 differences, the rest is one float addition and a clip.
  float scaled[511];
  for (int difference = -255; difference <= 255; ++difference) {
    scaled[difference + 255] = alpha * static_cast<float>(difference);
  }
  const int64_t pixels = image.width * image.height;
  uint8_t* rgb = image.pixels.data();
  for (int64_t i = 0; i < pixels; ++i, rgb += 3) {
    const int gray = luma(rgb);
    const float* row = scaled + 255 - gray;
    for (int c = 0; c < 3; ++c) {
      const float mixed = static_cast<float>(gray) + row[rgb[c]];
      rgb[c] = static_cast<uint8_t>(std::clamp(mixed, 0.0f, 255.0f));
    }
  }
}

void adjust_hue(Image& image, double factor) {
  if (!(factor >= -0.5 && factor <= 0.5)) {
    throw DataError(fmt::format("adjust_hue: factor must be in [-0.5, 0.5], got {}", factor));
  }
  // np.uint8(factor * 255): the C conversion, which wraps negative values modulo 256.
  const auto shift = static_cast<uint8_t>(static_cast<int>(factor * 255));
  detail::pil_shift_hue(image.pixels.data(), image.width * image.height, shift);
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
