// VISSL's multi-view transforms (img_pil_to_multicrop.py, img_replicate_pil.py,
// img_pil_multicrop_random_apply.py), with their draws in VISSL's order.
#include "largo/data/multi_crop_transforms.h"

#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "largo/core/error.h"

namespace largo::data {

ViewSplitter::~ViewSplitter() = default;
ViewTransform::~ViewTransform() = default;

std::optional<int64_t> ViewTransform::num_views() const {
  return std::nullopt;
}

// ---- ImgPilToMultiCrop ------------------------------------------------------------------

ImgPilToMultiCrop::ImgPilToMultiCrop(
    int64_t total_num_crops,
    std::vector<int64_t> num_crops,
    std::vector<int64_t> size_crops,
    std::vector<std::pair<double, double>> crop_scales) {
  // VISSL asserts these; the messages say which argument holds what.
  if (size_crops.size() != num_crops.size() || crop_scales.size() != num_crops.size()) {
    throw ConfigError(fmt::format(
        "ImgPilToMultiCrop: size_crops ({} values: {}), num_crops ({} values: {}) and "
        "crop_scales ({} pairs) must have one entry per crop size",
        size_crops.size(),
        size_crops,
        num_crops.size(),
        num_crops,
        crop_scales.size()));
  }
  if (num_crops.empty()) {
    throw ConfigError("ImgPilToMultiCrop: num_crops is empty; expected at least one crop size");
  }
  const int64_t sum = std::accumulate(num_crops.begin(), num_crops.end(), int64_t{0});
  if (sum != total_num_crops) {
    throw ConfigError(fmt::format(
        "ImgPilToMultiCrop: sum(num_crops) = sum({}) = {} != total_num_crops = {}",
        num_crops,
        sum,
        total_num_crops));
  }
  for (size_t group = 0; group < num_crops.size(); ++group) {
    if (num_crops[group] < 1) {
      throw ConfigError(fmt::format(
          "ImgPilToMultiCrop: num_crops[{}] = {}; expected a count >= 1", group, num_crops[group]));
    }
    const auto [low, high] = crop_scales[group];
    if (!(low > 0.0 && low <= high)) {
      throw ConfigError(fmt::format(
          "ImgPilToMultiCrop: crop_scales[{}] = [{}, {}]; expected [min, max] with 0 < min <= max",
          group,
          low,
          high));
    }
    if (size_crops[group] < 1) {
      throw ConfigError(fmt::format(
          "ImgPilToMultiCrop: size_crops[{}] = {}; expected a size >= 1",
          group,
          size_crops[group]));
    }
    for (int64_t i = 0; i < num_crops[group]; ++i) {
      sizes_.push_back(ImageSize{size_crops[group], size_crops[group]});
      scales_.push_back(crop_scales[group]);
    }
  }
}

std::vector<CropBox> ImgPilToMultiCrop::draw_boxes(ImageSize input, at::Generator& gen) const {
  // torchvision's RandomResizedCrop defaults, which VISSL keeps.
  constexpr std::pair<double, double> kRatio{3.0 / 4.0, 4.0 / 3.0};
  std::vector<CropBox> boxes;
  for (const auto& scale : scales_) {
    boxes.push_back(RandomResizedCrop::get_params(input.height, input.width, scale, kRatio, gen));
  }
  return boxes;
}

std::vector<SampleImage> ImgPilToMultiCrop::split(SampleImage& image, at::Generator& gen) const {
  // As RandomResizedCrop(size, scale).apply per crop: its draws are all in get_params.
  const std::vector<CropBox> boxes = draw_boxes(ImageSize{image.height(), image.width()}, gen);
  std::vector<SampleImage> views;
  views.reserve(boxes.size());
  for (size_t k = 0; k < boxes.size(); ++k) {
    views.push_back(SampleImage::view_of(image));
    views.back().crop(boxes[k].top, boxes[k].left, boxes[k].height, boxes[k].width);
    views.back().resize(sizes_[k].height, sizes_[k].width, Interpolation::kBilinear);
  }
  return views;
}

int64_t ImgPilToMultiCrop::num_views() const {
  return static_cast<int64_t>(sizes_.size());
}

ViewSizes ImgPilToMultiCrop::view_sizes(std::optional<ImageSize> /*input*/) const {
  return ViewSizes(sizes_.begin(), sizes_.end());
}

std::string ImgPilToMultiCrop::name() const {
  return "ImgPilToMultiCrop";
}

// ---- ImgReplicatePil --------------------------------------------------------------------

ImgReplicatePil::ImgReplicatePil(int64_t num_times) : num_times_(num_times) {
  if (num_times_ < 1) {
    throw ConfigError(
        fmt::format("ImgReplicatePil: num_times = {}; expected a count >= 1", num_times_));
  }
}

std::vector<SampleImage> ImgReplicatePil::split(SampleImage& image, at::Generator& /*gen*/) const {
  std::vector<SampleImage> views;
  views.reserve(static_cast<size_t>(num_times_));
  for (int64_t i = 0; i < num_times_; ++i) {
    views.push_back(SampleImage::view_of(image));
  }
  return views;
}

int64_t ImgReplicatePil::num_views() const {
  return num_times_;
}

ViewSizes ImgReplicatePil::view_sizes(std::optional<ImageSize> input) const {
  return ViewSizes(static_cast<size_t>(num_times_), input);
}

std::string ImgReplicatePil::name() const {
  return "ImgReplicatePil";
}

// ---- EachView ---------------------------------------------------------------------------

EachView::EachView(std::shared_ptr<const SampleTransform> transform)
    : transform_(std::move(transform)) {
  TORCH_CHECK(transform_ != nullptr, "EachView: transform is null");
}

void EachView::apply(std::vector<SampleImage>& views, at::Generator& gen) const {
  for (SampleImage& view : views) {
    transform_->apply(view, gen);
  }
}

ViewSizes EachView::view_sizes(ViewSizes input) const {
  for (std::optional<ImageSize>& size : input) {
    size = transform_->output_size(size);
  }
  return input;
}

std::string EachView::name() const {
  return transform_->name();
}

// ---- ImgPilMultiCropRandomApply ---------------------------------------------------------

ImgPilMultiCropRandomApply::ImgPilMultiCropRandomApply(
    std::vector<std::shared_ptr<const SampleTransform>> transforms, std::vector<double> prob)
    : transforms_(std::move(transforms)), prob_(std::move(prob)) {
  if (prob_.empty()) {
    throw ConfigError(
        "ImgPilMultiCropRandomApply: prob is empty; expected one probability per crop");
  }
  for (size_t i = 0; i < prob_.size(); ++i) {
    checked_probability(prob_[i], fmt::format("ImgPilMultiCropRandomApply: prob[{}]", i));
  }
}

void ImgPilMultiCropRandomApply::apply(std::vector<SampleImage>& views, at::Generator& gen) const {
  TORCH_CHECK(
      views.size() == prob_.size(),
      "ImgPilMultiCropRandomApply: ",
      views.size(),
      " views but ",
      prob_.size(),
      " probabilities");
  for (size_t i = 0; i < views.size(); ++i) {
    // RandomApply: `if self.p < torch.rand(1): return img`.
    if (at::rand({1}, gen).gt(prob_[i]).item<bool>()) {
      continue;
    }
    for (const auto& transform : transforms_) {
      transform->apply(views[i], gen);
    }
  }
}

ViewSizes ImgPilMultiCropRandomApply::view_sizes(ViewSizes input) const {
  for (size_t i = 0; i < input.size(); ++i) {
    std::optional<ImageSize> size = input[i];
    for (const auto& transform : transforms_) {
      size = transform->output_size(size);
    }
    if (size != input[i]) {
      // Applied or not at random: a size change would make the view's size random too.
      throw ConfigError(fmt::format(
          "ImgPilMultiCropRandomApply: its transforms change the size of crop {}; only "
          "transforms that keep the size (colour, blur, flip, solarize) can be applied at random",
          i));
    }
  }
  return input;
}

std::string ImgPilMultiCropRandomApply::name() const {
  return "ImgPilMultiCropRandomApply";
}

std::optional<int64_t> ImgPilMultiCropRandomApply::num_views() const {
  return static_cast<int64_t>(prob_.size());
}

} // namespace largo::data
