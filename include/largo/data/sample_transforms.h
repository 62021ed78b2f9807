// Per-sample transforms with torchvision's names, parameters and random draws, for images of
// any size (the batch-level transforms of transforms.h need fixed-size in-memory batches).
// This file holds the interface and the geometric transforms; colour_transforms.h and
// blur_transforms.h hold the rest; sample_pipeline.h chains them.
//
// Random draws: each transform draws from the sample's own generator, with the same calls
// in the same order as torchvision's transform on the PIL path (torch.rand(1) < p,
// torch.empty(1).uniform_(a, b), torch.randint ...). Seeded alike (the loader seeds it from
// (seed, epoch, sample index)), a transform makes exactly torchvision's choices; the
// generator is never the global one, so results do not depend on threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include "largo/data/resample.h"
#include "largo/data/sample_image.h"

namespace largo::data {

// A height x width pair.
struct ImageSize {
  int64_t height = 0;
  int64_t width = 0;
  bool operator==(const ImageSize& other) const = default;
};

class SampleTransform {
 public:
  virtual ~SampleTransform();
  // Transforms `image`, drawing random numbers from `gen` as torchvision draws them.
  virtual void apply(SampleImage& image, at::Generator& gen) const = 0;
  // The torchvision/VISSL name, for logs and error messages.
  virtual std::string name() const = 0;
  // The output size for an input size (nullopt when unknown); nullopt when the output size
  // depends on the image. The default keeps the size.
  virtual std::optional<ImageSize> output_size(std::optional<ImageSize> input) const;
};

// A crop box: rows [top, top + height), columns [left, left + width).
struct CropBox {
  int64_t top = 0;
  int64_t left = 0;
  int64_t height = 0;
  int64_t width = 0;
  bool operator==(const CropBox& other) const = default;
};

// Crops a random box of random area fraction (`scale`) and aspect ratio (`ratio`, drawn
// log-uniformly), resized to `size`; torchvision's 10 tries, then its central fallback.
class RandomResizedCrop : public SampleTransform {
 public:
  // Throws ConfigError for sizes < 1, or scale/ratio that are not increasing pairs > 0.
  RandomResizedCrop(
      ImageSize size,
      std::pair<double, double> scale = {0.08, 1.0},
      std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0},
      Interpolation interpolation = Interpolation::kBilinear);

  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;
  std::optional<ImageSize> output_size(std::optional<ImageSize> input) const override;

  // torchvision's RandomResizedCrop.get_params for an image of `height` x `width`.
  static CropBox get_params(
      int64_t height,
      int64_t width,
      std::pair<double, double> scale,
      std::pair<double, double> ratio,
      at::Generator& gen);

 private:
  ImageSize size_;
  std::pair<double, double> scale_;
  std::pair<double, double> ratio_;
  Interpolation interpolation_;
};

// torchvision's Resize: `size` = {s} resizes the shorter side to s (the longer one to
// int(s * long / short), at most max_size when given), {h, w} to exactly h x w.
class Resize : public SampleTransform {
 public:
  // Throws ConfigError for an empty or non-positive size, or a max_size with {h, w} or not
  // above s.
  Resize(
      std::vector<int64_t> size,
      Interpolation interpolation = Interpolation::kBilinear,
      std::optional<int64_t> max_size = std::nullopt);

  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;
  std::optional<ImageSize> output_size(std::optional<ImageSize> input) const override;
  // The size torchvision resizes an image of `input` size to.
  ImageSize resized_size(ImageSize input) const;

 private:
  std::vector<int64_t> size_;
  Interpolation interpolation_;
  std::optional<int64_t> max_size_;
};

// torchvision's CenterCrop: a centred size.height x size.width box (offsets rounded half to
// even, as Python's round), zero-padded where the image is smaller.
class CenterCrop : public SampleTransform {
 public:
  explicit CenterCrop(ImageSize size);
  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;
  std::optional<ImageSize> output_size(std::optional<ImageSize> input) const override;
  // Where the box lies for an image of `input` size (negative offsets: padding).
  CropBox box(ImageSize input) const;

 private:
  ImageSize size_;
};

// torchvision's RandomHorizontalFlip: mirrors when torch.rand(1) < p.
class RandomHorizontalFlipSample : public SampleTransform {
 public:
  explicit RandomHorizontalFlipSample(double p = 0.5);
  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;

 private:
  double p_;
};

// torchvision's RandomCrop on one image: zero `padding` on every side, then (pad_if_needed)
// the width and the height each padded on both sides by what they lack of `size`, then a
// size.height x size.width box at torch.randint offsets (none drawn when the padded image
// is exactly `size`). Padding is zeros, torchvision's fill 0 in its constant mode, so the
// whole transform is one crop whose box may leave the image.
class RandomCropSample : public SampleTransform {
 public:
  // Throws ConfigError for a size < 1 or a negative padding.
  RandomCropSample(ImageSize size, int64_t padding = 0, bool pad_if_needed = false);
  // Throws DataError when the padded image is smaller than `size` (torchvision's ValueError).
  void apply(SampleImage& image, at::Generator& gen) const override;
  std::string name() const override;
  std::optional<ImageSize> output_size(std::optional<ImageSize> input) const override;
  // The box in the unpadded image (negative offsets: padding), drawing as torchvision does.
  CropBox get_params(ImageSize input, at::Generator& gen) const;

 private:
  ImageSize size_;
  int64_t padding_;
  bool pad_if_needed_;
};

// `p` when it is a probability in [0, 1]; ConfigError naming `what` (e.g. "RandomGrayscale:
// p") otherwise.
double checked_probability(double p, const std::string& what);

// torch.rand(1, generator=gen) < p, compared as PyTorch compares a float tensor with a
// Python float.
bool draw_below(double p, at::Generator& gen);
// float(torch.empty(1).uniform_(low, high, generator=gen)).
double draw_uniform(double low, double high, at::Generator& gen);

} // namespace largo::data
