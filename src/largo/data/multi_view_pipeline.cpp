// The multi-view pipeline and the factory of multi-view transform lists.
#include "largo/data/multi_view_pipeline.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "largo/core/error.h"
#include "largo/data/sample_pipeline.h"

namespace largo::data {
namespace {

// [n...] of whole numbers (ImgPilToMultiCrop's num_crops and size_crops).
std::vector<int64_t> whole_numbers(const TransformArgs& args, const std::string& key) {
  std::vector<int64_t> values;
  for (const double value : args.numbers(key)) {
    if (!std::isfinite(value) || value != std::floor(value)) {
      args.fail(key, fmt::format("must hold whole numbers, got {}", args.numbers(key)));
    }
    values.push_back(static_cast<int64_t>(value));
  }
  return values;
}

// crop_scales: [[min, max], ...].
std::vector<std::pair<double, double>> scale_pairs(const TransformArgs& args) {
  std::vector<std::pair<double, double>> pairs;
  for (const std::vector<double>& pair : args.nested_numbers("crop_scales")) {
    if (pair.size() != 2) {
      args.fail(
          "crop_scales",
          fmt::format(
              "must hold [min, max] pairs, e.g. [[0.14, 1.0], [0.05, 0.14]]; got an entry {}",
              pair));
    }
    pairs.emplace_back(pair[0], pair[1]);
  }
  return pairs;
}

std::shared_ptr<const ViewSplitter> make_splitter(const TransformSpec& spec) {
  if (spec.name == "ImgPilToMultiCrop") {
    const TransformArgs args(spec, {"total_num_crops", "num_crops", "size_crops", "crop_scales"});
    return std::make_shared<ImgPilToMultiCrop>(
        args.integer("total_num_crops"),
        whole_numbers(args, "num_crops"),
        whole_numbers(args, "size_crops"),
        scale_pairs(args));
  }
  const TransformArgs args(spec, {"num_times"});
  return std::make_shared<ImgReplicatePil>(args.integer("num_times", 2));
}

std::shared_ptr<const ViewTransform> make_view_transform(const TransformSpec& spec) {
  if (spec.name != "ImgPilMultiCropRandomApply") {
    return std::make_shared<EachView>(make_sample_transform(spec));
  }
  const TransformArgs args(spec, {"transforms", "prob"});
  std::vector<std::shared_ptr<const SampleTransform>> transforms;
  for (const TransformSpec& inner : args.transforms("transforms")) {
    if (is_multi_view_transform(inner.name)) {
      args.fail("transforms", fmt::format("holds {}; expected one-image transforms", inner.name));
    }
    transforms.push_back(make_sample_transform(inner));
  }
  return std::make_shared<ImgPilMultiCropRandomApply>(std::move(transforms), args.numbers("prob"));
}

} // namespace

MultiViewPipeline::MultiViewPipeline(
    std::vector<std::shared_ptr<const SampleTransform>> before,
    std::shared_ptr<const ViewSplitter> splitter,
    std::vector<std::shared_ptr<const ViewTransform>> per_view)
    : before_(std::move(before)), splitter_(std::move(splitter)), per_view_(std::move(per_view)) {
  if (splitter_ == nullptr) {
    throw ConfigError("MultiViewPipeline: no view splitter (ImgPilToMultiCrop or ImgReplicatePil)");
  }
  for (const auto& transform : per_view_) {
    const std::optional<int64_t> wanted = transform->num_views();
    if (wanted && *wanted != splitter_->num_views()) {
      throw ConfigError(fmt::format(
          "{}: made for {} crops (one probability each) but {} makes {}",
          transform->name(),
          *wanted,
          splitter_->name(),
          splitter_->num_views()));
    }
  }
}

void MultiViewPipeline::run(
    const EncodedImage& encoded,
    const DecodeOptions& options,
    at::Generator& gen,
    const std::vector<ImageSize>& sizes,
    const std::vector<uint8_t*>& outs) const {
  SampleImage image(encoded, options);
  run(image, encoded.name(), gen, sizes, outs);
}

void MultiViewPipeline::run(
    const Image& pixels,
    const std::string& name,
    at::Generator& gen,
    const std::vector<ImageSize>& sizes,
    const std::vector<uint8_t*>& outs) const {
  SampleImage image(pixels, name);
  run(image, name, gen, sizes, outs);
}

void MultiViewPipeline::run(
    SampleImage& image,
    const std::string& name,
    at::Generator& gen,
    const std::vector<ImageSize>& sizes,
    const std::vector<uint8_t*>& outs) const {
  TORCH_CHECK(
      static_cast<int64_t>(sizes.size()) == num_views() && outs.size() == sizes.size(),
      "MultiViewPipeline::run: ",
      sizes.size(),
      " sizes and ",
      outs.size(),
      " outputs for ",
      num_views(),
      " views");
  for (const auto& transform : before_) {
    transform->apply(image, gen);
  }
  std::vector<SampleImage> views = splitter_->split(image, gen);
  for (const auto& transform : per_view_) {
    transform->apply(views, gen);
  }
  for (size_t k = 0; k < views.size(); ++k) {
    if (views[k].height() != sizes[k].height || views[k].width() != sizes[k].width) {
      throw DataError(fmt::format(
          "{}: view {} transformed to {}x{} (w x h) but its batch holds {}x{} images; add a "
          "transform that fixes the size",
          name,
          k,
          views[k].width(),
          views[k].height(),
          sizes[k].width,
          sizes[k].height));
    }
    views[k].write_planar(outs[k]);
  }
}

int64_t MultiViewPipeline::num_views() const {
  return splitter_->num_views();
}

ViewSizes MultiViewPipeline::view_sizes(std::optional<ImageSize> input) const {
  for (const auto& transform : before_) {
    input = transform->output_size(input);
  }
  ViewSizes sizes = splitter_->view_sizes(input);
  for (const auto& transform : per_view_) {
    sizes = transform->view_sizes(std::move(sizes));
  }
  return sizes;
}

const std::vector<std::shared_ptr<const SampleTransform>>& MultiViewPipeline::before() const {
  return before_;
}

const ViewSplitter& MultiViewPipeline::splitter() const {
  return *splitter_;
}

const std::vector<std::shared_ptr<const ViewTransform>>& MultiViewPipeline::per_view() const {
  return per_view_;
}

bool is_multi_view_transform(const std::string& name) {
  return name == "ImgPilToMultiCrop" || name == "ImgReplicatePil" ||
         name == "ImgPilMultiCropRandomApply";
}

bool is_multi_view_list(const std::vector<TransformSpec>& specs) {
  return std::any_of(specs.begin(), specs.end(), [](const TransformSpec& spec) {
    return is_multi_view_transform(spec.name);
  });
}

MultiViewTransforms make_multi_view_transforms(const std::vector<TransformSpec>& specs) {
  std::vector<std::shared_ptr<const SampleTransform>> before;
  std::shared_ptr<const ViewSplitter> splitter;
  std::vector<std::shared_ptr<const ViewTransform>> per_view;
  std::vector<TransformSpec> per_batch;
  for (const TransformSpec& spec : specs) {
    const bool splits = spec.name == "ImgPilToMultiCrop" || spec.name == "ImgReplicatePil";
    if (spec.name == "ToTensor" || !per_batch.empty()) {
      if (spec.name != "ToTensor" && spec.name != "Normalize") {
        throw ConfigError(fmt::format(
            "transform {} comes after ToTensor in a multi-view list; only Normalize may follow "
            "ToTensor there (the views are transformed per image, before the batch is formed)",
            spec.name));
      }
      per_batch.push_back(spec);
    } else if (splits && splitter) {
      throw ConfigError(fmt::format(
          "transform {} follows {}: a list makes its views once", spec.name, splitter->name()));
    } else if (splits) {
      splitter = make_splitter(spec);
    } else if (splitter) {
      per_view.push_back(make_view_transform(spec));
    } else if (spec.name == "ImgPilMultiCropRandomApply") {
      throw ConfigError(
          "transform ImgPilMultiCropRandomApply comes before the crops are made; put it after "
          "ImgPilToMultiCrop or ImgReplicatePil");
    } else {
      before.push_back(make_sample_transform(spec));
    }
  }
  if (!splitter) {
    throw ConfigError(
        "a multi-view transform list needs ImgPilToMultiCrop or ImgReplicatePil before ToTensor");
  }
  MultiViewPipeline pipeline(std::move(before), std::move(splitter), std::move(per_view));
  const ViewSizes sizes = pipeline.view_sizes();
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (!sizes[k]) {
      throw ConfigError(fmt::format(
          "multi-view transforms: the size of view {} depends on the image; each view must end "
          "at a fixed size (ImgPilToMultiCrop, or RandomResizedCrop/CenterCrop after "
          "ImgReplicatePil)",
          k));
    }
  }
  return MultiViewTransforms{std::move(pipeline), make_pipeline(per_batch)};
}

} // namespace largo::data
