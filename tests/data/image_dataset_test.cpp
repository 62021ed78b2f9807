// Image folders through open_dataset and the DataLoader: the loader contract (same batches
// for any worker count, after a mid-epoch restart, per-sample draws independent of the batch
// size), disk_filelist equal to disk_folder, bad files (an error naming the file, or skipped
// and counted), the loader's statistics, and several views per sample (MultiViewPipeline).
#include "largo/data/image_dataset.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "data/image_test_util.h"
#include "data/temp_dir.h"
#include "largo/core/error.h"
#include "largo/data/data_loader.h"
#include "largo/data/dataset_factory.h"
#include "largo/data/npy.h"

namespace largo::data::image_dataset_test {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// 3 classes x 4 images of different sizes (JPEG, one PNG per class).
void write_folder(const fs::path& root) {
  int seed = 0;
  for (const std::string label : {"ant", "bee", "cow"}) {
    fs::create_directories(root / label);
    for (int i = 0; i < 4; ++i, ++seed) {
      const Image image = testing::pattern_image(40 + 3 * seed, 30 + seed, seed);
      testing::write_bytes(
          root / label / ("img" + std::to_string(i) + (i == 3 ? ".png" : ".jpg")),
          i == 3 ? testing::encode_png(image) : testing::encode_jpeg(image));
    }
  }
}

DataSourceOptions folder_source(const fs::path& root) {
  DataSourceOptions source;
  source.source = "disk_folder";
  source.path = root;
  source.transforms = {
      {"RandomResizedCrop", {{"size", {16}}}},
      {"RandomHorizontalFlip", {}},
      {"ColorJitter", {{"brightness", {0.4}}, {"hue", {0.1}}}},
      {"ToTensor", {}},
      {"Normalize", {{"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}}}};
  return source;
}

std::vector<Batch> drain(
    const OpenedDataset& opened,
    int64_t workers,
    int64_t batch_size,
    const std::vector<int64_t>& order,
    int64_t epoch,
    int64_t start_batch = 0) {
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.num_workers = workers;
  options.transforms = opened.transforms;
  options.seed = 5;
  DataLoader loader(opened.dataset, options);
  loader.start_epoch(order, epoch, start_batch);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) {
    batches.push_back(std::move(*batch));
  }
  return batches;
}

const std::vector<int64_t> kOrder{7, 2, 11, 0, 5, 9, 1, 3, 10, 4, 8, 6};

TEST(ImageDataset, BatchesAreTheSameForAnyWorkerCountAndAfterResume) {
  TempDir dir;
  write_folder(dir.path());
  const OpenedDataset opened = open_dataset(folder_source(dir.path()), Split::kTrain, 0);
  EXPECT_EQ(opened.sample_shape, (std::vector<int64_t>{3, 16, 16}));
  EXPECT_EQ(opened.num_classes, 3);
  const auto reference = drain(opened, 0, 5, kOrder, 1);
  ASSERT_EQ(reference.size(), 3U);
  EXPECT_EQ(reference[0].images.sizes().vec(), (std::vector<int64_t>{5, 3, 16, 16}));
  EXPECT_EQ(reference[0].labels[0].item<int64_t>(), 1); // sample 7 is bee/img3
  for (const int64_t workers : {1, 3}) {
    const auto batches = drain(opened, workers, 5, kOrder, 1);
    ASSERT_EQ(batches.size(), reference.size());
    for (size_t k = 0; k < batches.size(); ++k) {
      EXPECT_TRUE(batches[k].images.equal(reference[k].images))
          << workers << " workers, batch " << k;
      EXPECT_TRUE(batches[k].labels.equal(reference[k].labels));
    }
  }
  const auto resumed = drain(opened, 2, 5, kOrder, 1, /*start_batch=*/1);
  ASSERT_EQ(resumed.size(), 2U);
  EXPECT_TRUE(resumed[0].images.equal(reference[1].images));
  EXPECT_TRUE(resumed[1].images.equal(reference[2].images));
  // Draws belong to (seed, epoch, sample): a different batch size keeps each sample's
  // crop; another epoch changes it.
  const auto by_four = drain(opened, 1, 4, kOrder, 1);
  EXPECT_TRUE(by_four[1].images[0].equal(reference[0].images[4])); // sample 5 in both
  const auto next_epoch = drain(opened, 1, 5, kOrder, 2);
  EXPECT_FALSE(next_epoch[0].images.equal(reference[0].images));
}

TEST(ImageDataset, FilelistReadsTheSameSamplesAsTheFolder) {
  TempDir dir;
  write_folder(dir.path() / "tree");
  const ImageList folder = list_image_folder(dir.path() / "tree");
  write_npy_strings(dir.path() / "paths.npy", folder.paths);
  write_npy(dir.path() / "labels.npy", at::tensor(folder.labels, at::kLong));
  DataSourceOptions source = folder_source(dir.path() / "tree");
  const auto from_folder = drain(open_dataset(source, Split::kTrain, 0), 0, 6, kOrder, 0);
  source.source = "disk_filelist";
  source.path = dir.path() / "paths.npy";
  source.label_path = dir.path() / "labels.npy";
  const auto from_list = drain(open_dataset(source, Split::kTrain, 0), 0, 6, kOrder, 0);
  ASSERT_EQ(from_list.size(), from_folder.size());
  for (size_t k = 0; k < from_list.size(); ++k) {
    EXPECT_TRUE(from_list[k].images.equal(from_folder[k].images));
    EXPECT_TRUE(from_list[k].labels.equal(from_folder[k].labels));
  }
  source.label_path.clear();
  EXPECT_THROW(open_dataset(source, Split::kTrain, 0), ConfigError);
}

TEST(ImageDataset, ABadFileStopsTheEpochWithItsNameOrIsSkippedAndCounted) {
  TempDir dir;
  write_folder(dir.path());
  const fs::path bad = dir.path() / "bee" / "img1.jpg";
  std::vector<uint8_t> bytes = testing::read_bytes(bad);
  bytes.resize(bytes.size() / 2); // truncated
  testing::write_bytes(bad, bytes);
  const std::vector<int64_t> order{0, 1, 4, 5, 6, 7}; // sample 5 is bee/img1.jpg
  const DataSourceOptions source = folder_source(dir.path());
  for (const int64_t workers : {0, 2}) {
    try {
      drain(open_dataset(source, Split::kTrain, 0), workers, 2, order, 0);
      FAIL() << "the truncated file went unnoticed";
    } catch (const DataError& error) {
      EXPECT_NE(std::string(error.what()).find("img1.jpg"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("truncated"), std::string::npos) << error.what();
    }
  }
  DataSourceOptions skipping = source;
  skipping.images.skip_bad_samples = true;
  const OpenedDataset opened = open_dataset(skipping, Split::kTrain, 0);
  DataLoaderOptions options;
  options.batch_size = 2;
  options.num_workers = 2;
  options.transforms = opened.transforms;
  DataLoader loader(opened.dataset, options);
  loader.start_epoch(order, 0);
  int64_t images = 0;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->images.size(0), 2);
    images += batch->images.size(0);
  }
  EXPECT_EQ(images, 6);
  const LoaderStats stats = loader.stats();
  EXPECT_EQ(stats.num_bad_samples, 1);
  EXPECT_EQ(stats.num_images, 6);
  EXPECT_EQ(stats.num_batches, 3);
  EXPECT_GT(stats.build_seconds, 0.0);
  EXPECT_GT(stats.images_per_second(), 0.0);
  EXPECT_GE(stats.elapsed_seconds, stats.wait_seconds);
}

TEST(ImageDataset, ImagesOfEqualSizeNeedNoGeometricTransform) {
  // A Fashion-MNIST-like folder: 28 x 28 grayscale PNGs, only ToTensor + Normalize.
  TempDir dir;
  for (int i = 0; i < 3; ++i) {
    fs::create_directories(dir.path() / std::to_string(i));
    testing::write_bytes(
        dir.path() / std::to_string(i) / "a.png",
        testing::encode_png(testing::pattern_image(28, 28, i)));
  }
  DataSourceOptions source;
  source.source = "disk_folder";
  source.path = dir.path();
  source.transforms = {{"ToTensor", {}}, {"Normalize", {{"mean", {0.5}}, {"std", {0.25}}}}};
  const OpenedDataset opened = open_dataset(source, Split::kTrain, 0);
  EXPECT_EQ(opened.sample_shape, (std::vector<int64_t>{3, 28, 28}));
  const auto batches = drain(opened, 0, 3, {0, 1, 2}, 0);
  // Pixel (y=0, x=27) of image 1: R = 255 -> (1 - 0.5) / 0.25 = 2.
  EXPECT_EQ(batches[0].images[1][0][0][27].item<float>(), 2.0f);
  // An image of another size then fails, naming the file.
  testing::write_bytes(
      dir.path() / "2" / "b.png", testing::encode_png(testing::pattern_image(30, 28, 1)));
  const OpenedDataset mixed = open_dataset(source, Split::kTrain, 0);
  EXPECT_THROW(drain(mixed, 0, 4, {0, 1, 2, 3}, 0), DataError);
}

TEST(DatasetFactory, OpensEverySourceWithItsOutputShape) {
  DataSourceOptions synthetic;
  synthetic.source = "synthetic";
  synthetic.synthetic_image_shape = {3, 12, 10};
  synthetic.transforms = {{"RandomCrop", {{"size", {8}}}}, {"ToTensor", {}}};
  const OpenedDataset opened = open_dataset(synthetic, Split::kTrain, 3);
  EXPECT_EQ(opened.sample_shape, (std::vector<int64_t>{3, 8, 8}));
  EXPECT_EQ(opened.num_classes, 10);
  DataSourceOptions unknown;
  unknown.source = "airstore";
  EXPECT_THROW(open_dataset(unknown, Split::kTrain, 0), ConfigError);
  DataSourceOptions bad_name;
  bad_name.dataset_name = "ImageNet";
  EXPECT_THROW(open_dataset(bad_name, Split::kTrain, 0), ConfigError);
}

// ---- several views per sample (MultiViewPipeline) ---------------------------------------

std::shared_ptr<const ImageDataset>
multi_view_folder(const fs::path& root, MultiViewPipeline pipeline) {
  return std::make_shared<ImageDataset>(list_image_folder(root), std::move(pipeline));
}

MultiViewTransforms small_swav() {
  TransformSpec multicrop(
      "ImgPilToMultiCrop",
      {{"total_num_crops", {3}}, {"num_crops", {1, 2}}, {"size_crops", {16, 8}}});
  multicrop.nested_args["crop_scales"] = {{0.14, 1.0}, {0.05, 0.14}};
  return make_multi_view_transforms(
      {multicrop,
       {"RandomHorizontalFlip", {}},
       {"ImgPilColorDistortion", {{"strength", {1.0}}}},
       {"ToTensor", {}},
       {"Normalize", {{"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}}}});
}

std::vector<Batch> drain_views(
    const std::shared_ptr<const ImageDataset>& dataset,
    const TransformPipeline& per_batch,
    int64_t workers,
    int64_t batch_size,
    int64_t epoch) {
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.num_workers = workers;
  options.transforms = per_batch;
  options.seed = 5;
  DataLoader loader(dataset, options);
  loader.start_epoch(kOrder, epoch);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) {
    batches.push_back(std::move(*batch));
  }
  return batches;
}

TEST(ImageDataset, MultiViewBatchesHoldOneTensorPerCropInCropOrder) {
  TempDir dir;
  write_folder(dir.path());
  const MultiViewTransforms transforms = small_swav();
  const auto dataset = multi_view_folder(dir.path(), transforms.per_sample);
  EXPECT_EQ(
      dataset->view_shapes(),
      (std::vector<std::vector<int64_t>>{{3, 16, 16}, {3, 8, 8}, {3, 8, 8}}));
  const auto batches = drain_views(dataset, transforms.per_batch, 0, 5, 1);
  ASSERT_EQ(batches.size(), 3U);
  const Batch& first = batches[0];
  EXPECT_FALSE(first.images.defined());
  ASSERT_EQ(first.views.size(), 3U);
  EXPECT_EQ(first.views[0].sizes().vec(), (std::vector<int64_t>{5, 3, 16, 16}));
  EXPECT_EQ(first.views[1].sizes().vec(), (std::vector<int64_t>{5, 3, 8, 8}));
  EXPECT_EQ(first.views[2].sizes().vec(), (std::vector<int64_t>{5, 3, 8, 8}));
  EXPECT_EQ(first.views[0].scalar_type(), at::kFloat);
  EXPECT_EQ(first.labels.sizes().vec(), (std::vector<int64_t>{5}));
  EXPECT_EQ(first.labels[0].item<int64_t>(), 1); // sample 7 is bee/img3
  EXPECT_EQ(batches[2].views[0].size(0), 2);     // 12 samples in batches of 5

  // The loader's ToTensor + Normalize equal the per-batch pipeline on the dataset's uint8
  // views (the fused table is built by those transforms: exact).
  BatchRequest request;
  request.indices.assign(kOrder.begin(), kOrder.begin() + 5);
  request.seed = 5;
  request.epoch = 1;
  const Batch raw = dataset->load_batch(request);
  at::Generator unused = at::make_generator<at::CPUGeneratorImpl>(0);
  for (size_t k = 0; k < raw.views.size(); ++k) {
    EXPECT_EQ(raw.views[k].scalar_type(), at::kByte);
    EXPECT_TRUE(transforms.per_batch.apply(raw.views[k], unused).equal(first.views[k])) << k;
  }
}

TEST(ImageDataset, MultiViewSamplesDrawFromTheirOwnSeedForAnyWorkerCount) {
  TempDir dir;
  write_folder(dir.path());
  const MultiViewTransforms transforms = small_swav();
  const auto dataset = multi_view_folder(dir.path(), transforms.per_sample);
  const auto reference = drain_views(dataset, transforms.per_batch, 0, 5, 1);
  for (const int64_t workers : {1, 3}) {
    const auto batches = drain_views(dataset, transforms.per_batch, workers, 5, 1);
    ASSERT_EQ(batches.size(), reference.size());
    for (size_t b = 0; b < batches.size(); ++b) {
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_TRUE(batches[b].views[k].equal(reference[b].views[k]))
            << workers << " workers, batch " << b << ", view " << k;
      }
    }
  }
  // Sample 5 is row 4 of batch 0 by fives and row 0 of batch 1 by fours: the same views.
  const auto by_four = drain_views(dataset, transforms.per_batch, 1, 4, 1);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_TRUE(by_four[1].views[k][0].equal(reference[0].views[k][4])) << "view " << k;
  }
  // Another epoch draws other crops; so does another sample, and another crop of a sample.
  const auto next_epoch = drain_views(dataset, transforms.per_batch, 1, 5, 2);
  EXPECT_FALSE(next_epoch[0].views[0].equal(reference[0].views[0]));
  EXPECT_FALSE(reference[0].views[1][0].equal(reference[0].views[1][1]));
  EXPECT_FALSE(reference[0].views[1][0].equal(reference[0].views[2][0]));
}

TEST(ImageDataset, MultiViewLoaderRefusesBatchLevelCropsAndFlips) {
  TempDir dir;
  write_folder(dir.path());
  const auto dataset = multi_view_folder(dir.path(), small_swav().per_sample);
  DataLoaderOptions options;
  options.transforms = make_pipeline({{"ToTensor", {}}, {"RandomHorizontalFlip", {}}});
  try {
    DataLoader loader(dataset, options);
    ADD_FAILURE() << "a batch-level flip was accepted for a multi-view dataset";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("batch-level RandomHorizontalFlip"), std::string::npos)
        << error.what();
  }
}

} // namespace
} // namespace largo::data::image_dataset_test
