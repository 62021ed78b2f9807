// Data against model before training: the shape the transforms produce, empty splits, test
// images or classes the model cannot take. Each refusal names the keys.
#include <largo/core/error.h>
#include <largo/data/dataset.h>
#include <largo/data/synthetic_dataset.h>
#include <largo/train/data_checks.h>

#include <gtest/gtest.h>

namespace largo::train {
namespace {

DataSplitOptions synthetic_split(std::vector<data::TransformSpec> transforms = {}) {
  DataSplitOptions split;
  split.source = "synthetic";
  split.transforms = std::move(transforms);
  return split;
}

data::TransformSpec crop(double size, double padding = 0) {
  return data::TransformSpec{"RandomCrop", {{"size", {size}}, {"padding", {padding}}}};
}

template <typename Error, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

TEST(DataChecksTest, TheModelSeesTheShapeAfterTheTransforms) {
  const data::SyntheticDataset images(8, {3, 32, 32}, 10, 1);
  const SplitFacts facts =
      split_facts("DATA.TRAIN", synthetic_split({crop(24)}), images, images.size());
  EXPECT_EQ(facts.input_shape, (std::vector<int64_t>{3, 24, 24}));
  EXPECT_EQ(facts.num_classes, 10);
  EXPECT_EQ(
      split_facts("DATA.TEST", synthetic_split(), images, 8).input_shape,
      (std::vector<int64_t>{3, 32, 32}));
  // A crop larger than the padded image is a config error naming the key.
  const std::string message = error_of<ConfigError>(
      [&] { split_facts("DATA.TRAIN", synthetic_split({crop(40, 2)}), images, 8); });
  EXPECT_NE(
      message.find("config key DATA.TRAIN.TRANSFORMS cannot take the 3x32x32 images"),
      std::string::npos)
      << message;
}

TEST(DataChecksTest, TestImagesOfAnotherSizeOnlyMatterForFixedSizeTrunks) {
  const data::SyntheticDataset images(8, {3, 32, 32}, 10, 1);
  const SplitFacts train = split_facts("DATA.TRAIN", synthetic_split({crop(24)}), images, 8);
  const SplitFacts test = split_facts("DATA.TEST", synthetic_split(), images, 8);
  EXPECT_NO_THROW(check_data_fits_model(train, test, "small_cnn")); // global pooling
  const std::string message =
      error_of<ConfigError>([&] { check_data_fits_model(train, test, "mlp"); });
  EXPECT_NE(
      message.find("DATA.TEST yields 3x32x32 images but the model is built for "
                   "DATA.TRAIN's 3x24x24 images"),
      std::string::npos)
      << message;
  const data::SyntheticDataset gray(8, {1, 32, 32}, 10, 1);
  EXPECT_NE(
      error_of<ConfigError>([&] {
        check_data_fits_model(test, split_facts("DATA.TEST", synthetic_split(), gray, 8), "resnet");
      }).find("the channel counts differ"),
      std::string::npos);
  const data::SyntheticDataset wide(8, {3, 16, 32}, 10, 1);
  EXPECT_NE(
      error_of<ConfigError>([&] {
        check_data_fits_model(
            split_facts("DATA.TRAIN", synthetic_split(), wide, 8),
            std::nullopt,
            "vision_transformer");
      }).find("takes square images"),
      std::string::npos);
}

TEST(DataChecksTest, MoreTestClassesThanTheHeadHasAreRefused) {
  const data::SyntheticDataset ten(8, {3, 8, 8}, 10, 1);
  const data::SyntheticDataset hundred(8, {3, 8, 8}, 100, 1);
  const std::string message = error_of<ConfigError>([&] {
    check_data_fits_model(
        split_facts("DATA.TRAIN", synthetic_split(), ten, 8),
        split_facts("DATA.TEST", synthetic_split(), hundred, 8),
        "mlp");
  });
  EXPECT_NE(
      message.find("DATA.TEST has 100 classes but the model's head has 10 outputs"),
      std::string::npos)
      << message;
}

TEST(DataChecksTest, EmptySplitsNameWhereTheSamplesComeFrom) {
  DataSplitOptions split;
  split.dataset_name = "FashionMNIST";
  split.path = "/data/empty";
  const data::InMemoryDataset empty(
      at::empty({0, 1, 28, 28}, at::kByte), at::empty({0}, at::kLong), 10);
  const data::SyntheticDataset some(8, {1, 28, 28}, 10, 1);
  const SplitFacts train = split_facts("DATA.TRAIN", split, empty, 0);
  std::string message =
      error_of<DataError>([&] { check_data_fits_model(train, std::nullopt, "mlp"); });
  EXPECT_NE(
      message.find("DATA.TRAIN has no samples (FashionMNIST in /data/empty"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("DROP_LAST"), std::string::npos) << message;
  message = error_of<DataError>([&] {
    check_data_fits_model(
        split_facts("DATA.TRAIN", synthetic_split(), some, 8),
        split_facts("DATA.TEST", split, empty, 0),
        "mlp");
  });
  EXPECT_NE(message.find("DATA.TEST has no samples"), std::string::npos) << message;
  EXPECT_NE(message.find("TEST_MODEL=False"), std::string::npos) << message;
  // Without evaluation, an empty test split is not looked at.
  EXPECT_NO_THROW(check_data_fits_model(
      split_facts("DATA.TRAIN", synthetic_split(), some, 8), std::nullopt, "mlp"));
}

} // namespace
} // namespace largo::train
