// In-memory images (CIFAR's stored tensor) through the per-sample pipeline: bit for bit what
// the same images written as PNG files give through ImageDataset with the same seed (the same
// transforms, the same draws), one view or several; VISSL's MNISTImgPil2RGB canvas; and
// open_dataset's routing: a list of batch transforms stays on the batch path.
#include "largo/data/in_memory_image_dataset.h"

#include <gtest/gtest.h>

#include "data/image_test_util.h"
#include "data/temp_dir.h"
#include "largo/core/error.h"
#include "largo/data/dataset_factory.h"
#include "largo/data/image_dataset.h"
#include "largo/data/synthetic_dataset.h"

namespace largo::data::in_memory_image_dataset_test {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr int64_t kNumImages = 6;
constexpr int64_t kSide = 32; // CIFAR's

// kNumImages distinct 32x32 RGB images, labels i % 3.
std::vector<Image> cifar_like_images() {
  std::vector<Image> images;
  for (int i = 0; i < kNumImages; ++i) {
    images.push_back(testing::pattern_image(kSide, kSide, i));
  }
  return images;
}

// As a CIFAR dataset stores them: [N, 3, h, w] uint8.
std::shared_ptr<const Dataset> stored(const std::vector<Image>& images) {
  std::vector<at::Tensor> planar;
  for (const Image& image : images) {
    planar.push_back(
        at::from_blob(
            const_cast<uint8_t*>(image.pixels.data()), {image.height, image.width, 3}, at::kByte)
            .permute({2, 0, 1}));
  }
  return std::make_shared<InMemoryDataset>(
      at::stack(planar).contiguous(), at::arange(kNumImages, at::kLong) % 3, 3);
}

// The same images as PNG files (lossless) in index order.
ImageList png_files(const std::vector<Image>& images, const fs::path& dir) {
  ImageList list;
  list.class_names = {"a", "b", "c"};
  for (size_t i = 0; i < images.size(); ++i) {
    const fs::path path = dir / ("img" + std::to_string(i) + ".png");
    testing::write_bytes(path, testing::encode_png(images[i]));
    list.paths.push_back(path.string());
    list.labels.push_back(static_cast<int64_t>(i) % 3);
  }
  return list;
}

BatchRequest request(uint64_t seed, int64_t epoch) {
  BatchRequest request;
  request.indices = {4, 0, 5, 1, 1, 3};
  request.seed = seed;
  request.epoch = epoch;
  return request;
}

std::vector<TransformSpec> specs(const std::string& json) {
  return testing::specs_of(nlohmann::json::parse(json));
}

const std::vector<std::string> kOneViewLists = {
    R"([{"name": "Resize", "size": 48}])",
    R"([{"name": "Resize", "size": [40, 24], "interpolation": "bicubic"},
        {"name": "CenterCrop", "size": 20}])",
    R"([{"name": "RandomResizedCrop", "size": 24}, {"name": "RandomHorizontalFlip"},
        {"name": "ColorJitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4,
         "hue": 0.1},
        {"name": "RandomGrayscale", "p": 0.3}, {"name": "GaussianBlur", "kernel_size": 3}])",
};

TEST(InMemoryImageDataset, EqualsTheSameImagesAsPngFilesThroughImageDataset) {
  TempDir dir;
  const std::vector<Image> images = cifar_like_images();
  const ImageList files = png_files(images, dir.path());
  const std::vector<std::pair<uint64_t, int64_t>> seeds_and_epochs = {{7, 0}, {7, 2}, {123, 1}};
  for (const std::string& list : kOneViewLists) {
    SCOPED_TRACE(list);
    const InMemoryImageDataset in_memory(
        stored(images), make_image_transforms(specs(list)).per_sample);
    const ImageDataset from_files(files, make_image_transforms(specs(list)).per_sample);
    ASSERT_EQ(in_memory.sample_shape(), from_files.sample_shape());
    // The random list draws: another epoch gives other crops (the comparison is not of
    // two unchanged copies).
    if (list.find("Random") != std::string::npos) {
      EXPECT_FALSE(in_memory.load_batch(request(7, 0))
                       .images.equal(in_memory.load_batch(request(7, 2)).images));
    }
    for (const auto& [seed, epoch] : seeds_and_epochs) {
      const Batch expected = from_files.load_batch(request(seed, epoch));
      const Batch batch = in_memory.load_batch(request(seed, epoch));
      EXPECT_TRUE(batch.images.equal(expected.images)) << "seed " << seed << " epoch " << epoch;
      EXPECT_TRUE(batch.labels.equal(expected.labels));
    }
  }
}

TEST(InMemoryImageDataset, SeveralViewsEqualTheSameImagesAsPngFiles) {
  TempDir dir;
  const std::vector<Image> images = cifar_like_images();
  const ImageList files = png_files(images, dir.path());
  const std::string simclr = R"([{"name": "ImgReplicatePil", "num_times": 2},
      {"name": "RandomResizedCrop", "size": 16}, {"name": "RandomHorizontalFlip"},
      {"name": "ImgPilColorDistortion", "strength": 0.5},
      {"name": "ImgPilGaussianBlur", "p": 0.5, "radius_min": 0.1, "radius_max": 2.0}])";
  const std::string swav = R"([{"name": "ImgPilToMultiCrop", "total_num_crops": 3,
      "num_crops": [1, 2], "size_crops": [24, 12], "crop_scales": [[0.3, 1.0], [0.1, 0.3]]},
      {"name": "RandomHorizontalFlip"}])";
  for (const std::string& list : {simclr, swav}) {
    SCOPED_TRACE(list);
    const InMemoryImageDataset in_memory(
        stored(images), make_multi_view_transforms(specs(list)).per_sample);
    const ImageDataset from_files(files, make_multi_view_transforms(specs(list)).per_sample);
    ASSERT_EQ(in_memory.view_shapes(), from_files.view_shapes());
    const Batch expected = from_files.load_batch(request(11, 3));
    const Batch batch = in_memory.load_batch(request(11, 3));
    ASSERT_EQ(batch.views.size(), expected.views.size());
    for (size_t k = 0; k < batch.views.size(); ++k) {
      EXPECT_TRUE(batch.views[k].equal(expected.views[k])) << "view " << k;
    }
    EXPECT_TRUE(batch.labels.equal(expected.labels));
  }
}

// MNIST: [N, 1, 28, 28] gray, pasted at (2, 2) on a black 32x32 RGB canvas as R = G = B.
TEST(InMemoryImageDataset, MnistImgPil2RgbPastesTheGrayImageOnABlackCanvas) {
  const at::Tensor gray = at::randint(1, 256, {2, 1, 28, 28}, at::kByte);
  auto mnist = std::make_shared<InMemoryDataset>(gray, at::tensor({3, 7}, at::kLong), 10);
  const RgbCanvas canvas =
      RgbCanvas::from_spec({"MNISTImgPil2RGB", {{"size", {32}}, {"box", {2, 2}}}});
  const InMemoryImageDataset dataset(mnist, SamplePipeline{}, canvas);
  EXPECT_EQ(dataset.sample_shape(), (std::vector<int64_t>{3, 32, 32}));
  const at::Tensor images = dataset.get_batch({1, 0}).images; // [2, 3, 32, 32]
  at::Tensor expected = at::zeros({2, 3, 32, 32}, at::kByte);
  expected.slice(2, 2, 30).slice(3, 2, 30).copy_(gray.index_select(0, at::tensor({1, 0})));
  EXPECT_TRUE(images.equal(expected));
}

TEST(InMemoryImageDataset, GrayImagesWithoutACanvasAreRefusedNamingMnistImgPil2Rgb) {
  auto mnist = std::make_shared<InMemoryDataset>(
      at::zeros({1, 1, 28, 28}, at::kByte), at::zeros({1}, at::kLong), 10);
  try {
    const InMemoryImageDataset dataset(mnist, SamplePipeline{});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what()).find("MNISTImgPil2RGB"), std::string::npos) << error.what();
  }
}

DataSourceOptions synthetic_source(const std::string& transforms) {
  DataSourceOptions source;
  source.source = "synthetic";
  source.synthetic_num_samples = 10;
  source.synthetic_image_shape = {3, 32, 32};
  source.transforms = specs(transforms);
  return source;
}

TEST(OpenDataset, InMemoryListWithPerSampleTransformsRunsThePerSamplePipeline) {
  const DataSourceOptions source = synthetic_source(
      R"([{"name": "Resize", "size": 40}, {"name": "CenterCrop", "size": 36}, {"name": "ToTensor"},
          {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}])");
  const OpenedDataset opened = open_dataset(source, Split::kTrain, /*seed=*/5);
  EXPECT_EQ(opened.sample_shape, (std::vector<int64_t>{3, 36, 36}));
  EXPECT_EQ(peek_dataset_shape(source).sample_shape, opened.sample_shape);
  EXPECT_EQ(opened.transforms.transforms().size(), 2U); // ToTensor, Normalize per batch
  const auto synthetic =
      std::make_shared<SyntheticDataset>(10, std::vector<int64_t>{3, 32, 32}, 10, /*seed=*/5);
  const InMemoryImageDataset expected(
      synthetic, make_image_transforms(source.transforms).per_sample);
  EXPECT_TRUE(opened.dataset->load_batch(request(3, 1))
                  .images.equal(expected.load_batch(request(3, 1)).images));
}

TEST(OpenDataset, InMemoryListOfBatchTransformsKeepsTheBatchPath) {
  const DataSourceOptions source = synthetic_source(
      R"([{"name": "RandomCrop", "size": 28, "padding": 2}, {"name": "RandomHorizontalFlip"},
          {"name": "ToTensor"}])");
  const OpenedDataset opened = open_dataset(source, Split::kTrain, 5);
  EXPECT_NE(dynamic_cast<const SyntheticDataset*>(opened.dataset.get()), nullptr);
  EXPECT_EQ(opened.transforms.transforms().size(), 3U);
  EXPECT_EQ(opened.sample_shape, (std::vector<int64_t>{3, 28, 28}));
}

TEST(OpenDataset, InMemoryMultiViewListDeliversViews) {
  const DataSourceOptions source = synthetic_source(
      R"([{"name": "ImgReplicatePil", "num_times": 2}, {"name": "RandomResizedCrop", "size": 16},
          {"name": "ToTensor"}])");
  const OpenedDataset opened = open_dataset(source, Split::kTrain, 5);
  EXPECT_EQ(opened.view_shapes, (std::vector<std::vector<int64_t>>{{3, 16, 16}, {3, 16, 16}}));
  EXPECT_EQ(peek_dataset_shape(source).view_shapes, opened.view_shapes);
  EXPECT_EQ(opened.dataset->load_batch(request(1, 0)).views.size(), 2U);
}

TEST(OpenDataset, InMemoryPerSampleListsKeepTheImageFileRules) {
  // A RandomCrop before ToTensor in a per-sample list crops each image, as for image files.
  const DataSourceOptions source = synthetic_source(
      R"([{"name": "Resize", "size": 40}, {"name": "RandomCrop", "size": 32},
          {"name": "ToTensor"}])");
  EXPECT_EQ(peek_dataset_shape(source).sample_shape, (std::vector<int64_t>{3, 32, 32}));
  EXPECT_EQ(open_dataset(source, Split::kTrain, 5).sample_shape, (std::vector<int64_t>{3, 32, 32}));
  // MNISTImgPil2RGB makes the stored image RGB: first or not at all.
  const DataSourceOptions late = synthetic_source(
      R"([{"name": "Resize", "size": 40}, {"name": "MNISTImgPil2RGB"}, {"name": "ToTensor"}])");
  EXPECT_THROW(open_dataset(late, Split::kTrain, 5), ConfigError);
}

} // namespace
} // namespace largo::data::in_memory_image_dataset_test
