// Geometric per-sample transforms, following torchvision 0.14's transforms.py and
// functional.py (PIL path) step by step, including their integer rounding.
#include "largo/data/sample_transforms.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "largo/core/error.h"

namespace largo::data {
namespace {

// Python's round() for the non-negative values used here: half to even.
int64_t python_round(double value) {
  return static_cast<int64_t>(std::nearbyint(value));
}

void check_size(ImageSize size, const std::string& name) {
  if (size.height < 1 || size.width < 1) {
    throw ConfigError(
        fmt::format("{}: size must be >= 1, got {}x{}", name, size.height, size.width));
  }
}

} // namespace

SampleTransform::~SampleTransform() = default;

std::optional<ImageSize> SampleTransform::output_size(std::optional<ImageSize> input) const {
  return input;
}

double checked_probability(double p, const std::string& what) {
  if (!(p >= 0.0 && p <= 1.0)) {
    throw ConfigError(fmt::format("{} must be a probability in [0, 1], got {}", what, p));
  }
  return p;
}

bool draw_below(double p, at::Generator& gen) {
  return at::rand({1}, gen).lt(p).item<bool>();
}

double draw_uniform(double low, double high, at::Generator& gen) {
  return at::empty({1}, at::kFloat).uniform_(low, high, gen).item<double>();
}

// ---- RandomResizedCrop ------------------------------------------------------------------

RandomResizedCrop::RandomResizedCrop(
    ImageSize size,
    std::pair<double, double> scale,
    std::pair<double, double> ratio,
    Interpolation interpolation)
    : size_(size), scale_(scale), ratio_(ratio), interpolation_(interpolation) {
  check_size(size_, name());
  if (!(scale_.first > 0 && scale_.first <= scale_.second) ||
      !(ratio_.first > 0 && ratio_.first <= ratio_.second)) {
    throw ConfigError(fmt::format(
        "RandomResizedCrop: scale and ratio must be (min, max) with 0 < min <= max, got "
        "scale=({}, {}) ratio=({}, {})",
        scale_.first,
        scale_.second,
        ratio_.first,
        ratio_.second));
  }
}

CropBox RandomResizedCrop::get_params(
    int64_t height,
    int64_t width,
    std::pair<double, double> scale,
    std::pair<double, double> ratio,
    at::Generator& gen) {
  const double area = static_cast<double>(height * width);
  // torch.log(torch.tensor(ratio)): float32.
  const at::Tensor log_ratio = at::log(at::tensor({ratio.first, ratio.second}, at::kFloat));
  const double log_low = log_ratio[0].item<double>();
  const double log_high = log_ratio[1].item<double>();
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * draw_uniform(scale.first, scale.second, gen);
    const double aspect_ratio =
        at::exp(at::empty({1}, at::kFloat).uniform_(log_low, log_high, gen)).item<double>();
    const int64_t w = python_round(std::sqrt(target_area * aspect_ratio));
    const int64_t h = python_round(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int64_t i = at::randint(0, height - h + 1, {1}, gen, at::kLong).item<int64_t>();
      const int64_t j = at::randint(0, width - w + 1, {1}, gen, at::kLong).item<int64_t>();
      return CropBox{i, j, h, w};
    }
  }
  // Fallback to a central crop of the image's ratio clamped into `ratio`.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width;
  int64_t h = height;
  if (in_ratio < ratio.first) {
    h = python_round(static_cast<double>(w) / ratio.first);
  } else if (in_ratio > ratio.second) {
    w = python_round(static_cast<double>(h) * ratio.second);
  }
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

void RandomResizedCrop::apply(SampleImage& image, at::Generator& gen) const {
  const CropBox box = get_params(image.height(), image.width(), scale_, ratio_, gen);
  image.crop(box.top, box.left, box.height, box.width);
  image.resize(size_.height, size_.width, interpolation_);
}

std::string RandomResizedCrop::name() const {
  return "RandomResizedCrop";
}

std::optional<ImageSize> RandomResizedCrop::output_size(std::optional<ImageSize> /*input*/) const {
  return size_;
}

// ---- Resize -----------------------------------------------------------------------------

Resize::Resize(
    std::vector<int64_t> size, Interpolation interpolation, std::optional<int64_t> max_size)
    : size_(std::move(size)), interpolation_(interpolation), max_size_(max_size) {
  if ((size_.size() != 1 && size_.size() != 2) || size_[0] < 1 || size_.back() < 1) {
    throw ConfigError(
        fmt::format("Resize: size must be [s] or [h, w] with values >= 1, got {}", size_));
  }
  if (max_size_ && (size_.size() != 1 || *max_size_ <= size_[0])) {
    throw ConfigError(fmt::format(
        "Resize: max_size ({}) needs size = [s] (the shorter side) and must be greater than s, got "
        "size {}",
        *max_size_,
        size_));
  }
}

ImageSize Resize::resized_size(ImageSize input) const {
  if (size_.size() == 2) {
    return ImageSize{size_[0], size_[1]};
  }
  const int64_t h = input.height;
  const int64_t w = input.width;
  const int64_t short_side = w <= h ? w : h;
  const int64_t long_side = w <= h ? h : w;
  int64_t new_short = size_[0];
  // Python: int(requested * long / short), float division then truncation.
  int64_t new_long = static_cast<int64_t>(
      static_cast<double>(new_short * long_side) / static_cast<double>(short_side));
  if (max_size_ && new_long > *max_size_) {
    new_short = static_cast<int64_t>(
        static_cast<double>(*max_size_ * new_short) / static_cast<double>(new_long));
    new_long = *max_size_;
  }
  return w <= h ? ImageSize{new_long, new_short} : ImageSize{new_short, new_long};
}

void Resize::apply(SampleImage& image, at::Generator& /*gen*/) const {
  const ImageSize target = resized_size(ImageSize{image.height(), image.width()});
  image.resize(target.height, target.width, interpolation_);
}

std::string Resize::name() const {
  return "Resize";
}

std::optional<ImageSize> Resize::output_size(std::optional<ImageSize> input) const {
  if (size_.size() == 2) {
    return ImageSize{size_[0], size_[1]};
  }
  if (input) {
    return resized_size(*input);
  }
  return std::nullopt;
}

// ---- CenterCrop -------------------------------------------------------------------------

CenterCrop::CenterCrop(ImageSize size) : size_(size) {
  check_size(size_, name());
}

CropBox CenterCrop::box(ImageSize input) const {
  // torchvision pads (left = (crop - size) // 2 on each short axis) and then crops the
  // padded image at round((padded - crop) / 2.0); in the unpadded image that is:
  auto offset = [](int64_t image, int64_t crop) -> int64_t {
    if (crop > image) {
      return -((crop - image) / 2);
    }
    return python_round(static_cast<double>(image - crop) / 2.0);
  };
  return CropBox{
      offset(input.height, size_.height),
      offset(input.width, size_.width),
      size_.height,
      size_.width};
}

void CenterCrop::apply(SampleImage& image, at::Generator& /*gen*/) const {
  const CropBox crop = box(ImageSize{image.height(), image.width()});
  image.crop(crop.top, crop.left, crop.height, crop.width);
}

std::string CenterCrop::name() const {
  return "CenterCrop";
}

std::optional<ImageSize> CenterCrop::output_size(std::optional<ImageSize> /*input*/) const {
  return size_;
}

// ---- RandomCrop -------------------------------------------------------------------------

RandomCropSample::RandomCropSample(ImageSize size, int64_t padding, bool pad_if_needed)
    : size_(size), padding_(padding), pad_if_needed_(pad_if_needed) {
  check_size(size_, name());
  if (padding_ < 0) {
    throw ConfigError(fmt::format("RandomCrop: padding must be >= 0, got {}", padding_));
  }
}

CropBox RandomCropSample::get_params(ImageSize input, at::Generator& gen) const {
  // torchvision pads `padding` on all sides, then (pad_if_needed) F.pad(img, [lack, 0])
  // for the width and [0, lack] for the height: `lack` on both sides of that axis.
  auto before = [&](int64_t extent, int64_t crop) {
    const int64_t padded = extent + 2 * padding_;
    const int64_t lack = pad_if_needed_ && padded < crop ? crop - padded : 0;
    return std::pair{padding_ + lack, padded + 2 * lack};
  };
  const auto [top_pad, height] = before(input.height, size_.height);
  const auto [left_pad, width] = before(input.width, size_.width);
  if (height < size_.height || width < size_.width) {
    throw DataError(fmt::format(
        "RandomCrop: the crop {}x{} (h x w) is larger than the padded image {}x{}; set "
        "pad_if_needed: True or a padding, or resize the images first",
        size_.height,
        size_.width,
        height,
        width));
  }
  if (height == size_.height && width == size_.width) {
    return CropBox{-top_pad, -left_pad, size_.height, size_.width};
  }
  const int64_t i = at::randint(0, height - size_.height + 1, {1}, gen, at::kLong).item<int64_t>();
  const int64_t j = at::randint(0, width - size_.width + 1, {1}, gen, at::kLong).item<int64_t>();
  return CropBox{i - top_pad, j - left_pad, size_.height, size_.width};
}

void RandomCropSample::apply(SampleImage& image, at::Generator& gen) const {
  const CropBox box = get_params(ImageSize{image.height(), image.width()}, gen);
  image.crop(box.top, box.left, box.height, box.width);
}

std::string RandomCropSample::name() const {
  return "RandomCrop";
}

std::optional<ImageSize> RandomCropSample::output_size(std::optional<ImageSize> /*input*/) const {
  return size_;
}

// ---- RandomHorizontalFlip ---------------------------------------------------------------

RandomHorizontalFlipSample::RandomHorizontalFlipSample(double p)
    : p_(checked_probability(p, "RandomHorizontalFlip: p")) {}

void RandomHorizontalFlipSample::apply(SampleImage& image, at::Generator& gen) const {
  if (draw_below(p_, gen)) {
    image.hflip();
  }
}

std::string RandomHorizontalFlipSample::name() const {
  return "RandomHorizontalFlip";
}

} // namespace largo::data
