// The DATA.* keys -> data options mapping: every source, the label keys, transforms with
// words and ranges, VISSL's multi-view lists (SwAV, SimCLR, BYOL) and their collators, the
// image-decoding extension keys, the loader keys, and errors that name the key.
#include <largo/train/data_config.h>

#include <largo/core/resources.h>
#include <largo/data/multi_view_pipeline.h>
#include <largo/data/sample_pipeline.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "test_paths.h"

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

// LABEL_SOURCES [] with LABEL_TYPE sample_index (VISSL's self-supervised configs on file
// lists) reads no labels; a LABEL_PATHS written beside it would be ignored, so it is refused.
TEST(DataConfig, DiskFilelistWithoutLabelSourcesNeedsSampleIndexLabels) {
  const data::DataSplitOptions split = data_split_from(
      load("config: {DATA: {TRAIN: {DATA_SOURCES: [disk_filelist], DATA_PATHS: [/a.npy], "
           "LABEL_TYPE: sample_index}}}"),
      "DATA.TRAIN");
  EXPECT_EQ(split.source.label_type, "sample_index");
  EXPECT_TRUE(split.source.label_path.empty());
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [disk_filelist], DATA_PATHS: [/a.npy], "
      "LABEL_TYPE: sample_index, LABEL_PATHS: [/labels.npy]}}}",
      "DATA.TRAIN.LABEL_PATHS");
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [disk_filelist], DATA_PATHS: [/a.npy], "
      "LABEL_SOURCES: [disk_folder], LABEL_TYPE: sample_index}}}",
      "DATA.TRAIN.LABEL_SOURCES");
}

// VISSL's defaults.yaml: "if LABEL_SOURCES is provided, it will override LABEL_TYPE".
TEST(DataConfig, LabelSourcesOverrideSampleIndexAsInVissl) {
  const data::DataSplitOptions split = data_split_from(
      load("config: {DATA: {TRAIN: {DATA_SOURCES: [disk_folder], DATA_PATHS: [/images], "
           "LABEL_SOURCES: [disk_folder], LABEL_TYPE: sample_index}}}"),
      "DATA.TRAIN");
  EXPECT_EQ(split.source.label_type, "standard");
  const data::DataSplitOptions unlabeled = data_split_from(
      load("config: {DATA: {TRAIN: {DATA_SOURCES: [disk_folder], DATA_PATHS: [/images], "
           "LABEL_TYPE: sample_index}}}"),
      "DATA.TRAIN");
  EXPECT_EQ(unlabeled.source.label_type, "sample_index");
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
  expect_key_error("config: {DATA: {TRAIN: {LABEL_TYPE: zero}}}", "DATA.TRAIN.LABEL_TYPE");
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
      {std::filesystem::path(largo::test_paths::data_dir()) / ".." / "configs" / "examples" /
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

// A config written for a bigger machine runs with what this one has (4 loader threads per
// core); a count no machine could mean is refused.
TEST(DataConfig, LoaderWorkersBeyondTheMachineAreCappedAtFourPerCore) {
  const int64_t most = 4 * largo::available_cpu_cores();
  const DataLoadingOptions loading = data_loading_from(
      load(fmt::format("config: {{DATA: {{NUM_DATALOADER_WORKERS: {}}}}}", most + 1)));
  EXPECT_EQ(loading.num_workers, most);
  EXPECT_EQ(
      data_loading_from(load(fmt::format("config: {{DATA: {{NUM_DATALOADER_WORKERS: {}}}}}", most)))
          .num_workers,
      most);
  try {
    data_loading_from(load("config: {DATA: {NUM_DATALOADER_WORKERS: 4097}}"));
    FAIL() << "4097 loader threads were accepted";
  } catch (const ResourceError& e) {
    EXPECT_NE(
        std::string(e.what()).find("config key DATA.NUM_DATALOADER_WORKERS = 4097: expected at "
                                   "most 4096"),
        std::string::npos)
        << e.what();
  }
}

// VISSL's SwAV config (swav_8node_resnet.yaml's DATA.TRAIN), as written.
const char* kSwavTrain = R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [disk_folder]
      DATA_PATHS: ["/datasets/imagenet/train"]
      COLLATE_FUNCTION: multicrop_collator
      TRANSFORMS:
        - name: ImgPilToMultiCrop
          total_num_crops: 8
          size_crops: [224, 96]
          num_crops: [2, 6]
          crop_scales: [[0.14, 1], [0.05, 0.14]]
        - name: RandomHorizontalFlip
          p: 0.5
        - name: ImgPilColorDistortion
          strength: 1.0
        - name: ImgPilGaussianBlur
          p: 0.5
          radius_min: 0.1
          radius_max: 2.0
        - name: ToTensor
        - name: Normalize
          mean: [0.485, 0.456, 0.406]
          std: [0.229, 0.224, 0.225]
)";

// VISSL's SimCLR config (simclr_8node_resnet.yaml's DATA.TRAIN), as written.
const char* kSimclrTrain = R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [disk_folder]
      DATA_PATHS: ["/datasets/imagenet/train"]
      COLLATE_FUNCTION: simclr_collator
      TRANSFORMS:
        - name: ImgReplicatePil
          num_times: 2
        - name: RandomResizedCrop
          size: 224
        - name: RandomHorizontalFlip
          p: 0.5
        - name: ImgPilColorDistortion
          strength: 1.0
        - name: ImgPilGaussianBlur
          p: 0.5
          radius_min: 0.1
          radius_max: 2.0
        - name: ToTensor
        - name: Normalize
          mean: [0.485, 0.456, 0.406]
          std: [0.229, 0.224, 0.225]
)";

// The list after the splitter, shared by both configs.
std::vector<data::TransformSpec> per_view_and_batch() {
  return {
      {"RandomHorizontalFlip", {{"p", {0.5}}}},
      {"ImgPilColorDistortion", {{"strength", {1.0}}}},
      {"ImgPilGaussianBlur", {{"p", {0.5}}, {"radius_min", {0.1}}, {"radius_max", {2.0}}}},
      {"ToTensor", {}},
      {"Normalize", {{"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}}}};
}

void expect_same_specs(
    const std::vector<data::TransformSpec>& read, const std::vector<data::TransformSpec>& built) {
  ASSERT_EQ(read.size(), built.size());
  for (size_t i = 0; i < read.size(); ++i) {
    EXPECT_TRUE(read[i] == built[i]) << "entry " << i << " (" << built[i].name << ")";
  }
}

int64_t count_of(const std::vector<std::optional<data::ImageSize>>& sizes, int64_t side) {
  return std::count(sizes.begin(), sizes.end(), data::ImageSize{side, side});
}

TEST(DataConfig, VisslsSwavTransformsReadAsTheMultiCropListBuiltByHand) {
  const data::DataSplitOptions split = data_split_from(load(kSwavTrain), "DATA.TRAIN");
  data::TransformSpec multicrop(
      "ImgPilToMultiCrop",
      {{"total_num_crops", {8}}, {"size_crops", {224, 96}}, {"num_crops", {2, 6}}});
  multicrop.nested_args["crop_scales"] = {{0.14, 1}, {0.05, 0.14}};
  std::vector<data::TransformSpec> built{multicrop};
  for (const data::TransformSpec& spec : per_view_and_batch()) {
    built.push_back(spec);
  }
  expect_same_specs(split.source.transforms, built);
  EXPECT_EQ(split.collate, "multicrop_collator");
  const auto sizes =
      data::make_multi_view_transforms(split.source.transforms).per_sample.view_sizes();
  ASSERT_EQ(sizes.size(), 8U);
  EXPECT_EQ(count_of(sizes, 224), 2);
  EXPECT_EQ(count_of(sizes, 96), 6);
}

TEST(DataConfig, VisslsSimclrTransformsReadAsTheReplicatedListBuiltByHand) {
  const data::DataSplitOptions split = data_split_from(load(kSimclrTrain), "DATA.TRAIN");
  std::vector<data::TransformSpec> built{
      {"ImgReplicatePil", {{"num_times", {2}}}}, {"RandomResizedCrop", {{"size", {224}}}}};
  for (const data::TransformSpec& spec : per_view_and_batch()) {
    built.push_back(spec);
  }
  expect_same_specs(split.source.transforms, built);
  EXPECT_EQ(split.collate, "simclr_collator");
  const auto sizes =
      data::make_multi_view_transforms(split.source.transforms).per_sample.view_sizes();
  ASSERT_EQ(sizes.size(), 2U);
  EXPECT_EQ(count_of(sizes, 224), 2);
}

// BYOL's per-view blur and solarize: a list of transform maps, read like TRANSFORMS entries.
TEST(DataConfig, MultiCropRandomApplyReadsItsTransformsAndProbabilities) {
  const data::DataSplitOptions split = data_split_from(
      load(R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [disk_folder]
      DATA_PATHS: ["/d"]
      COLLATE_FUNCTION: simclr_collator
      TRANSFORMS:
        - {name: ImgReplicatePil, num_times: 2}
        - {name: RandomResizedCrop, size: 32, interpolation: bicubic}
        - name: ImgPilMultiCropRandomApply
          transforms: [{name: ImgPilGaussianBlur, p: 1., radius_min: 0.1, radius_max: 2.0}]
          prob: [1., 0.1]
        - name: ImgPilMultiCropRandomApply
          transforms: [{name: ImgPilRandomSolarize, p: 1.0}]
          prob: [0., 0.2]
        - {name: ToTensor}
)"),
      "DATA.TRAIN");
  data::TransformSpec blur("ImgPilMultiCropRandomApply", {{"prob", {1.0, 0.1}}});
  blur.transform_args["transforms"] = {
      {"ImgPilGaussianBlur", {{"p", {1.0}}, {"radius_min", {0.1}}, {"radius_max", {2.0}}}}};
  data::TransformSpec solarize("ImgPilMultiCropRandomApply", {{"prob", {0.0, 0.2}}});
  solarize.transform_args["transforms"] = {{"ImgPilRandomSolarize", {{"p", {1.0}}}}};
  expect_same_specs(
      split.source.transforms,
      {{"ImgReplicatePil", {{"num_times", {2}}}},
       {"RandomResizedCrop", {{"size", {32}}}, {{"interpolation", "bicubic"}}},
       blur,
       solarize,
       {"ToTensor", {}}});
  EXPECT_EQ(data::make_multi_view_transforms(split.source.transforms).per_sample.num_views(), 2);
}

TEST(DataConfig, BadNestedTransformArgumentsNameTheirKey) {
  const std::string head = R"(
config:
  DATA:
    TRAIN:
      DATA_SOURCES: [disk_folder]
      DATA_PATHS: ["/d"]
      COLLATE_FUNCTION: multicrop_collator
      TRANSFORMS:
)";
  const std::string multicrop =
      "        - {name: ImgPilToMultiCrop, total_num_crops: 2, size_crops: [32, 16], "
      "num_crops: [1, 1], crop_scales: ";
  expect_key_error(
      head + multicrop + "[[0.14, a], [0.05, 0.14]]}\n",
      "DATA.TRAIN.TRANSFORMS[0].crop_scales[0][1] = a");
  expect_key_error(
      head + multicrop + "[[0.14, 1], 0.05]}\n", "DATA.TRAIN.TRANSFORMS[0].crop_scales[1]");
  expect_key_error(head + multicrop + "[[0.14, [1]]]}\n", "DATA.TRAIN.TRANSFORMS[0].crop_scales");
  const std::string pair = "        - {name: ImgReplicatePil}\n"
                           "        - {name: RandomResizedCrop, size: 32}\n";
  expect_key_error(
      head + pair +
          "        - {name: ImgPilMultiCropRandomApply, prob: [1, 1], transforms: "
          "[{name: ImgPilGaussianBlur}, {p: 0.5}]}\n",
      "DATA.TRAIN.TRANSFORMS[2].transforms[1]");
  expect_key_error(
      head + pair +
          "        - {name: ImgPilMultiCropRandomApply, prob: [1, 1], transforms: "
          "[{name: ImgPilRandomSolarize, p: [x]}]}\n",
      "DATA.TRAIN.TRANSFORMS[2].transforms[0].p");
  expect_key_error(
      head + pair +
          "        - {name: ImgPilMultiCropRandomApply, prob: [1, 1], transforms: "
          "[{name: ImgPilRandomSolarize}, 0.5]}\n",
      "DATA.TRAIN.TRANSFORMS[2].transforms[1]");
}

void expect_split_error(
    const std::string& yaml, const std::string& prefix, const std::vector<std::string>& parts) {
  try {
    data_split_from(load(yaml), prefix);
    ADD_FAILURE() << "accepted: " << yaml;
  } catch (const ConfigError& error) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(error.what()).find(part), std::string::npos) << error.what();
    }
  }
}

// What VISSL does (or fails at) with each pairing of collator and views.
TEST(DataConfig, CollateFunctionMustFitTheViewsTransformsMake) {
  const std::string swav = kSwavTrain;
  const std::string simclr = kSimclrTrain;
  auto with_collate = [](std::string yaml, const std::string& from, const std::string& to) {
    yaml.replace(yaml.find(from), from.size(), to);
    return yaml;
  };
  const std::string key = "DATA.TRAIN.COLLATE_FUNCTION";
  expect_split_error(
      with_collate(swav, "multicrop_collator", "default_collate"),
      "DATA.TRAIN",
      {key + " = default_collate", "multicrop_collator, simclr_collator or moco_collator"});
  expect_split_error(
      with_collate(simclr, "simclr_collator", "default_collate"),
      "DATA.TRAIN",
      {key + " = default_collate", "default_collate cannot stack"});
  expect_split_error(
      with_collate(swav, "multicrop_collator", "simclr_collator"),
      "DATA.TRAIN",
      {key + " = simclr_collator", "2 views of one size", "makes 8", "224x224, 224x224, 96x96"});
  expect_split_error( // MoCo's collator takes SimCLR's 2 views of one size
      with_collate(swav, "multicrop_collator", "moco_collator"),
      "DATA.TRAIN",
      {key + " = moco_collator", "2 views of one size", "makes 8"});
  expect_split_error(
      "config: {DATA: {TRAIN: {COLLATE_FUNCTION: multicrop_collator}}}",
      "DATA.TRAIN",
      {key + " = multicrop_collator", "add ImgPilToMultiCrop"});
  expect_split_error(
      with_collate(swav, "multicrop_collator", "cutmixup_collator"),
      "DATA.TRAIN",
      {key + " = cutmixup_collator", "not available in this version of Largo"});
  // simclr_collator reads the views' sizes from the list it is given, naming the list.
  expect_split_error(
      with_collate(simclr, "size: 224", "size: -1"),
      "DATA.TRAIN",
      {"DATA.TRAIN.TRANSFORMS", "RandomResizedCrop"});
  // The pairs that fit, including ImgReplicatePil's two views for multicrop_collator.
  EXPECT_EQ(
      data_split_from(
          load(with_collate(simclr, "simclr_collator", "multicrop_collator")), "DATA.TRAIN")
          .collate,
      "multicrop_collator");
  EXPECT_EQ(data_split_from(load("config: {}"), "DATA.TRAIN").collate, "default_collate");
}

TEST(DataConfig, EvaluationReadsOneImagePerSample) {
  const std::string test_split = R"(
config:
  DATA:
    TEST:
      DATA_SOURCES: [disk_folder]
      DATA_PATHS: ["/d"]
      TRANSFORMS:
        - {name: ImgReplicatePil, num_times: 2}
        - {name: RandomResizedCrop, size: 32}
        - {name: ToTensor}
)";
  expect_split_error(
      test_split, "DATA.TEST", {"DATA.TEST.TRANSFORMS[0].name = ImgReplicatePil", "DATA.TRAIN"});
  expect_split_error(
      "config: {DATA: {TEST: {COLLATE_FUNCTION: simclr_collator}}}",
      "DATA.TEST",
      {"DATA.TEST.COLLATE_FUNCTION = simclr_collator", "one image per sample"});
  // The colour distortion is one image's transform: any split's one-view list takes it.
  const Config config = load(R"(
config:
  DATA:
    TEST:
      DATA_SOURCES: [disk_folder]
      DATA_PATHS: ["/d"]
      TRANSFORMS:
        - {name: RandomResizedCrop, size: 32}
        - {name: ImgPilColorDistortion, strength: 0.5}
        - {name: ToTensor}
)");
  const data::DataSplitOptions split = data_split_from(config, "DATA.TEST");
  const data::ImageTransforms transforms = data::make_image_transforms(split.source.transforms);
  EXPECT_EQ(transforms.per_sample.transforms().back()->name(), "ImgPilColorDistortion");
}

// COPY_DESTINATION_DIR matters only with COPY_TO_LOCAL_DISK on (VISSL's configs name one
// beside a False switch); on, it must be named, and the sources without files refuse it.
TEST(DataConfig, CopyToLocalDiskNeedsItsDirectoryAndFiles) {
  const std::string folder =
      "config: {DATA: {TRAIN: {DATA_SOURCES: [disk_folder], DATA_PATHS: [/shared/imagenet], "
      "COPY_DESTINATION_DIR: /tmp/imagenet1k/";
  EXPECT_TRUE(data_split_from(load(folder + "}}}"), "DATA.TRAIN").source.local_copy_dir.empty());
  EXPECT_EQ(
      data_split_from(load(folder + ", COPY_TO_LOCAL_DISK: True}}}"), "DATA.TRAIN")
          .source.local_copy_dir,
      "/tmp/imagenet1k/");
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [disk_folder], DATA_PATHS: [/shared/imagenet], "
      "COPY_TO_LOCAL_DISK: True}}}",
      "DATA.TRAIN.COPY_DESTINATION_DIR");
  expect_key_error(
      "config: {DATA: {TRAIN: {DATA_SOURCES: [webdataset], DATA_PATHS: ['/s/{0..3}.tar'], "
      "COPY_TO_LOCAL_DISK: True, COPY_DESTINATION_DIR: /tmp/x}}}",
      "DATA.TRAIN.COPY_TO_LOCAL_DISK");
}

} // namespace
} // namespace largo::train::data_config_test
