// The random draws and geometry of the per-sample transforms: RandomResizedCrop boxes equal
// torchvision's for the same seed, their distribution is the documented one, and the
// deterministic sizes follow torchvision's rounding.
#include "largo/data/sample_transforms.h"

#include <algorithm>
#include <cmath>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "data/image_test_util.h"
#include "largo/core/error.h"
#include "largo/data/sample_pipeline.h"

namespace largo::data::sample_transforms_test {
namespace {

TEST(RandomResizedCrop, DrawsTorchvisionsBoxForTheSameSeed) {
  const auto& boxes = testing::image_baselines()["rrc_boxes"];
  ASSERT_GE(boxes.size(), 100U);
  for (const auto& entry : boxes) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(entry["seed"].get<uint64_t>());
    const CropBox box = RandomResizedCrop::get_params(
        entry["height"],
        entry["width"],
        {entry["scale"][0], entry["scale"][1]},
        {entry["ratio"][0], entry["ratio"][1]},
        gen);
    const CropBox expected{entry["box"][0], entry["box"][1], entry["box"][2], entry["box"][3]};
    EXPECT_EQ(box, expected) << "seed " << entry["seed"] << " image " << entry["height"] << "x"
                             << entry["width"];
  }
}

// One-sample Kolmogorov-Smirnov distance of `values` from the uniform law on [low, high].
double ks_uniform(std::vector<double> values, double low, double high) {
  std::sort(values.begin(), values.end());
  double worst = 0;
  const auto n = static_cast<double>(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const double cdf = std::clamp((values[i] - low) / (high - low), 0.0, 1.0);
    worst = std::max(
        {worst,
         std::abs(cdf - static_cast<double>(i) / n),
         std::abs(cdf - static_cast<double>(i + 1) / n)});
  }
  return worst;
}

TEST(RandomResizedCrop, AreaIsUniformAndAspectLogUniform) {
  // On a 2000 x 2000 image with scale <= 0.5 no try is rejected (w, h <= sqrt(0.5 * 4/3) *
  // 2000 < 2000), so the area fraction is uniform on the scale range and log(w/h) uniform on
  // log(ratio), up to rounding w and h to pixels; the offsets are uniform over what fits.
  constexpr int kDraws = 2000;
  const std::pair<double, double> scale{0.08, 0.5};
  const std::pair<double, double> ratio{3.0 / 4.0, 4.0 / 3.0};
  std::vector<double> areas;
  std::vector<double> log_ratios;
  std::vector<double> relative_tops;
  for (int seed = 0; seed < kDraws; ++seed) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000003ULL * seed + 17);
    const CropBox box = RandomResizedCrop::get_params(2000, 2000, scale, ratio, gen);
    ASSERT_GE(box.top, 0);
    ASSERT_LE(box.top + box.height, 2000);
    areas.push_back(static_cast<double>(box.width * box.height) / (2000.0 * 2000.0));
    log_ratios.push_back(
        std::log(static_cast<double>(box.width) / static_cast<double>(box.height)));
    relative_tops.push_back((box.top + 0.5) / static_cast<double>(2000 - box.height + 1));
  }
  // The 1% critical KS distance for n = 2000 is 1.63 / sqrt(n) = 0.036; pixel rounding
  // moves the area by < 0.2% and log(w/h) by < 0.5%.
  const double critical = 1.63 / std::sqrt(double(kDraws));
  EXPECT_LT(ks_uniform(areas, scale.first, scale.second), critical);
  EXPECT_LT(ks_uniform(log_ratios, std::log(ratio.first), std::log(ratio.second)), critical);
  EXPECT_LT(ks_uniform(relative_tops, 0.0, 1.0), critical);
}

TEST(RandomResizedCrop, FallsBackToTheCentralCrop) {
  // A 1000 x 10 strip cannot hold a box of ratio 3/4..4/3 with >= 8% of its area: every try
  // fails, and the fallback is the central 10 x 13 box (ratio clamped to 4/3).
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const CropBox box =
      RandomResizedCrop::get_params(10, 1000, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, gen);
  EXPECT_EQ(box, (CropBox{0, (1000 - 13) / 2, 10, 13}));
}

TEST(Resize, SizesFollowTorchvision) {
  const Resize shorter({256});
  EXPECT_EQ(shorter.resized_size({375, 500}), (ImageSize{256, 341})); // int(256 * 500 / 375)
  EXPECT_EQ(shorter.resized_size({500, 375}), (ImageSize{341, 256}));
  EXPECT_EQ(shorter.resized_size({300, 300}), (ImageSize{256, 256}));
  // int(256 * 400 / 100) = 1024 > 300: the long side becomes 300, the short int(300 * 256 / 1024).
  EXPECT_EQ(
      Resize({256}, Interpolation::kBilinear, 300).resized_size({100, 400}), (ImageSize{75, 300}));
  EXPECT_EQ(Resize({20, 30}).resized_size({500, 375}), (ImageSize{20, 30}));
  EXPECT_FALSE(shorter.output_size(std::nullopt).has_value());
  EXPECT_THROW(Resize({0}), ConfigError);
  EXPECT_THROW(Resize({20, 30}, Interpolation::kBilinear, 40), ConfigError);
}

TEST(CenterCrop, RoundsHalfToEvenAndPadsSmallImages) {
  const CenterCrop crop({224, 224});
  EXPECT_EQ(crop.box({256, 341}), (CropBox{16, 58, 224, 224})); // round(58.5) = 58
  EXPECT_EQ(crop.box({256, 343}), (CropBox{16, 60, 224, 224})); // round(59.5) = 60
  EXPECT_EQ(CenterCrop({60, 71}).box({48, 64}), (CropBox{-6, -3, 60, 71}));
}

// The draws and padding themselves are checked against torchvision in image_parity_test
// (randomcrop_* cases); these are the edges.
TEST(RandomCrop, PadsBothSidesAndDrawsNothingForAnExactFit) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Generator fresh = at::make_generator<at::CPUGeneratorImpl>(7);
  EXPECT_EQ(RandomCropSample({70, 90}).get_params({70, 90}, gen), (CropBox{0, 0, 70, 90}));
  EXPECT_EQ(at::rand({1}, gen).item<float>(), at::rand({1}, fresh).item<float>());
  // 90 + 2 x 4 = 98 columns lack 2 of 100: 2 more on each side, 102 in all, 3 offsets.
  for (int i = 0; i < 20; ++i) {
    const CropBox box = RandomCropSample({60, 100}, 4, true).get_params({70, 90}, gen);
    EXPECT_GE(box.left, -6);
    EXPECT_LE(box.left, -4);
    EXPECT_GE(box.top, -4);
    EXPECT_LE(box.top, 14);
  }
  EXPECT_THROW(RandomCropSample({80, 80}).get_params({70, 90}, gen), DataError);
  EXPECT_THROW(RandomCropSample({8, 8}, -1), ConfigError);
  EXPECT_THROW(
      make_sample_transform({"RandomCrop", {{"size", {8}}}, {{"pad_if_needed", "maybe"}}}),
      ConfigError);
  EXPECT_THROW(make_sample_transform({"RandomCrop", {{"size", {8}}, {"fill", {1}}}}), ConfigError);
}

TEST(SampleTransforms, FactoryRejectsUnknownNamesAndArguments) {
  EXPECT_THROW(make_sample_transform({"RandomRotation", {}}), ConfigError);
  EXPECT_THROW(
      make_sample_transform({"RandomResizedCrop", {{"size", {224}}, {"scales", {0.1, 1}}}}),
      ConfigError);
  EXPECT_THROW(
      make_sample_transform({"RandomResizedCrop", {{"size", {224}}}, {{"interpolation", "cubic"}}}),
      ConfigError);
  EXPECT_THROW(
      make_sample_transform({"GaussianBlur", {{"kernel_size", {4}}}}), ConfigError); // even
  EXPECT_THROW(make_sample_transform({"ColorJitter", {{"hue", {0.7}}}}), ConfigError);
  EXPECT_THROW(
      make_image_transforms({{"ToTensor", {}}, {"ColorJitter", {{"brightness", {0.4}}}}}),
      ConfigError);
  const ImageTransforms split = make_image_transforms(
      {{"RandomResizedCrop", {{"size", {24, 32}}}, {{"interpolation", "bicubic"}}},
       {"RandomHorizontalFlip", {}},
       {"ToTensor", {}},
       {"Normalize", {{"mean", {0.5, 0.5, 0.5}}, {"std", {0.2, 0.2, 0.2}}}}});
  EXPECT_EQ(split.per_sample.transforms().size(), 2U);
  EXPECT_EQ(split.per_batch.transforms().size(), 2U);
  EXPECT_EQ(split.per_sample.output_size(), (ImageSize{24, 32}));
}

} // namespace
} // namespace largo::data::sample_transforms_test
