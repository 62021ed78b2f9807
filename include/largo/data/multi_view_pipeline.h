// A TRANSFORMS list that makes several views of each image (VISSL's SwAV, SimCLR, BYOL
// lists), split where the work changes hands, as sample_pipeline.h splits a one-view list:
//   before     per-sample transforms before the splitter, on the one image;
//   splitter   the one ImgPilToMultiCrop or ImgReplicatePil (multi_crop_transforms.h);
//   per view   the transforms between the splitter and ToTensor, on every view (a
//              SampleTransform on each in turn, or ImgPilMultiCropRandomApply);
//   per batch  ToTensor and Normalize, on each view's whole uint8 batch in the loader.
// E.g. VISSL's SwAV list, ImgPilToMultiCrop -> RandomHorizontalFlip -> ImgPilColorDistortion
// -> ImgPilGaussianBlur -> ToTensor -> Normalize, flips, distorts and blurs every crop.
//
// The image is decoded once, in full (no DCT scaling: each crop reads the one decode), and
// each view is written as planar uint8 [3, h, w] into its own batch, so a loader delivers one
// tensor per view, [batch, 3, h, w] (Batch::views, VISSL's multicrop_collator).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "largo/data/image_decoder.h"
#include "largo/data/multi_crop_transforms.h"
#include "largo/data/transform_spec.h"
#include "largo/data/transforms.h"

namespace largo::data {

class MultiViewPipeline {
 public:
  // Throws ConfigError for a null splitter, or a view transform made for another number of
  // views than the splitter makes (ImgPilMultiCropRandomApply's len(prob)).
  MultiViewPipeline(
      std::vector<std::shared_ptr<const SampleTransform>> before,
      std::shared_ptr<const ViewSplitter> splitter,
      std::vector<std::shared_ptr<const ViewTransform>> per_view);

  // Runs the transforms on one encoded image and writes view k, planar uint8
  // [3, sizes[k].height, sizes[k].width], at outs[k]. Throws DataError naming the image when
  // it cannot be decoded or a view is not its size.
  void
  run(const EncodedImage& encoded,
      const DecodeOptions& options,
      at::Generator& gen,
      const std::vector<ImageSize>& sizes,
      const std::vector<uint8_t*>& outs) const;
  // The same on decoded pixels (an in-memory dataset's image); `name` names it in errors.
  void
  run(const Image& pixels,
      const std::string& name,
      at::Generator& gen,
      const std::vector<ImageSize>& sizes,
      const std::vector<uint8_t*>& outs) const;

  int64_t num_views() const;
  // Each view's size for an input of `input` size (nullopt: unknown).
  ViewSizes view_sizes(std::optional<ImageSize> input = std::nullopt) const;

  const std::vector<std::shared_ptr<const SampleTransform>>& before() const;
  const ViewSplitter& splitter() const;
  const std::vector<std::shared_ptr<const ViewTransform>>& per_view() const;

 private:
  // Transforms `image` into the views and writes them at `outs`, checking their sizes.
  void
  run(SampleImage& image,
      const std::string& name,
      at::Generator& gen,
      const std::vector<ImageSize>& sizes,
      const std::vector<uint8_t*>& outs) const;

  std::vector<std::shared_ptr<const SampleTransform>> before_;
  std::shared_ptr<const ViewSplitter> splitter_;
  std::vector<std::shared_ptr<const ViewTransform>> per_view_;
};

// Whether `name` makes or transforms several views (ImgPilToMultiCrop, ImgReplicatePil,
// ImgPilMultiCropRandomApply): such lists go to make_multi_view_transforms.
bool is_multi_view_transform(const std::string& name);
// Whether any transform of `specs` is one (the list makes several views per sample).
bool is_multi_view_list(const std::vector<TransformSpec>& specs);

struct MultiViewTransforms {
  MultiViewPipeline per_sample;
  TransformPipeline per_batch;
};

// Builds a multi-view list. Names and arguments (VISSL's), besides make_sample_transform's:
//   ImgPilToMultiCrop           total_num_crops, num_crops [n...], size_crops [s...],
//                               crop_scales [[min, max]...]  (one entry per crop size)
//   ImgReplicatePil             num_times 2
//   ImgPilMultiCropRandomApply  transforms [{name: ...}...], prob [p per view]
//   ImgPilColorDistortion       strength 1.0 (a per-sample transform, also in one-view lists)
// Throws ConfigError unless the list holds exactly one splitter before ToTensor,
// ImgPilMultiCropRandomApply comes after it, everything from ToTensor on is elementwise
// (ToTensor, Normalize: the batch-level flips and crops cannot act on several views), and
// every view's size is fixed; or for a bad argument, naming it, its value and the expectation.
MultiViewTransforms make_multi_view_transforms(const std::vector<TransformSpec>& specs);

} // namespace largo::data
