// Multi-view transforms and their pipeline: parity with torchvision/VISSL (baselines from
// tests/reference/gen_multicrop_baselines.py), VISSL's order of draws, the crop-scale
// distribution, and the factory's argument checks.
//
// Tolerance: every comparison with the baselines is exact (0 levels). Each step -- PIL's
// full decode, the crop + bilinear resize, the flip, ColorJitter, RandomGrayscale,
// ImgPilGaussianBlur, solarize -- already equals torchvision byte for byte on the one-view
// path (image_parity_test.cpp); the multi-view pipeline only reads one decode from several
// views, which must not change a value.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <fstream>

#include "data/image_test_util.h"
#include "largo/core/error.h"
#include "largo/data/color_transforms.h"
#include "largo/data/dataset.h"
#include "largo/data/multi_view_pipeline.h"
#include "largo/data/sample_pipeline.h"
#include "test_paths.h"

namespace largo::data::multi_view_pipeline_test {
namespace {

namespace fs = std::filesystem;
using testing::specs_of;

fs::path baseline_dir() {
  return fs::path(largo::test_paths::data_dir()) / "data" / "baselines" / "multicrop";
}

const nlohmann::json& baselines() {
  static const nlohmann::json json = [] {
    std::ifstream file(baseline_dir() / "multicrop_baselines.json");
    return nlohmann::json::parse(file);
  }();
  return json;
}

const std::vector<uint8_t>& fixture(const std::string& name) {
  static std::map<std::string, std::vector<uint8_t>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    it = cache.emplace(name, testing::read_bytes(testing::image_baseline_dir() / "fixtures" / name))
             .first;
  }
  return it->second;
}

Image expected_image(const std::string& name) {
  return testing::decode_file(baseline_dir() / "expected" / (name + ".png"));
}

Image planar_of(SampleImage& image) {
  std::vector<uint8_t> planar(static_cast<size_t>(3 * image.width() * image.height()));
  const int64_t width = image.width();
  const int64_t height = image.height();
  image.write_planar(planar.data());
  return testing::from_planar(planar.data(), width, height);
}

// Runs `pipeline` on one encoded image and returns its views.
std::vector<Image>
run_views(const MultiViewPipeline& pipeline, const EncodedImage& encoded, at::Generator& gen) {
  std::vector<ImageSize> sizes;
  for (const auto& size : pipeline.view_sizes()) {
    sizes.push_back(*size);
  }
  std::vector<std::vector<uint8_t>> planar;
  std::vector<uint8_t*> outs;
  for (const ImageSize& size : sizes) {
    planar.emplace_back(static_cast<size_t>(3 * size.height * size.width));
  }
  for (auto& buffer : planar) {
    outs.push_back(buffer.data());
  }
  pipeline.run(encoded, DecodeOptions{}, gen, sizes, outs);
  std::vector<Image> views;
  for (size_t k = 0; k < sizes.size(); ++k) {
    views.push_back(testing::from_planar(planar[k].data(), sizes[k].width, sizes[k].height));
  }
  return views;
}

bool same(const Image& a, const Image& b) {
  return a.width == b.width && a.height == b.height && a.pixels == b.pixels;
}

TEST(MultiCropParity, FixedBoxAndFlipEqualTorchvisionsResizedCrop) {
  int num_cases = 0;
  for (const auto& entry : baselines()["resized_crops"]) {
    const std::string image_name = entry["image"];
    const auto& bytes = fixture(image_name);
    const EncodedImage encoded(bytes.data(), bytes.size(), image_name, DecodeOptions{});
    SampleImage base(encoded, DecodeOptions{});
    SampleImage view = SampleImage::view_of(base); // the multi-view path: a borrowed decode
    const auto box = entry["box"].get<std::vector<int64_t>>();
    const auto size = entry["size"].get<std::vector<int64_t>>();
    view.crop(box[0], box[1], box[2], box[3]);
    view.resize(size[0], size[1], Interpolation::kBilinear);
    if (entry["flip"].get<bool>()) {
      view.hflip();
    }
    const Image expected = expected_image(entry["name"]);
    EXPECT_EQ(testing::max_abs_difference(planar_of(view), expected), 0) << entry["name"];
    ++num_cases;
  }
  EXPECT_EQ(num_cases, 8);
}

TEST(MultiCropParity, SeededRecipesEqualVisslsTransformsViewByView) {
  int num_views = 0;
  for (const auto& entry : baselines()["recipes"]) {
    const std::string name = entry["name"];
    const MultiViewTransforms transforms =
        make_multi_view_transforms(specs_of(entry["transforms"]));
    const auto& bytes = fixture(entry["image"]);
    const EncodedImage encoded(bytes.data(), bytes.size(), entry["image"], DecodeOptions{});
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(entry["seed"].get<uint64_t>());
    const std::vector<Image> views = run_views(transforms.per_sample, encoded, gen);
    ASSERT_EQ(views.size(), entry["sizes"].size()) << name;
    for (size_t k = 0; k < views.size(); ++k) {
      const Image expected = expected_image(name + "_" + std::to_string(k));
      ASSERT_EQ(views[k].height, expected.height) << name << " view " << k;
      ASSERT_EQ(views[k].width, expected.width) << name << " view " << k;
      EXPECT_EQ(testing::max_abs_difference(views[k], expected), 0) << name << " view " << k;
      ++num_views;
    }
  }
  EXPECT_EQ(num_views, 3 * 5 + 2 + 2 * 2);
}

MultiViewTransforms swav_transforms(int64_t large, int64_t small) {
  TransformSpec multicrop(
      "ImgPilToMultiCrop",
      {{"total_num_crops", {8}},
       {"num_crops", {2, 6}},
       {"size_crops", {static_cast<double>(large), static_cast<double>(small)}}});
  multicrop.nested_args["crop_scales"] = {{0.14, 1.0}, {0.05, 0.14}};
  return make_multi_view_transforms(
      {multicrop,
       {"RandomHorizontalFlip", {{"p", {0.5}}}},
       {"ImgPilColorDistortion", {{"strength", {1.0}}}},
       {"ImgPilGaussianBlur", {{"p", {0.5}}, {"radius_min", {0.1}}, {"radius_max", {2.0}}}},
       {"ToTensor", {}},
       {"Normalize", {{"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}}}});
}

TEST(MultiViewPipeline, SwavRecipeMakesTwoLargeAndSixSmallCrops) {
  const MultiViewTransforms transforms = swav_transforms(56, 24);
  EXPECT_EQ(transforms.per_sample.num_views(), 8);
  const ViewSizes sizes = transforms.per_sample.view_sizes();
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t side = k < 2 ? 56 : 24;
    EXPECT_EQ(sizes[k], (ImageSize{side, side})) << k;
  }
  EXPECT_EQ(transforms.per_batch.transforms().size(), 2u); // ToTensor, Normalize
  // The per-view transforms are the three between the splitter and ToTensor.
  EXPECT_EQ(transforms.per_sample.per_view().size(), 3u);
  EXPECT_TRUE(transforms.per_sample.before().empty());
}

TEST(MultiViewPipeline, SameSeedSameViewsOtherSeedOrCropOtherViews) {
  const MultiViewTransforms transforms = swav_transforms(48, 24);
  const std::vector<uint8_t> bytes = testing::encode_jpeg(testing::pattern_image(160, 120, 3));
  const EncodedImage encoded(bytes.data(), bytes.size(), "pattern", DecodeOptions{});
  auto views_for = [&](uint64_t seed) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    return run_views(transforms.per_sample, encoded, gen);
  };
  const std::vector<Image> first = views_for(sample_seed(5, 0, 17));
  const std::vector<Image> again = views_for(sample_seed(5, 0, 17));
  const std::vector<Image> other = views_for(sample_seed(5, 0, 18));
  ASSERT_EQ(first.size(), 8u);
  for (size_t k = 0; k < first.size(); ++k) {
    EXPECT_TRUE(same(first[k], again[k])) << "view " << k;
    EXPECT_FALSE(same(first[k], other[k])) << "view " << k;
  }
  // Each crop draws its own box: no two views of a sample alike.
  for (size_t a = 0; a < first.size(); ++a) {
    for (size_t b = a + 1; b < first.size(); ++b) {
      EXPECT_FALSE(same(first[a], first[b])) << a << " vs " << b;
    }
  }
}

TEST(ImgPilToMultiCrop, ViewsAreTheCropsOfItsDrawnBoxes) {
  const ImgPilToMultiCrop multicrop(3, {1, 2}, {40, 20}, {{0.14, 1.0}, {0.05, 0.14}});
  const std::vector<uint8_t> bytes = testing::encode_png(testing::pattern_image(90, 70, 4));
  const EncodedImage encoded(bytes.data(), bytes.size(), "pattern", DecodeOptions{});
  SampleImage image(encoded, DecodeOptions{});
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(21);
  std::vector<SampleImage> views = multicrop.split(image, gen);
  at::Generator same_seed = at::make_generator<at::CPUGeneratorImpl>(21);
  const std::vector<CropBox> boxes = multicrop.draw_boxes(ImageSize{70, 90}, same_seed);
  ASSERT_EQ(views.size(), 3u);
  for (size_t k = 0; k < views.size(); ++k) {
    SampleImage expected(encoded, DecodeOptions{}); // the one-view path, decoding itself
    expected.crop(boxes[k].top, boxes[k].left, boxes[k].height, boxes[k].width);
    const int64_t side = k == 0 ? 40 : 20;
    expected.resize(side, side, Interpolation::kBilinear);
    EXPECT_TRUE(same(planar_of(views[k]), planar_of(expected))) << "view " << k;
  }
}

// Area fractions of the drawn boxes: within each group's crop_scales (up to the rounding of
// the box sides to whole pixels) and, for the small crops, uniform over it.
TEST(ImgPilToMultiCrop, CropAreasFollowEachGroupsScale) {
  const ImgPilToMultiCrop multicrop(8, {2, 6}, {224, 96}, {{0.14, 1.0}, {0.05, 0.14}});
  const int64_t side = 1000;
  const int num_samples = 2000;
  double small_sum = 0.0;
  int num_small = 0;
  for (int n = 0; n < num_samples; ++n) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(sample_seed(1, 0, n));
    const std::vector<CropBox> boxes = multicrop.draw_boxes(ImageSize{side, side}, gen);
    ASSERT_EQ(boxes.size(), 8u);
    for (size_t k = 0; k < boxes.size(); ++k) {
      const double area =
          static_cast<double>(boxes[k].height * boxes[k].width) / static_cast<double>(side * side);
      // w and h are each rounded by at most half a pixel; the smallest side here is
      // sqrt(0.05 * 1e6 * 3/4) ~ 194 px, so the area moves by at most 2 * 0.5 / 194 < 0.6 %.
      const double low = k < 2 ? 0.14 : 0.05;
      const double high = k < 2 ? 1.0 : 0.14;
      EXPECT_GE(area, low * (1 - 0.006)) << "sample " << n << " crop " << k;
      EXPECT_LE(area, high * (1 + 0.006)) << "sample " << n << " crop " << k;
      if (k >= 2) {
        small_sum += area;
        ++num_small;
      }
    }
  }
  // Small crops never hit torchvision's retry (their widest box, sqrt(0.14 * 4/3) of the
  // side, fits), so their area is uniform on [0.05, 0.14]: mean 0.095, standard deviation
  // 0.09 / sqrt(12) = 0.026, and the mean of 12000 draws lies within 5 standard errors
  // (5 * 0.026 / sqrt(12000) = 0.0012) of 0.095.
  EXPECT_NEAR(small_sum / num_small, 0.095, 0.0012);
}

TEST(ImgPilColorDistortion, EqualsVisslsRandomApplyOfColorJitterThenGrayscale) {
  // Built from the parts it is made of, with the same generator: identical pixels.
  const std::vector<uint8_t> bytes = testing::encode_png(testing::pattern_image(64, 48, 9));
  const EncodedImage encoded(bytes.data(), bytes.size(), "pattern", DecodeOptions{});
  const ImgPilColorDistortion distortion(0.5);
  const ColorJitter jitter(
      ColorJitter::factor_range(0.4, "brightness"),
      ColorJitter::factor_range(0.4, "contrast"),
      ColorJitter::factor_range(0.4, "saturation"),
      ColorJitter::hue_range(0.1));
  const RandomGrayscale grayscale(0.2);
  int num_jittered = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SampleImage image(encoded, DecodeOptions{});
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    distortion.apply(image, gen);
    SampleImage expected(encoded, DecodeOptions{});
    at::Generator reference = at::make_generator<at::CPUGeneratorImpl>(seed);
    if (!(at::rand({1}, reference).item<float>() > 0.8f)) {
      jitter.apply(expected, reference);
      ++num_jittered;
    }
    grayscale.apply(expected, reference);
    EXPECT_TRUE(same(planar_of(image), planar_of(expected))) << "seed " << seed;
  }
  EXPECT_GT(num_jittered, 0);
  EXPECT_LT(num_jittered, 20);
}

// ---- the factory's checks ---------------------------------------------------------------

TransformSpec multicrop_spec(
    std::vector<double> num_crops,
    std::vector<double> size_crops,
    std::vector<std::vector<double>> crop_scales,
    double total) {
  TransformSpec spec(
      "ImgPilToMultiCrop",
      {{"total_num_crops", {total}}, {"num_crops", num_crops}, {"size_crops", size_crops}});
  spec.nested_args["crop_scales"] = std::move(crop_scales);
  return spec;
}

void expect_config_error(const std::vector<TransformSpec>& specs, const std::string& needle) {
  try {
    make_multi_view_transforms(specs);
    ADD_FAILURE() << "no error; expected one mentioning: " << needle;
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(MultiViewFactory, RejectsInconsistentMultiCropArguments) {
  expect_config_error(
      {multicrop_spec({2, 6}, {224}, {{0.14, 1}, {0.05, 0.14}}, 8)},
      "size_crops (1 values: [224]), num_crops (2 values: [2, 6])");
  expect_config_error(
      {multicrop_spec({2, 6}, {224, 96}, {{0.14, 1}, {0.05, 0.14}}, 7)},
      "sum(num_crops) = sum([2, 6]) = 8 != total_num_crops = 7");
  expect_config_error({multicrop_spec({2, 6}, {224, 96}, {{0.14, 1}}, 8)}, "crop_scales (1 pairs)");
  expect_config_error(
      {multicrop_spec({2, 6}, {224, 96}, {{0.14, 1}, {0.05, 0.1, 0.14}}, 8)},
      "'crop_scales' must hold [min, max] pairs");
  expect_config_error(
      {multicrop_spec({2, 6}, {224, 96}, {{0.14, 1}, {0.2, 0.1}}, 8)},
      "crop_scales[1] = [0.2, 0.1]");
  expect_config_error(
      {multicrop_spec({2, 0}, {224, 96}, {{0.14, 1}, {0.05, 0.14}}, 2)}, "num_crops[1] = 0");
  expect_config_error(
      {multicrop_spec({2, 6}, {224, 0}, {{0.14, 1}, {0.05, 0.14}}, 8)}, "size_crops[1] = 0");
  // crop_scales as a flat list: a config's typo, named rather than misread.
  TransformSpec flat(
      "ImgPilToMultiCrop",
      {{"total_num_crops", {1}},
       {"num_crops", {1}},
       {"size_crops", {96}},
       {"crop_scales", {0.14, 1.0}}});
  expect_config_error({flat}, "'crop_scales' must be a list of lists of numbers");
  expect_config_error(
      {multicrop_spec({1}, {96}, {{0.14, 1}}, 1), {"ImgReplicatePil", {{"num_times", {2}}}}},
      "ImgReplicatePil follows ImgPilToMultiCrop");
  expect_config_error({{"ImgReplicatePil", {{"num_times", {0}}}}}, "num_times = 0");
}

TEST(MultiViewFactory, RejectsMisplacedOrSizeChangingTransforms) {
  TransformSpec apply("ImgPilMultiCropRandomApply", {{"prob", {0.0, 0.2, 0.5}}});
  apply.transform_args["transforms"] = {{"ImgPilRandomSolarize", {{"p", {1.0}}}}};
  const TransformSpec two_crops = multicrop_spec({2}, {32}, {{0.08, 1}}, 2);
  expect_config_error(
      {two_crops, apply},
      "made for 3 crops (one probability each) but "
      "ImgPilToMultiCrop makes 2");
  expect_config_error({apply, two_crops}, "comes before the crops are made");
  TransformSpec resizing("ImgPilMultiCropRandomApply", {{"prob", {0.5, 0.5}}});
  resizing.transform_args["transforms"] = {{"CenterCrop", {{"size", {8}}}}};
  expect_config_error({two_crops, resizing}, "change the size of crop 0");
  expect_config_error(
      {two_crops, {"ToTensor", {}}, {"RandomCrop", {{"size", {16}}}}},
      "transform RandomCrop comes after ToTensor in a multi-view list");
  expect_config_error({{"ImgReplicatePil", {}}, {"ToTensor", {}}}, "the size of view 0 depends");
  expect_config_error({{"RandomResizedCrop", {{"size", {8}}}}}, "needs ImgPilToMultiCrop or");
  expect_config_error({{"ImgPilColorDistortion", {{"strength", {3.0}}}}}, "got 3");
}

TEST(MultiViewFactory, OneViewFactoriesNameTheMultiViewBuilder) {
  for (const char* name : {"ImgPilToMultiCrop", "ImgReplicatePil", "ImgPilMultiCropRandomApply"}) {
    EXPECT_THROW(make_sample_transform(TransformSpec(name)), ConfigError) << name;
    try {
      make_image_transforms({TransformSpec(name), TransformSpec("ToTensor")});
      ADD_FAILURE() << name << " accepted by make_image_transforms";
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find("make_multi_view_transforms"), std::string::npos)
          << error.what();
    }
  }
  // The colour distortion is one image's transform: in one-view lists too.
  const ImageTransforms one_view = make_image_transforms(
      {{"RandomResizedCrop", {{"size", {8}}}},
       {"ImgPilColorDistortion", {{"strength", {0.5}}}},
       {"ToTensor", {}}});
  EXPECT_EQ(one_view.per_sample.transforms().back()->name(), "ImgPilColorDistortion");
}

} // namespace
} // namespace largo::data::multi_view_pipeline_test
