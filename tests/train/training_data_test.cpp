// TrainingData with a multi-view training split: it announces each view's shape, and its
// training loader delivers Batch::views of those shapes for this rank's epoch order.
#include <largo/train/training_data.h>

#include <gtest/gtest.h>

#include "data/image_test_util.h"
#include "data/temp_dir.h"

namespace largo::train::training_data_test {
namespace {

namespace fs = std::filesystem;
using Shapes = std::vector<std::vector<int64_t>>;

// 2 classes x 3 PNG images of 40x40.
void write_image_folder(const fs::path& root) {
  int seed = 0;
  for (const std::string label : {"cat", "dog"}) {
    fs::create_directories(root / label);
    for (int i = 0; i < 3; ++i, ++seed) {
      data::testing::write_bytes(
          root / label / ("img" + std::to_string(i) + ".png"),
          data::testing::encode_png(data::testing::pattern_image(40, 40, seed)));
    }
  }
}

TrainerOptions multi_crop_options(const fs::path& images) {
  TrainerOptions options;
  options.train.source.source = "disk_folder";
  options.train.source.path = images;
  data::TransformSpec multicrop(
      "ImgPilToMultiCrop",
      {{"total_num_crops", {4}}, {"num_crops", {2, 2}}, {"size_crops", {32, 16}}});
  multicrop.nested_args["crop_scales"] = {{0.5, 1.0}, {0.1, 0.5}};
  options.train.source.transforms = {multicrop, {"RandomHorizontalFlip", {}}, {"ToTensor", {}}};
  options.train.collate = "multicrop_collator";
  options.train.batch_size = 4;
  options.test.source.source = "synthetic";
  options.test.source.synthetic_num_samples = 4;
  options.test.batch_size = 4;
  options.loading.num_workers = 1;
  return options;
}

TEST(TrainingData, MultiCropSplitAnnouncesItsViewsAndTheLoaderDeliversThem) {
  data::testing::TempDir dir;
  write_image_folder(dir.path());
  TrainingData data(multi_crop_options(dir.path()), /*rank=*/0, /*world_size=*/1);
  const Shapes expected{{3, 32, 32}, {3, 32, 32}, {3, 16, 16}, {3, 16, 16}};
  EXPECT_EQ(data.train_view_shapes(), expected);
  EXPECT_EQ(data.train_sample_shape(), expected[0]);
  EXPECT_EQ(data.iterations_per_epoch(), 2); // 6 samples in batches of 4

  data::DataLoader& loader = data.train_loader();
  loader.start_epoch(data.train_epoch_order(0), 0);
  const std::optional<data::Batch> batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->views.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    std::vector<int64_t> shape{4};
    shape.insert(shape.end(), expected[k].begin(), expected[k].end());
    EXPECT_EQ(batch->views[k].sizes().vec(), shape) << "view " << k;
  }
  EXPECT_EQ(batch->labels.size(0), 4);
}

TEST(TrainingData, OneViewSplitsAnnounceNoViews) {
  TrainerOptions options;
  options.train.source.source = "synthetic";
  options.train.source.synthetic_num_samples = 8;
  options.train.batch_size = 4;
  options.test = options.train;
  TrainingData data(options, 0, 1);
  EXPECT_TRUE(data.train_view_shapes().empty());
  EXPECT_EQ(data.train_sample_shape(), (std::vector<int64_t>{3, 32, 32}));
}

} // namespace
} // namespace largo::train::training_data_test
