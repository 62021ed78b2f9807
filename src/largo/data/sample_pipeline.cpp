// The per-sample pipeline and the factory of per-sample transforms.
#include "largo/data/sample_pipeline.h"

#include <fmt/format.h>

#include "largo/core/error.h"
#include "largo/data/blur_transforms.h"
#include "largo/data/color_transforms.h"
#include "largo/data/multi_view_pipeline.h"

namespace largo::data {
namespace {

constexpr const char* kSampleTransforms =
    "RandomResizedCrop, Resize, CenterCrop, RandomCrop, RandomHorizontalFlip, ColorJitter, "
    "RandomGrayscale, "
    "GaussianBlur, ImgPilGaussianBlur, ImgPilRandomSolarize, ImgPilColorDistortion (before "
    "ToTensor); ToTensor, "
    "Normalize, RandomHorizontalFlip, RandomCrop (from ToTensor on, on the whole batch)";

ImageSize image_size(const TransformArgs& args, const std::string& key) {
  const auto [height, width] = args.size(key);
  return ImageSize{height, width};
}

std::pair<double, double>
pair_of(const TransformArgs& args, const std::string& key, std::pair<double, double> fallback) {
  const std::vector<double> values = args.numbers(key, {fallback.first, fallback.second});
  if (values.size() != 2) {
    args.fail(key, fmt::format("takes [min, max], got {} values", values.size()));
  }
  return {values[0], values[1]};
}

// A ColorJitter property: absent or 0 -> off; v -> torchvision's range; [min, max] as given
// (off when both equal the neutral value).
ColorJitter::Range jitter_range(const TransformArgs& args, const std::string& key, bool hue) {
  if (!args.has(key)) {
    return std::nullopt;
  }
  const std::vector<double>& values = args.numbers(key);
  if (values.size() == 1) {
    return hue ? ColorJitter::hue_range(values[0]) : ColorJitter::factor_range(values[0], key);
  }
  if (values.size() != 2) {
    args.fail(key, "takes one strength or [min, max]");
  }
  const double neutral = hue ? 0.0 : 1.0;
  if (values[0] == neutral && values[1] == neutral) {
    return std::nullopt;
  }
  return std::make_pair(values[0], values[1]);
}

Interpolation interpolation_of(const TransformArgs& args) {
  return parse_interpolation(args.text("interpolation", "bilinear"));
}

} // namespace

SamplePipeline::SamplePipeline(std::vector<std::shared_ptr<const SampleTransform>> transforms)
    : transforms_(std::move(transforms)) {}

void SamplePipeline::run(
    const EncodedImage& encoded,
    const DecodeOptions& options,
    at::Generator& gen,
    ImageSize size,
    uint8_t* out) const {
  SampleImage image(encoded, options);
  run(image, encoded.name(), gen, size, out);
}

void SamplePipeline::run(
    const Image& pixels,
    const std::string& name,
    at::Generator& gen,
    ImageSize size,
    uint8_t* out) const {
  SampleImage image(pixels, name);
  run(image, name, gen, size, out);
}

void SamplePipeline::run(
    SampleImage& image,
    const std::string& name,
    at::Generator& gen,
    ImageSize size,
    uint8_t* out) const {
  for (const auto& transform : transforms_) {
    transform->apply(image, gen);
  }
  if (image.height() != size.height || image.width() != size.width) {
    throw DataError(fmt::format(
        "{}: transformed to {}x{} (w x h) but the batch holds {}x{} images; add a transform "
        "that fixes the size (RandomResizedCrop, CenterCrop or Resize with [h, w])",
        name,
        image.width(),
        image.height(),
        size.width,
        size.height));
  }
  image.write_planar(out);
}

std::optional<ImageSize> SamplePipeline::output_size(std::optional<ImageSize> input) const {
  for (const auto& transform : transforms_) {
    input = transform->output_size(input);
  }
  return input;
}

const std::vector<std::shared_ptr<const SampleTransform>>& SamplePipeline::transforms() const {
  return transforms_;
}

std::shared_ptr<const SampleTransform> make_sample_transform(const TransformSpec& spec) {
  const std::string& name = spec.name;
  if (name == "RandomResizedCrop") {
    const TransformArgs args(spec, {"size", "scale", "ratio", "interpolation"});
    return std::make_shared<RandomResizedCrop>(
        image_size(args, "size"),
        pair_of(args, "scale", {0.08, 1.0}),
        pair_of(args, "ratio", {3.0 / 4.0, 4.0 / 3.0}),
        interpolation_of(args));
  }
  if (name == "Resize") {
    const TransformArgs args(spec, {"size", "interpolation", "max_size"});
    const auto [height, width] = args.size("size");
    std::vector<int64_t> size = args.numbers("size").size() == 1
                                    ? std::vector<int64_t>{height}
                                    : std::vector<int64_t>{height, width};
    std::optional<int64_t> max_size;
    if (args.has("max_size")) {
      max_size = args.integer("max_size");
    }
    return std::make_shared<Resize>(std::move(size), interpolation_of(args), max_size);
  }
  if (name == "CenterCrop") {
    const TransformArgs args(spec, {"size"});
    return std::make_shared<CenterCrop>(image_size(args, "size"));
  }
  if (name == "RandomCrop") {
    const TransformArgs args(spec, {"size", "padding", "pad_if_needed"});
    const std::string pad_if_needed = args.text("pad_if_needed", "False");
    if (pad_if_needed != "True" && pad_if_needed != "true" && pad_if_needed != "False" &&
        pad_if_needed != "false") {
      args.fail("pad_if_needed", "takes True or False");
    }
    return std::make_shared<RandomCropSample>(
        image_size(args, "size"),
        args.integer("padding", 0),
        pad_if_needed == "True" || pad_if_needed == "true");
  }
  if (name == "RandomHorizontalFlip") {
    const TransformArgs args(spec, {"p"});
    return std::make_shared<RandomHorizontalFlipSample>(args.probability("p", 0.5));
  }
  if (name == "ColorJitter") {
    const TransformArgs args(spec, {"brightness", "contrast", "saturation", "hue"});
    return std::make_shared<ColorJitter>(
        jitter_range(args, "brightness", false),
        jitter_range(args, "contrast", false),
        jitter_range(args, "saturation", false),
        jitter_range(args, "hue", true));
  }
  if (name == "RandomGrayscale") {
    const TransformArgs args(spec, {"p"});
    return std::make_shared<RandomGrayscale>(args.probability("p", 0.1));
  }
  if (name == "GaussianBlur") {
    const TransformArgs args(spec, {"kernel_size", "sigma"});
    const auto [kernel_x, kernel_y] = args.size("kernel_size"); // torchvision: (kx, ky)
    const std::vector<double> sigma = args.numbers("sigma", {0.1, 2.0});
    if (sigma.size() != 1 && sigma.size() != 2) {
      args.fail("sigma", "takes one value or [min, max]");
    }
    return std::make_shared<GaussianBlur>(
        ImageSize{kernel_y, kernel_x}, std::make_pair(sigma[0], sigma.back()));
  }
  if (name == "ImgPilGaussianBlur") {
    const TransformArgs args(spec, {"p", "radius_min", "radius_max"});
    return std::make_shared<ImgPilGaussianBlur>(
        args.probability("p", 0.5), args.number("radius_min"), args.number("radius_max"));
  }
  if (name == "ImgPilRandomSolarize") {
    // VISSL's from_config reads "p" (default 0.66), as every VISSL config writes it.
    const TransformArgs args(spec, {"p"});
    return std::make_shared<ImgPilRandomSolarize>(args.probability("p", 0.66));
  }
  if (name == "ImgPilColorDistortion") {
    const TransformArgs args(spec, {"strength"});
    return std::make_shared<ImgPilColorDistortion>(args.number("strength", 1.0));
  }
  if (is_multi_view_transform(name)) {
    throw ConfigError(fmt::format(
        "transform {} makes or transforms several views of each image; a list holding it is "
        "built by make_multi_view_transforms (multi_view_pipeline.h), not as one image's "
        "transforms",
        name));
  }
  throw ConfigError(fmt::format(
      "unknown transform '{}' for image files; supported: {}; multi-view lists (built by "
      "make_multi_view_transforms): ImgPilToMultiCrop, ImgReplicatePil, "
      "ImgPilMultiCropRandomApply",
      name,
      kSampleTransforms));
}

ImageTransforms make_image_transforms(const std::vector<TransformSpec>& specs) {
  std::vector<std::shared_ptr<const SampleTransform>> per_sample;
  std::vector<TransformSpec> per_batch;
  for (const TransformSpec& spec : specs) {
    if (is_multi_view_transform(spec.name)) {
      throw ConfigError(fmt::format(
          "transform {} makes or transforms several views of each image, which one-view image "
          "transforms cannot deliver; build the list with make_multi_view_transforms "
          "(multi_view_pipeline.h)",
          spec.name));
    }
    if (spec.name == "ToTensor" || !per_batch.empty()) {
      if (spec.name != "ToTensor" && spec.name != "Normalize" &&
          spec.name != "RandomHorizontalFlip" && spec.name != "RandomCrop") {
        throw ConfigError(fmt::format(
            "transform {} comes after ToTensor, but for image files it runs per image, before "
            "the batch is formed; move it before ToTensor",
            spec.name));
      }
      per_batch.push_back(spec);
      continue;
    }
    per_sample.push_back(make_sample_transform(spec));
  }
  return ImageTransforms{SamplePipeline(std::move(per_sample)), make_pipeline(per_batch)};
}

} // namespace largo::data
