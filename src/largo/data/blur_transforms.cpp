// Gaussian blurs: torchvision's float kernel (separable here) and PIL's box-blur
// approximation (Pillow 9 libImaging/BoxBlur.c's arithmetic: radius from Gwosdek et al.
// 2011; the box blurs themselves in pil_box_blur.cpp).
#include "largo/data/blur_transforms.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "largo/core/error.h"
#include "pil_box_blur.h"

namespace largo::data {
namespace {

// torchvision's _get_gaussian_kernel1d in float32.
std::vector<float> gaussian_kernel(int64_t size, double sigma) {
  const at::Tensor x = at::linspace(-(size - 1) * 0.5, (size - 1) * 0.5, size, at::kFloat);
  const at::Tensor pdf = at::exp(x.div(sigma).pow(2).mul(-0.5));
  const at::Tensor kernel = pdf.div(pdf.sum()).contiguous();
  return std::vector<float>(kernel.data_ptr<float>(), kernel.data_ptr<float>() + size);
}

// torch's "reflect" padding index (edge not repeated), folded until inside.
int64_t reflect(int64_t i, int64_t size) {
  if (size == 1) {
    return 0;
  }
  const int64_t period = 2 * (size - 1);
  i = ((i % period) + period) % period;
  return i < size ? i : period - i;
}

// One separable float32 pass along rows (`along_x`) or columns, reflect-padded.
void convolve(
    const std::vector<float>& in,
    int64_t width,
    int64_t height,
    const std::vector<float>& kernel,
    bool along_x,
    std::vector<float>& out) {
  const auto taps = static_cast<int64_t>(kernel.size());
  const int64_t half = taps / 2;
  const int64_t length = along_x ? width : height;
  std::vector<int64_t> source(static_cast<size_t>(length * taps)); // [position, tap]
  for (int64_t i = 0; i < length; ++i) {
    for (int64_t k = 0; k < taps; ++k) {
      source[static_cast<size_t>(i * taps + k)] = reflect(i + k - half, length);
    }
  }
  out.assign(in.size(), 0.0f);
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      const int64_t* from = source.data() + (along_x ? x : y) * taps;
      float sum[3] = {0, 0, 0};
      for (int64_t k = 0; k < taps; ++k) {
        const int64_t pixel = along_x ? y * width + from[k] : from[k] * width + x;
        const float weight = kernel[static_cast<size_t>(k)];
        for (int c = 0; c < 3; ++c) {
          sum[c] += in[static_cast<size_t>(pixel * 3 + c)] * weight;
        }
      }
      std::copy(sum, sum + 3, out.begin() + (y * width + x) * 3);
    }
  }
}

// PIL's box radius for a Gaussian of `radius` made of `passes` box blurs.
float box_radius(float radius, int passes) {
  const float sigma2 = radius * radius / static_cast<float>(passes);
  const auto length = static_cast<float>(std::sqrt(12.0 * sigma2 + 1.0));
  const auto l = static_cast<float>(std::floor((length - 1.0) / 2.0));
  float a = (2 * l + 1) * (l * (l + 1) - 3 * sigma2);
  a /= 6 * (sigma2 - (l + 1) * (l + 1));
  return l + a;
}

} // namespace

void gaussian_blur(
    Image& image, int64_t kernel_width, int64_t kernel_height, double sigma_x, double sigma_y) {
  const std::vector<float> kernel_x = gaussian_kernel(kernel_width, sigma_x);
  const std::vector<float> kernel_y = gaussian_kernel(kernel_height, sigma_y);
  std::vector<float> values(image.pixels.begin(), image.pixels.end());
  std::vector<float> rows;
  std::vector<float> both;
  convolve(values, image.width, image.height, kernel_x, /*along_x=*/true, rows);
  convolve(rows, image.width, image.height, kernel_y, /*along_x=*/false, both);
  for (size_t i = 0; i < both.size(); ++i) {
    image.pixels[i] = static_cast<uint8_t>(std::clamp(std::nearbyint(both[i]), 0.0f, 255.0f));
  }
}

void pil_gaussian_blur(Image& image, double radius) {
  constexpr int kPasses = 3;
  detail::pil_box_blur(image, box_radius(static_cast<float>(radius), kPasses), kPasses);
}

// ---- GaussianBlur -----------------------------------------------------------------------

GaussianBlur::GaussianBlur(ImageSize kernel_size, std::pair<double, double> sigma)
    : kernel_size_(kernel_size), sigma_(sigma) {
  if (kernel_size_.width < 1 || kernel_size_.height < 1 || kernel_size_.width % 2 == 0 ||
      kernel_size_.height % 2 == 0) {
    throw ConfigError(fmt::format(
        "GaussianBlur: kernel_size must be odd and >= 1, got {}x{}",
        kernel_size_.width,
        kernel_size_.height));
  }
  if (!(sigma_.first > 0 && sigma_.first <= sigma_.second)) {
    throw ConfigError(fmt::format(
        "GaussianBlur: sigma must be (min, max) with 0 < min <= max, got ({}, {})",
        sigma_.first,
        sigma_.second));
  }
}

void GaussianBlur::apply(SampleImage& image, at::Generator& gen) const {
  const double sigma = draw_uniform(sigma_.first, sigma_.second, gen);
  gaussian_blur(image.pixels(), kernel_size_.width, kernel_size_.height, sigma, sigma);
}

std::string GaussianBlur::name() const {
  return "GaussianBlur";
}

// ---- ImgPilGaussianBlur -----------------------------------------------------------------

ImgPilGaussianBlur::ImgPilGaussianBlur(double p, double radius_min, double radius_max)
    : p_(p), radius_min_(radius_min), radius_max_(radius_max) {
  if (!(p_ >= 0 && p_ <= 1) || !(radius_min_ >= 0 && radius_min_ <= radius_max_)) {
    throw ConfigError(fmt::format(
        "ImgPilGaussianBlur: need 0 <= p <= 1 and 0 <= radius_min <= radius_max, got p={} "
        "radius_min={} radius_max={}",
        p_,
        radius_min_,
        radius_max_));
  }
}

void ImgPilGaussianBlur::apply(SampleImage& image, at::Generator& gen) const {
  if (at::rand({1}, gen).le(p_).item<bool>()) {
    pil_gaussian_blur(image.pixels(), draw_uniform(radius_min_, radius_max_, gen));
  }
}

std::string ImgPilGaussianBlur::name() const {
  return "ImgPilGaussianBlur";
}

} // namespace largo::data
