// A TRANSFORMS list for image files, split where the work changes hands:
//   per sample  everything before the first ToTensor (RandomResizedCrop, Resize,
//               CenterCrop, RandomCrop, RandomHorizontalFlip, ColorJitter, RandomGrayscale,
//               GaussianBlur, ImgPilGaussianBlur, ImgPilRandomSolarize): decode + transform each
//               image into its slot of a uint8 batch (SamplePipeline);
//   per batch   ToTensor and what follows (Normalize; also the batch-level
//               RandomHorizontalFlip/RandomCrop of transforms.h): the loader applies them
//               to the whole uint8 batch, fused into one pass on the CPU or on the device
//               after the copy (data_loader.h).
// The two halves compose to exactly what torchvision computes per sample, because ToTensor
// and Normalize act on each value independently.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "largo/data/image_decoder.h"
#include "largo/data/sample_transforms.h"
#include "largo/data/transforms.h"

namespace largo::data {

class SamplePipeline {
 public:
  SamplePipeline() = default;
  explicit SamplePipeline(std::vector<std::shared_ptr<const SampleTransform>> transforms);

  // Runs the transforms on one encoded image and writes the result, planar uint8
  // [3, size.height, size.width], at `out`. Throws DataError naming the image when it
  // cannot be decoded or its output is not `size` (images of different sizes without a
  // transform that fixes the output size).
  void
  run(const EncodedImage& encoded,
      const DecodeOptions& options,
      at::Generator& gen,
      ImageSize size,
      uint8_t* out) const;
  // The same on decoded pixels (an in-memory dataset's image); `name` names it in errors.
  void
  run(const Image& pixels,
      const std::string& name,
      at::Generator& gen,
      ImageSize size,
      uint8_t* out) const;

  // The output size for an input of `input` size (nullopt: unknown), or nullopt when it
  // depends on the image.
  std::optional<ImageSize> output_size(std::optional<ImageSize> input = std::nullopt) const;
  const std::vector<std::shared_ptr<const SampleTransform>>& transforms() const;

 private:
  // Transforms `image` and writes it at `out`, checking it ends at `size`.
  void
  run(SampleImage& image, const std::string& name, at::Generator& gen, ImageSize size, uint8_t* out)
      const;

  std::vector<std::shared_ptr<const SampleTransform>> transforms_;
};

// Builds one per-sample transform from its spec. Names and arguments (torchvision's and
// VISSL's; sizes are [s] or [h, w], ranges [min, max]):
//   RandomResizedCrop     size, scale [0.08, 1.0], ratio [0.75, 1.3333],
//                         interpolation bilinear
//   Resize                size ([s]: shorter side), interpolation bilinear, max_size
//   CenterCrop            size
//   RandomCrop            size, padding 0 (one value: every side, zeros), pad_if_needed False
//   RandomHorizontalFlip  p 0.5
//   ColorJitter           brightness, contrast, saturation (v or [min, max]), hue (v or
//                         [min, max], within [-0.5, 0.5]); all 0 by default
//   RandomGrayscale       p 0.1
//   GaussianBlur          kernel_size ([k] or [kx, ky], odd), sigma [0.1, 2.0] (or one value)
//   ImgPilGaussianBlur    p, radius_min, radius_max
//   ImgPilRandomSolarize  p
//   ImgPilColorDistortion strength 1.0 (color_transforms.h)
// interpolation: nearest, bilinear, bicubic, box, hamming, lanczos or PIL's code 0-5.
// Throws ConfigError for an unknown name (listing these) or a bad argument, and for the
// multi-view transforms (ImgPilToMultiCrop, ImgReplicatePil, ImgPilMultiCropRandomApply),
// whose lists make_multi_view_transforms (multi_view_pipeline.h) builds.
std::shared_ptr<const SampleTransform> make_sample_transform(const TransformSpec& spec);

struct ImageTransforms {
  SamplePipeline per_sample;
  TransformPipeline per_batch;
};

// Splits `specs` at the first ToTensor (see the top of this file). Throws ConfigError when
// a per-sample transform follows ToTensor, for a multi-view transform (see
// make_sample_transform), or from either factory.
ImageTransforms make_image_transforms(const std::vector<TransformSpec>& specs);

} // namespace largo::data
