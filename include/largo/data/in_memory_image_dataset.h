// An in-memory dataset's images (CIFAR, STL-10, SVHN, MNIST ...: one uint8 tensor) through the
// per-sample pipeline of image files (sample_pipeline.h, multi_view_pipeline.h), for transform
// lists that the batch transforms (transforms.h) cannot run: Resize, CenterCrop,
// RandomResizedCrop, ColorJitter ..., or several views per sample (SimCLR, SwAV on CIFAR).
//
// Each stored image becomes an RGB Image, as torchvision's datasets hand
// Image.fromarray(array) to the transforms, and is transformed into its slot of a uint8 batch
// (or one batch per view: Batch::views). The random draws are ImageDataset's: sample i of
// epoch e draws from sample_seed(seed, e, i), so the same images stored as PNG files and read
// through ImageDataset give the same batches, bit for bit.
//
// A one-channel dataset (MNIST) must be made RGB first: VISSL's MNISTImgPil2RGB, which pastes
// the image on a black RGB canvas (RgbCanvas).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "largo/data/dataset.h"
#include "largo/data/image.h"
#include "largo/data/multi_view_pipeline.h"
#include "largo/data/sample_pipeline.h"
#include "largo/data/transform_spec.h"

namespace largo::data {

// VISSL's MNISTImgPil2RGB: Image.new("RGB", size) with the image pasted at (left, top) (a
// gray image as R = G = B, what falls outside the canvas dropped).
struct RgbCanvas {
  std::optional<ImageSize> size; // nullopt: the image's own size
  int64_t left = 0;
  int64_t top = 0;

  // {name: MNISTImgPil2RGB, size: s or [w, h] (PIL's order) or [], box: [left, top]}.
  // Throws ConfigError for a bad argument, naming it.
  static RgbCanvas from_spec(const TransformSpec& spec);
  // The canvas for a stored image of `stored` size.
  ImageSize output_size(ImageSize stored) const;
};

class InMemoryImageDataset : public Dataset {
 public:
  // `stored`'s images ([N, channels, h, w] uint8, channels 3, or 1 with `canvas`) through
  // `pipeline`. The pipeline must fix the output size or keep the stored one. Throws
  // ConfigError for a one-channel dataset without a canvas, or a channel count other than
  // 1 or 3.
  InMemoryImageDataset(
      std::shared_ptr<const Dataset> stored,
      SamplePipeline pipeline,
      std::optional<RgbCanvas> canvas = std::nullopt);
  // Several views per sample; every view's size must be fixed by the pipeline (ConfigError).
  InMemoryImageDataset(
      std::shared_ptr<const Dataset> stored,
      MultiViewPipeline pipeline,
      std::optional<RgbCanvas> canvas = std::nullopt);

  // The size of the RGB images the pipeline sees, for stored images of `stored_shape`
  // [channels, h, w]. Throws ConfigError for one channel without a canvas, or a count other
  // than 1 or 3.
  static ImageSize
  rgb_size(const std::vector<int64_t>& stored_shape, const std::optional<RgbCanvas>& canvas);

  int64_t size() const override;
  std::vector<int64_t> sample_shape() const override; // [3, h, w]; multi-view: view 0's
  std::vector<std::vector<int64_t>> view_shapes() const override;
  int64_t num_classes() const override;
  // Epoch 0 with seed 0 (load_batch with a default request).
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  Batch load_batch(const BatchRequest& request) const override;
  at::Tensor labels() const override;

 private:
  // Checks the stored images and sets images_ and rgb_size_.
  void check_stored();
  // Stored image `index` as RGB (interleaved), made as torchvision's PIL image of it.
  void read_rgb(int64_t index, Image& out) const;
  Batch load_views(const BatchRequest& request) const;

  std::shared_ptr<const Dataset> stored_;
  at::Tensor images_; // [N, channels, h, w] uint8, contiguous
  std::optional<RgbCanvas> canvas_;
  ImageSize rgb_size_; // of read_rgb's images
  SamplePipeline pipeline_;
  std::optional<MultiViewPipeline> multi_view_;
  std::vector<ImageSize> output_sizes_; // one per view; one-view: one
};

} // namespace largo::data
