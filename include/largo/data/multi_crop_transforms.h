// VISSL's transforms for several views of one image (SwAV's multi-crop, SimCLR's and BYOL's
// pairs), per sample:
//   view splitters   one image -> several views: ImgPilToMultiCrop (a RandomResizedCrop per
//                    crop), ImgReplicatePil (copies);
//   view transforms  what follows a splitter, on every view: any SampleTransform applied to
//                    each view (EachView), or ImgPilMultiCropRandomApply (the i-th view's
//                    transforms with probability prob[i]).
// multi_view_pipeline.h chains them and writes each view into its own uint8 batch.
//
// Random draws follow VISSL's order from the sample's one generator: VISSL applies each
// transform of the list to every crop before the next transform (SSLTransformsWrapper), so
// the draws are transform-major, view by view within a transform. Seeded alike, the views
// are exactly what VISSL's transforms make with torch.manual_seed (except where a transform
// says it draws from torch instead of NumPy/random, e.g. ImgPilGaussianBlur).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "largo/data/sample_image.h"
#include "largo/data/sample_transforms.h"

namespace largo::data {

// One size per view (nullopt: unknown, or depends on the image).
using ViewSizes = std::vector<std::optional<ImageSize>>;

// Turns one sample into its views.
class ViewSplitter {
 public:
  virtual ~ViewSplitter();
  // The views of `image` (which is materialised once; the views read its pixels in place,
  // so `image` must outlive them), drawing from `gen`.
  virtual std::vector<SampleImage> split(SampleImage& image, at::Generator& gen) const = 0;
  virtual int64_t num_views() const = 0;
  // The size of each view for an input of `input` size.
  virtual ViewSizes view_sizes(std::optional<ImageSize> input) const = 0;
  virtual std::string name() const = 0;
};

// VISSL's ImgPilToMultiCrop: total_num_crops square crops, num_crops[g] of them of size
// size_crops[g] cut by RandomResizedCrop(size_crops[g], scale=crop_scales[g]) (torchvision's
// default ratio and bilinear interpolation), group after group.
class ImgPilToMultiCrop : public ViewSplitter {
 public:
  // Throws ConfigError, naming the argument and its value, unless sum(num_crops) ==
  // total_num_crops, len(size_crops) == len(num_crops) == len(crop_scales), every count
  // >= 1, every size >= 1 and every scale a (min, max) with 0 < min <= max.
  ImgPilToMultiCrop(
      int64_t total_num_crops,
      std::vector<int64_t> num_crops,
      std::vector<int64_t> size_crops,
      std::vector<std::pair<double, double>> crop_scales);

  std::vector<SampleImage> split(SampleImage& image, at::Generator& gen) const override;
  int64_t num_views() const override;
  ViewSizes view_sizes(std::optional<ImageSize> input) const override;
  std::string name() const override;

  // The crop boxes split() cuts from an image of `input` size, drawn from `gen` as split()
  // draws them (RandomResizedCrop.get_params per crop, in crop order).
  std::vector<CropBox> draw_boxes(ImageSize input, at::Generator& gen) const;

 private:
  // Per view.
  std::vector<ImageSize> sizes_;
  std::vector<std::pair<double, double>> scales_;
};

// VISSL's ImgReplicatePil: num_times copies of the image (SimCLR's two views, each then
// cropped by the transforms that follow).
class ImgReplicatePil : public ViewSplitter {
 public:
  // Throws ConfigError for num_times < 1.
  explicit ImgReplicatePil(int64_t num_times = 2);
  std::vector<SampleImage> split(SampleImage& image, at::Generator& gen) const override;
  int64_t num_views() const override;
  ViewSizes view_sizes(std::optional<ImageSize> input) const override;
  std::string name() const override;

 private:
  int64_t num_times_;
};

// A transform of the views that follow a splitter.
class ViewTransform {
 public:
  virtual ~ViewTransform();
  virtual void apply(std::vector<SampleImage>& views, at::Generator& gen) const = 0;
  virtual ViewSizes view_sizes(ViewSizes input) const = 0;
  virtual std::string name() const = 0;
  // The number of views it is made for; nullopt: any.
  virtual std::optional<int64_t> num_views() const;
};

// A per-sample transform applied to every view in turn (VISSL's default for a transform that
// takes one image, when it meets a list of crops).
class EachView : public ViewTransform {
 public:
  explicit EachView(std::shared_ptr<const SampleTransform> transform);
  void apply(std::vector<SampleImage>& views, at::Generator& gen) const override;
  ViewSizes view_sizes(ViewSizes input) const override;
  std::string name() const override;

 private:
  std::shared_ptr<const SampleTransform> transform_;
};

// VISSL's ImgPilMultiCropRandomApply (BYOL): view i gets the composition of `transforms`
// with probability prob[i] (torchvision's RandomApply: skipped when prob[i] < torch.rand(1)).
class ImgPilMultiCropRandomApply : public ViewTransform {
 public:
  // Throws ConfigError for an empty prob or one outside [0, 1], or a transform that
  // changes the size of a view (the views' sizes would then depend on the draws).
  ImgPilMultiCropRandomApply(
      std::vector<std::shared_ptr<const SampleTransform>> transforms, std::vector<double> prob);
  void apply(std::vector<SampleImage>& views, at::Generator& gen) const override;
  ViewSizes view_sizes(ViewSizes input) const override;
  std::string name() const override;
  std::optional<int64_t> num_views() const override;

 private:
  std::vector<std::shared_ptr<const SampleTransform>> transforms_;
  std::vector<double> prob_;
};

} // namespace largo::data
