// Blurs per sample: torchvision's GaussianBlur (a true Gaussian, the tensor convolution
// torchvision runs even on PIL images) and VISSL's ImgPilGaussianBlur (PIL's
// ImageFilter.GaussianBlur: three box-blur passes per direction approximating a Gaussian).
#pragma once

#include <string>
#include <utility>

#include "largo/data/sample_transforms.h"

namespace largo::data {

// torchvision's F.gaussian_blur on a uint8 image: the float32 kernel
// exp(-x^2 / (2 sigma^2)) / sum over x in linspace(-(k-1)/2, (k-1)/2, k), reflect padding,
// rounding half to even. Largo filters rows then columns (torchvision convolves with the
// 2-D outer-product kernel): float32 sums in another order, so a value can differ by 1
// where the exact result lies within float rounding of .5.
void gaussian_blur(
    Image& image, int64_t kernel_width, int64_t kernel_height, double sigma_x, double sigma_y);

// PIL's Image.filter(ImageFilter.GaussianBlur(radius)): extended box blurs (3 passes
// horizontally, then 3 vertically) in PIL's 8.24 fixed point, edges extended.
void pil_gaussian_blur(Image& image, double radius);

// torchvision's GaussianBlur(kernel_size, sigma=(0.1, 2.0)): sigma drawn uniformly per sample.
class GaussianBlur : public SampleTransform {
 public:
  // Kernel sizes must be odd and >= 1; 0 < sigma.first <= sigma.second.
  GaussianBlur(ImageSize kernel_size, std::pair<double, double> sigma = {0.1, 2.0});
  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;

 private:
  ImageSize kernel_size_;
  std::pair<double, double> sigma_;
};

// VISSL's ImgPilGaussianBlur(p, radius_min, radius_max): with probability p (rand <= p) blur
// with a radius drawn uniformly from [radius_min, radius_max]. (VISSL draws with NumPy and
// Python's random; Largo from the sample's torch generator.)
class ImgPilGaussianBlur : public SampleTransform {
 public:
  ImgPilGaussianBlur(double p, double radius_min, double radius_max);
  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;

 private:
  double p_;
  double radius_min_;
  double radius_max_;
};

} // namespace largo::data
