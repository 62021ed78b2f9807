// Batch-level image transforms (the torchvision/VISSL ones a classification recipe needs)
// and a pipeline that chains them. Random transforms draw from a caller-supplied
// generator, never the global one, so a batch's result depends only on that generator's
// seed: the loader seeds it per batch, which makes output independent of thread count and
// reproducible after a mid-epoch resume.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "largo/data/transform_spec.h"

namespace largo::data {

// One transform over a whole batch: [batch, channels, h, w] in, [batch, channels, h', w'] out.
class Transform {
 public:
  virtual ~Transform();
  virtual at::Tensor apply(const at::Tensor& batch, at::Generator& gen) const = 0;
  // The torchvision/VISSL name, for logs and error messages.
  virtual std::string name() const = 0;
  // The shape of one output image for one input image shape [channels, h, w]; the default
  // keeps it.
  virtual std::vector<int64_t> output_shape(const std::vector<int64_t>& input_shape) const;
  // Whether each output value depends only on the input value at the same place and its
  // channel (ToTensor, Normalize): the loader then fuses the transform into a lookup table
  // or runs it on the device.
  virtual bool elementwise() const;
};

// uint8 [0, 255] -> float32 x / 255 on the batch's device, by true division on every device:
// torchvision's ToTensor divides (multiplying by 1/255 differs in the last bit), and CUDA's
// division by a host scalar multiplies by its reciprocal, so the divisor is a tensor there.
at::Tensor to_unit_float(const at::Tensor& images);

// uint8 [0, 255] -> float32 [0, 1] (torchvision's ToTensor, minus the HWC -> CHW move:
// datasets already store CHW): to_unit_float. Floating-point batches pass through unchanged.
class ToFloat : public Transform {
 public:
  at::Tensor apply(const at::Tensor& batch, at::Generator& gen) const override;
  std::string name() const override;
  bool elementwise() const override;
};

// (x - mean[c]) / std[c] per channel, on a float batch. mean and std have one value per
// channel (or a single value for all channels). Throws ConfigError for empty or
// different-length lists or a std of 0, and at apply time for a channel-count mismatch or
// a uint8 batch (ToTensor must come first).
class Normalize : public Transform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  at::Tensor apply(const at::Tensor& batch, at::Generator& gen) const override;
  std::string name() const override;
  bool elementwise() const override;
  // The shape unchanged, after the check apply() makes of the channel count (so that a
  // pipeline's shape, worked out before any data is read, refuses what apply() would).
  std::vector<int64_t> output_shape(const std::vector<int64_t>& input_shape) const override;

 private:
  // Throws ConfigError unless mean/std have one value, or one per channel.
  void check_channels(int64_t channels) const;

  std::vector<double> mean_;
  std::vector<double> std_;
};

// Pads every image by `padding` zero pixels on each side, then cuts a size_h x size_w
// window at a random position, drawn independently per sample.
class RandomCrop : public Transform {
 public:
  RandomCrop(int64_t size_h, int64_t size_w, int64_t padding = 0);
  at::Tensor apply(const at::Tensor& batch, at::Generator& gen) const override;
  std::string name() const override;
  std::vector<int64_t> output_shape(const std::vector<int64_t>& input_shape) const override;

 private:
  int64_t size_h_;
  int64_t size_w_;
  int64_t padding_;
};

// Mirrors each image left-right with probability p, drawn independently per sample.
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  at::Tensor apply(const at::Tensor& batch, at::Generator& gen) const override;
  std::string name() const override;

 private:
  double p_;
};

// Transforms applied in order. An empty pipeline returns the batch unchanged.
class TransformPipeline {
 public:
  TransformPipeline() = default;
  explicit TransformPipeline(std::vector<std::shared_ptr<const Transform>> transforms);

  TransformPipeline& add(std::shared_ptr<const Transform> transform);
  at::Tensor apply(at::Tensor batch, at::Generator& gen) const; // [batch, channels, h, w]
  // The shape of one output image for an input image shape [channels, h, w].
  std::vector<int64_t> output_shape(std::vector<int64_t> input_shape) const;
  const std::vector<std::shared_ptr<const Transform>>& transforms() const;
  bool empty() const;

 private:
  std::vector<std::shared_ptr<const Transform>> transforms_;
};

// Builds a transform from its spec. Supported names and args (torchvision's):
//   RandomCrop            size: [s] or [h, w] (required), padding: [p] (default 0)
//   RandomHorizontalFlip  p: [prob] (default 0.5)
//   ToTensor              (none) -> ToFloat
//   Normalize             mean: [..] and std: [..] (required, one per channel)
// Throws ConfigError for an unknown name (listing the supported ones), an unknown or
// missing arg, or a value out of range.
std::shared_ptr<const Transform> make_transform(const TransformSpec& spec);
TransformPipeline make_pipeline(const std::vector<TransformSpec>& specs);
// Whether make_transform builds `name` (a list of only these runs on whole batches of an
// in-memory dataset as stored; any other sends it through the per-sample pipeline).
bool is_batch_transform(const std::string& name);

} // namespace largo::data
