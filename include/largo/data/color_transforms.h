// Colour transforms per sample, with the pixel arithmetic of torchvision's PIL path (PIL's
// ImageEnhance blends, its RGB -> L and RGB <-> HSV conversions, ImageOps.solarize), so
// that for the same factors the output bytes equal torchvision's.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "largo/data/sample_transforms.h"

namespace largo::data {

// The functional operations (torchvision.transforms.functional.adjust_* on PIL images).
void adjust_brightness(Image& image, double factor);
void adjust_contrast(Image& image, double factor);
void adjust_saturation(Image& image, double factor);
// factor in [-0.5, 0.5]: the hue channel (0..255) is shifted by uint8(factor * 255).
void adjust_hue(Image& image, double factor);
// R = G = B = PIL's luma (R*299 + G*587 + B*114)/1000 in 16-bit fixed point.
void to_grayscale(Image& image);
// PIL's ImageOps.solarize: values >= threshold become 255 - value.
void solarize(Image& image, int threshold);

// torchvision's ColorJitter: factors drawn uniformly from each range, applied in a random
// order (torch.randperm(4)). A range of nullopt leaves that property alone.
class ColorJitter : public SampleTransform {
 public:
  using Range = std::optional<std::pair<double, double>>;

  // brightness/contrast/saturation: [lo, hi] with 0 <= lo <= hi; hue: -0.5 <= lo <= hi <= 0.5.
  // Throws ConfigError otherwise. Use from_strength() for torchvision's single-value form.
  ColorJitter(Range brightness, Range contrast, Range saturation, Range hue);
  // torchvision's value -> range: v -> [max(0, 1 - v), 1 + v] (hue: [-v, v]); 0 -> off.
  static Range factor_range(double strength, const std::string& what);
  static Range hue_range(double strength);

  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;

 private:
  Range brightness_;
  Range contrast_;
  Range saturation_;
  Range hue_;
};

// torchvision's RandomGrayscale: gray (3 equal channels) when torch.rand(1) < p.
class RandomGrayscale : public SampleTransform {
 public:
  explicit RandomGrayscale(double p = 0.1);
  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;

 private:
  double p_;
};

// VISSL's ImgPilRandomSolarize(prob), configured as {name: ImgPilRandomSolarize, p: 0.66}
// (VISSL's from_config reads "p"): with probability prob (torchvision's RandomApply:
// applied unless prob < torch.rand(1)), solarize at a threshold drawn uniformly from the
// integers 0..256. (VISSL draws the threshold with NumPy; Largo draws it from the sample's
// torch generator: same distribution, reproducible per sample.)
class ImgPilRandomSolarize : public SampleTransform {
 public:
  explicit ImgPilRandomSolarize(double prob);
  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;

 private:
  double prob_;
};

// VISSL's ImgPilColorDistortion(strength), SimCLR's colour distortion:
// RandomApply([ColorJitter(0.8 s, 0.8 s, 0.8 s, 0.2 s)], p=0.8) then RandomGrayscale(p=0.2),
// with torchvision's draws (RandomApply: jitter unless 0.8 < torch.rand(1)).
class ImgPilColorDistortion : public SampleTransform {
 public:
  // Throws ConfigError for strength < 0 or above 2.5 (the hue 0.2 * strength must stay
  // within torchvision's 0.5).
  explicit ImgPilColorDistortion(double strength = 1.0);
  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;

 private:
  static constexpr double kJitterProbability = 0.8;
  ColorJitter jitter_;
  RandomGrayscale grayscale_{0.2};
};

} // namespace largo::data
