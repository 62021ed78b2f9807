// open_dataset / peek_dataset_shape with transform lists that make several views per sample
// (SwAV's multi-crop, SimCLR's pair): image files become a multi-view ImageDataset whose
// loader delivers Batch::views of the shapes the factory announces; every other source
// refuses such a list before reading a file.
#include "largo/data/dataset_factory.h"

#include <gtest/gtest.h>

#include <fstream>
#include <tuple>

#include "data/image_test_util.h"
#include "data/temp_dir.h"
#include "largo/core/error.h"
#include "largo/data/data_loader.h"
#include "largo/data/npy.h"

namespace largo::data::dataset_factory_test {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using Shapes = std::vector<std::vector<int64_t>>;

// 2 classes x 3 PNG images of 40x40.
void write_small_folder(const fs::path& root) {
  int seed = 0;
  for (const std::string label : {"cat", "dog"}) {
    fs::create_directories(root / label);
    for (int i = 0; i < 3; ++i, ++seed) {
      testing::write_bytes(
          root / label / ("img" + std::to_string(i) + ".png"),
          testing::encode_png(testing::pattern_image(40, 40, seed)));
    }
  }
}

const TransformSpec kNormalize{
    "Normalize", {{"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}}};

// SwAV's list in small: 2 crops of 32 and 2 of 16.
std::vector<TransformSpec> small_multi_crop() {
  TransformSpec multicrop(
      "ImgPilToMultiCrop",
      {{"total_num_crops", {4}}, {"num_crops", {2, 2}}, {"size_crops", {32, 16}}});
  multicrop.nested_args["crop_scales"] = {{0.5, 1.0}, {0.1, 0.5}};
  return {
      multicrop,
      {"RandomHorizontalFlip", {{"p", {0.5}}}},
      {"ImgPilColorDistortion", {{"strength", {1.0}}}},
      {"ToTensor", {}},
      kNormalize};
}

// SimCLR's list in small: two copies, each cropped to 24.
std::vector<TransformSpec> small_pair() {
  return {
      {"ImgReplicatePil", {{"num_times", {2}}}},
      {"RandomResizedCrop", {{"size", {24}}}},
      {"RandomHorizontalFlip", {}},
      {"ToTensor", {}},
      kNormalize};
}

std::vector<Batch> drain_all(const OpenedDataset& opened, int64_t batch_size, int64_t workers) {
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.num_workers = workers;
  options.transforms = opened.transforms;
  DataLoader loader(opened.dataset, options);
  loader.start_epoch({0, 1, 2, 3, 4, 5}, 0);
  std::vector<Batch> batches;
  while (auto batch = loader.next()) {
    batches.push_back(std::move(*batch));
  }
  return batches;
}

TEST(DatasetFactory, MultiCropImageFolderDeliversOneBatchPerCrop) {
  TempDir dir;
  write_small_folder(dir.path());
  DataSourceOptions source;
  source.source = "disk_folder";
  source.path = dir.path();
  source.transforms = small_multi_crop();
  const Shapes expected{{3, 32, 32}, {3, 32, 32}, {3, 16, 16}, {3, 16, 16}};

  const DatasetShape peeked = peek_dataset_shape(source);
  EXPECT_EQ(peeked.view_shapes, expected);
  EXPECT_EQ(peeked.sample_shape, expected[0]);
  EXPECT_EQ(peeked.num_classes, 2);

  const OpenedDataset opened = open_dataset(source, Split::kTrain, 0);
  EXPECT_EQ(opened.view_shapes, expected);
  EXPECT_EQ(opened.sample_shape, expected[0]);
  EXPECT_EQ(opened.num_classes, 2);
  const std::vector<Batch> batches = drain_all(opened, 4, 1);
  ASSERT_EQ(batches.size(), 2U); // 6 samples in batches of 4
  for (size_t b = 0; b < batches.size(); ++b) {
    const int64_t rows = b == 0 ? 4 : 2;
    const Batch& batch = batches[b];
    EXPECT_FALSE(batch.images.defined());
    ASSERT_EQ(batch.views.size(), expected.size());
    for (size_t k = 0; k < expected.size(); ++k) {
      std::vector<int64_t> shape{rows};
      shape.insert(shape.end(), expected[k].begin(), expected[k].end());
      EXPECT_EQ(batch.views[k].sizes().vec(), shape) << "batch " << b << ", view " << k;
      EXPECT_EQ(batch.views[k].scalar_type(), at::kFloat);
    }
    EXPECT_EQ(batch.labels.size(0), rows);
  }
  // Normalized, not left in [0, 1]: the per-batch Normalize reached every view.
  EXPECT_LT(batches[0].views[3].min().item<float>(), 0.0F);
}

TEST(DatasetFactory, ReplicatedPairFromAFileListHasTwoViewsOfOneSize) {
  TempDir dir;
  write_small_folder(dir.path() / "tree");
  const ImageList folder = list_image_folder(dir.path() / "tree");
  write_npy_strings(dir.path() / "paths.npy", folder.paths);
  write_npy(dir.path() / "labels.npy", at::tensor(folder.labels, at::kLong));
  DataSourceOptions source;
  source.source = "disk_filelist";
  source.path = dir.path() / "paths.npy";
  source.label_path = dir.path() / "labels.npy";
  source.transforms = small_pair();
  const Shapes expected{{3, 24, 24}, {3, 24, 24}};

  const DatasetShape peeked = peek_dataset_shape(source);
  EXPECT_EQ(peeked.view_shapes, expected);
  EXPECT_EQ(peeked.num_classes, 2);
  const OpenedDataset opened = open_dataset(source, Split::kTrain, 0);
  EXPECT_EQ(opened.view_shapes, expected);
  const std::vector<Batch> batches = drain_all(opened, 3, 0);
  ASSERT_EQ(batches.size(), 2U);
  ASSERT_EQ(batches[0].views.size(), 2U);
  EXPECT_EQ(batches[0].views[1].sizes().vec(), (std::vector<int64_t>{3, 3, 24, 24}));
  // Two independent crops of each image, not one crop twice.
  EXPECT_FALSE(batches[0].views[0].equal(batches[0].views[1]));
}

// VISSL's self-supervised configs on unlabeled file lists (LABEL_SOURCES [], LABEL_TYPE
// sample_index) read no label file: the labels are the indices; any other label type needs
// the file.
TEST(DatasetFactory, FileListWithoutLabelsGivesSampleIndexLabelsOnly) {
  TempDir dir;
  write_small_folder(dir.path() / "tree");
  write_npy_strings(dir.path() / "paths.npy", list_image_folder(dir.path() / "tree").paths);
  DataSourceOptions source;
  source.source = "disk_filelist";
  source.path = dir.path() / "paths.npy";
  source.label_type = "sample_index";
  source.transforms = small_pair();
  EXPECT_EQ(peek_dataset_shape(source).view_shapes, (Shapes{{3, 24, 24}, {3, 24, 24}}));
  const std::vector<Batch> batches = drain_all(open_dataset(source, Split::kTrain, 0), 4, 0);
  ASSERT_EQ(batches.size(), 2U);
  EXPECT_TRUE(batches[0].labels.equal(at::arange(4, at::kLong)));
  EXPECT_TRUE(batches[1].labels.equal(at::arange(4, 6, at::kLong)));
  source.label_type = "standard";
  EXPECT_THROW(peek_dataset_shape(source), ConfigError);
  EXPECT_THROW(open_dataset(source, Split::kTrain, 0), ConfigError);
}

TEST(DatasetFactory, OneViewSourcesAnnounceNoViews) {
  DataSourceOptions synthetic;
  synthetic.source = "synthetic";
  synthetic.synthetic_num_samples = 4;
  EXPECT_TRUE(peek_dataset_shape(synthetic).view_shapes.empty());
  EXPECT_TRUE(open_dataset(synthetic, Split::kTrain, 0).view_shapes.empty());
}

// The views of an in-memory dataset are cut from each stored image (in_memory_image_dataset.h),
// which must be RGB: a gray one (MNIST) needs MNISTImgPil2RGB, refused before any file is read.
TEST(DatasetFactory, InMemoryMultiViewListsNeedRgbImages) {
  DataSourceOptions synthetic;
  synthetic.source = "synthetic";
  synthetic.transforms = small_multi_crop();
  EXPECT_EQ(
      peek_dataset_shape(synthetic).view_shapes,
      (std::vector<std::vector<int64_t>>{{3, 32, 32}, {3, 32, 32}, {3, 16, 16}, {3, 16, 16}}));
  DataSourceOptions mnist; // a path that does not exist: refused before any file is read
  mnist.source = "torchvision_dataset";
  mnist.dataset_name = "MNIST";
  mnist.path = "/nonexistent/mnist";
  mnist.transforms = small_pair();
  for (const bool peek : {true, false}) {
    try {
      if (peek) {
        peek_dataset_shape(mnist);
      } else {
        open_dataset(mnist, Split::kTrain, 0);
      }
      ADD_FAILURE() << "accepted (peek: " << peek << ")";
    } catch (const ConfigError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("MNISTImgPil2RGB"), std::string::npos) << message;
    }
  }
}

// The torchvision datasets' shapes are known before any file is read (the model is planned
// from them), and a name torchvision does not have is refused listing the ones Largo reads.
TEST(DatasetFactory, TorchvisionDatasetsHaveTheirShapesBeforeAnyFileIsRead) {
  const std::vector<std::tuple<std::string, std::vector<int64_t>, int64_t>> expected{
      {"MNIST", {1, 28, 28}, 10},
      {"FashionMNIST", {1, 28, 28}, 10},
      {"CIFAR10", {3, 32, 32}, 10},
      {"CIFAR100", {3, 32, 32}, 100},
      {"STL10", {3, 96, 96}, 10},
      {"SVHN", {3, 32, 32}, 10}};
  EXPECT_EQ(torchvision_dataset_names().size(), expected.size());
  for (const auto& [name, shape, classes] : expected) {
    SCOPED_TRACE(name);
    DataSourceOptions source;
    source.dataset_name = name;
    source.path = "/nonexistent";
    const DatasetShape peeked = peek_dataset_shape(source);
    EXPECT_EQ(peeked.sample_shape, shape);
    EXPECT_EQ(peeked.num_classes, classes);
  }
  DataSourceOptions places;
  places.dataset_name = "Places365";
  try {
    peek_dataset_shape(places);
    FAIL() << "Places365 accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(
        std::string(error.what()).find("MNIST, FashionMNIST, CIFAR10, CIFAR100, STL10 or SVHN"),
        std::string::npos)
        << error.what();
  }
}

TEST(DatasetFactory, OpensCifar100FromItsBinaryFile) {
  TempDir dir;
  std::string record(3074, '\x07');
  record[0] = 4;  // coarse label
  record[1] = 42; // fine label
  std::ofstream(dir.path() / "test.bin", std::ios::binary) << record << record;
  DataSourceOptions source;
  source.dataset_name = "CIFAR100";
  source.path = dir.path();
  const OpenedDataset opened = open_dataset(source, Split::kTest, 0);
  ASSERT_EQ(opened.dataset->size(), 2);
  EXPECT_EQ(opened.num_classes, 100);
  EXPECT_EQ(opened.dataset->labels()[1].item<int64_t>(), 42);
  EXPECT_EQ(opened.dataset->images().sum().item<int64_t>(), 2 * 3072 * 7);
}

} // namespace
} // namespace largo::data::dataset_factory_test
