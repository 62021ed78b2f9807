// The DATA.* keys -> data options mapping: every source, the label keys, transforms with
// words and ranges, the image-decoding extension keys, the loader keys, and errors that name
// the key.
#include <largo/train/data_config.h>

#include <largo/data/sample_pipeline.h>

#include <gtest/gtest.h>

namespace largo::train::data_config_test {
namespace {

Config load(const std::string& yaml) {
  Config config = Config::defaults();
  config.merge_yaml(yaml, "test");
  return config;
}

void expect_key_error(const std::string& yaml, const std::string& key) {
  try {
    data_split_from(load(yaml), "DATA.TRAIN");
    FAIL() << "accepted: " << yaml;
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find(key), std::string::npos) << error.what();
  }
}

TEST(DataConfig, DiskFolderWithTheImageNetTransforms) {
  const Config config = load(R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [disk_folder]
      LABEL_SOURCES: [disk_folder]
      DATASET_NAMES: [imagenet1k_folder]
      DATA_PATHS: ["/datasets/imagenet/train"]
      BATCHSIZE_PER_REPLICA: 32
      DATA_LIMIT: 1000
      SKIP_BAD_SAMPLES: True
      MAX_IMAGE_PIXELS: 1000000
      DCT_SCALING: False
      TRANSFORMS:
        - {name: RandomResizedCrop, size: 224, scale: [0.2, 1.0], interpolation: bicubic}
        - {name: RandomHorizontalFlip}
        - {name: ColorJitter, brightness: 0.4, hue: [-0.1, 0.1]}
        - {name: ToTensor}
        - {name: Normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
)");
  const data::DataSplitOptions split = data_split_from(config, "DATA.TRAIN");
  EXPECT_EQ(split.source.source, "disk_folder");
  EXPECT_EQ(split.source.path, "/datasets/imagenet/train");
  EXPECT_EQ(split.batch_size, 32);
  EXPECT_EQ(split.data_limit, 1000);
  EXPECT_TRUE(split.source.images.skip_bad_samples);
  EXPECT_EQ(split.source.images.decode.max_pixels, 1000000);
  EXPECT_FALSE(split.source.images.decode.dct_scaling);
  ASSERT_EQ(split.source.transforms.size(), 5U);
  const data::TransformSpec& crop = split.source.transforms[0];
  EXPECT_EQ(crop.name, "RandomResizedCrop");
  EXPECT_EQ(crop.args.at("size"), std::vector<double>{224});
  EXPECT_EQ(crop.args.at("scale"), (std::vector<double>{0.2, 1.0}));
  EXPECT_EQ(crop.text_args.at("interpolation"), "bicubic");
  EXPECT_EQ(split.source.transforms[2].args.at("hue"), (std::vector<double>{-0.1, 0.1}));
  // The test split keeps the defaults, including the new keys.
  const data::DataSplitOptions test = data_split_from(config, "DATA.TEST");
  EXPECT_EQ(test.source.source, "torchvision_dataset");
  EXPECT_EQ(test.source.dataset_name, "FashionMNIST");
  EXPECT_FALSE(test.source.images.skip_bad_samples);
  EXPECT_EQ(test.source.images.decode.max_pixels, data::kPilMaxImagePixels);
  EXPECT_TRUE(test.source.images.decode.dct_scaling);
}

TEST(DataConfig, DiskFilelistNeedsItsLabelFile) {
  const data::DataSplitOptions split = data_split_from(
      load(R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [disk_filelist]
      DATA_PATHS: ["/lists/train_images.npy"]
      LABEL_SOURCES: [disk_filelist]
      LABEL_PATHS: ["/lists/train_labels.npy"]
      REMOVE_IMG_PATH_PREFIX: "/old"
      NEW_IMG_PATH_PREFIX: "/new"
      USE_STATEFUL_DISTRIBUTED_SAMPLER: True
)"),
      "DATA.TRAIN");
  EXPECT_EQ(split.source.source, "disk_filelist");
  EXPECT_EQ(split.source.path, "/lists/train_images.npy");
  EXPECT_EQ(split.source.label_path, "/lists/train_labels.npy");
  EXPECT_EQ(split.source.remove_path_prefix, "/old");
  EXPECT_EQ(split.source.new_path_prefix, "/new");
  EXPECT_TRUE(split.use_stateful_sampler);
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [disk_filelist], DATA_PATHS: [/a.npy]}}}",
      "DATA.TRAIN.LABEL_SOURCES");
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [disk_filelist], DATA_PATHS: [/a.npy], "
      "LABEL_SOURCES: [disk_filelist]}}}",
      "DATA.TRAIN.LABEL_PATHS");
}

TEST(DataConfig, BadValuesNameTheirKey) {
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [airstore]}}}", "DATA.TRAIN.DATA_SOURCES");
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [disk_folder, disk_folder]}}}",
      "DATA.TRAIN.DATA_SOURCES");
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [disk_folder], DATA_PATHS: []}}}",
      "DATA.TRAIN.DATA_PATHS");
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [disk_folder], LABEL_SOURCES: [disk_filelist]}}}",
      "DATA.TRAIN.LABEL_SOURCES");
  expect_key_error("config: {DATA: {TRAIN: {LABEL_TYPE: sample_index}}}", "DATA.TRAIN.LABEL_TYPE");
  expect_key_error(
      "config: {DATA: {TRAIN: {MAX_IMAGE_PIXELS: -5}}}", "DATA.TRAIN.MAX_IMAGE_PIXELS");
  expect_key_error(
      "config: {DATA: {TRAIN: {DATASET_NAMES: [ImageNet]}}}", "DATA.TRAIN.DATASET_NAMES");
  expect_key_error(
      "config: {DATA: {TRAIN: {TRANSFORMS: [{size: 3}]}}}", "DATA.TRAIN.TRANSFORMS[0]");
  expect_key_error(
      "config: {DATA: {TRAIN: {TRANSFORMS: [{name: Normalize, mean: [a, b]}]}}}",
      "DATA.TRAIN.TRANSFORMS[0].mean");
  expect_key_error("config: {DATA: {TRAIN: {DATA_LIMIT: 0}}}", "DATA.TRAIN.DATA_LIMIT");
}

TEST(DataConfig, TheImageNetExampleMapsToImageTransforms) {
  const Config config = Config::load(
      {std::filesystem::path(LARGO_TEST_DATA_DIR) / ".." / "configs" / "examples" /
       "imagenet_resnet50.yaml"});
  for (const std::string split : {"DATA.TRAIN", "DATA.TEST"}) {
    const data::DataSplitOptions options = data_split_from(config, split);
    EXPECT_EQ(options.source.source, "disk_folder");
    const data::ImageTransforms transforms = data::make_image_transforms(options.source.transforms);
    EXPECT_EQ(transforms.per_sample.output_size(), (data::ImageSize{224, 224})) << split;
    EXPECT_EQ(transforms.per_batch.transforms().size(), 2U) << split; // ToTensor, Normalize
  }
}

TEST(DataConfig, LoaderKeys) {
  const DataLoadingOptions loading =
      data_loading_from(load("config: {DATA: {NUM_DATALOADER_WORKERS: 5, PIN_MEMORY: False}}"));
  EXPECT_EQ(loading.num_workers, 5);
  EXPECT_FALSE(loading.pin_memory);
  EXPECT_TRUE(loading.async_gpu_copy);
  EXPECT_THROW(
      data_loading_from(load("config: {DATA: {NUM_DATALOADER_WORKERS: -1}}")), ConfigError);
}

TEST(DataConfig, MultiCropTransformsAreRefusedUntilTheTrainerRunsAnSslLoss) {
  const std::string swav = R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [disk_folder]
      DATA_PATHS: ["/datasets/imagenet/train"]
      TRANSFORMS:
        - name: ImgPilToMultiCrop
          total_num_crops: 8
          size_crops: [224, 96]
          num_crops: [2, 6]
          crop_scales: [[0.14, 1], [0.05, 0.14]]
        - {name: RandomHorizontalFlip, p: 0.5}
        - {name: ToTensor}
)";
  expect_key_error(swav, "DATA.TRAIN.TRANSFORMS[0].name = ImgPilToMultiCrop");
  expect_key_error(swav, "multi-crop transforms need an SSL loss, which the trainer does not run");
  expect_key_error(
      R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [disk_folder]
      DATA_PATHS: ["/d"]
      TRANSFORMS: [{name: RandomResizedCrop, size: 32}, {name: ImgReplicatePil, num_times: 2}]
)",
      "DATA.TRAIN.TRANSFORMS[1].name = ImgReplicatePil");
  // The colour distortion is one image's transform: the trainer's one-view path takes it.
  const Config config = load(R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [disk_folder]
      DATA_PATHS: ["/d"]
      TRANSFORMS:
        - {name: RandomResizedCrop, size: 32}
        - {name: ImgPilColorDistortion, strength: 0.5}
        - {name: ToTensor}
)");
  const data::DataSplitOptions split = data_split_from(config, "DATA.TRAIN");
  const data::ImageTransforms transforms = data::make_image_transforms(split.source.transforms);
  EXPECT_EQ(transforms.per_sample.transforms().back()->name(), "ImgPilColorDistortion");
}

} // namespace
} // namespace largo::train::data_config_test
