// The in-memory dataset's batch gathering and validation, and the synthetic dataset.
#include "largo/data/dataset.h"

#include <gtest/gtest.h>

#include "largo/core/error.h"
#include "largo/data/synthetic_dataset.h"

namespace largo::data::dataset_test {
namespace {

// 5 images [1, 2, 2] where every pixel of image n equals n.
InMemoryDataset five_images() {
  at::Tensor images = at::arange(5, at::kByte).view({5, 1, 1, 1}).expand({5, 1, 2, 2}).clone();
  return InMemoryDataset(images, at::tensor({0, 1, 2, 0, 1}, at::kLong), 3);
}

TEST(InMemoryDataset, GetBatchGathersInTheGivenOrderWithRepeats) {
  const InMemoryDataset dataset = five_images();
  const Batch batch = dataset.get_batch({4, 0, 4, 2});
  ASSERT_EQ(batch.images.sizes().vec(), (std::vector<int64_t>{4, 1, 2, 2}));
  EXPECT_EQ(batch.images.scalar_type(), at::kByte);
  EXPECT_TRUE(batch.images.select(1, 0).select(1, 1).select(1, 0).equal(
      at::tensor({4, 0, 4, 2}, at::kByte)));
  EXPECT_TRUE(batch.labels.equal(at::tensor({1, 0, 1, 2}, at::kLong)));
  EXPECT_EQ(dataset.get_batch({}).images.size(0), 0);
}

TEST(InMemoryDataset, IndexOutOfRangeIsADataError) {
  const InMemoryDataset dataset = five_images();
  EXPECT_THROW(dataset.get_batch({0, 5}), DataError);
  EXPECT_THROW(dataset.get_batch({-1}), DataError);
}

TEST(InMemoryDataset, RejectsBadTensors) {
  const at::Tensor images = at::zeros({2, 1, 2, 2}, at::kByte);
  EXPECT_THROW(InMemoryDataset(images.to(at::kFloat), at::zeros({2}, at::kLong), 2), DataError);
  EXPECT_THROW(InMemoryDataset(images, at::zeros({3}, at::kLong), 2), DataError);
  EXPECT_THROW(InMemoryDataset(images, at::tensor({0, 2}, at::kLong), 2), DataError);
  EXPECT_THROW(InMemoryDataset(images, at::tensor({-1, 0}, at::kLong), 2), DataError);
}

TEST(Split, ParsesNames) {
  EXPECT_EQ(parse_split("train"), Split::kTrain);
  EXPECT_EQ(parse_split("test"), Split::kTest);
  EXPECT_THROW(parse_split("val"), ConfigError);
}

TEST(SyntheticDataset, SamplesDependOnlyOnSeedAndIndex) {
  const SyntheticDataset dataset(1'000'000'000, {3, 8, 5}, 7, /*seed=*/11);
  EXPECT_EQ(dataset.size(), 1'000'000'000);
  EXPECT_EQ(dataset.sample_shape(), (std::vector<int64_t>{3, 8, 5}));
  const Batch a = dataset.get_batch({5, 999'999'999, 17});
  const Batch b = dataset.get_batch({17, 5});
  ASSERT_EQ(a.images.sizes().vec(), (std::vector<int64_t>{3, 3, 8, 5}));
  EXPECT_TRUE(a.images[0].equal(b.images[1]));
  EXPECT_TRUE(a.images[2].equal(b.images[0]));
  EXPECT_EQ(a.labels[0].item<int64_t>(), b.labels[1].item<int64_t>());
  EXPECT_FALSE(a.images[0].equal(a.images[2]));
  const SyntheticDataset other_seed(1'000'000'000, {3, 8, 5}, 7, /*seed=*/12);
  EXPECT_FALSE(other_seed.get_batch({5}).images[0].equal(a.images[0]));
}

TEST(SyntheticDataset, ValuesCoverTheirRanges) {
  const SyntheticDataset dataset(4096, {1, 16, 16}, 10, 0);
  std::vector<int64_t> all(4096);
  for (int64_t i = 0; i < 4096; ++i) {
    all[static_cast<size_t>(i)] = i;
  }
  const Batch batch = dataset.get_batch(all);
  EXPECT_EQ(batch.images.min().item<int64_t>(), 0);
  EXPECT_EQ(batch.images.max().item<int64_t>(), 255);
  // Uniform bytes: mean 127.5, and with ~1M samples the mean is within 0.5 of it.
  EXPECT_NEAR(batch.images.to(at::kDouble).mean().item<double>(), 127.5, 0.5);
  const at::Tensor counts = at::bincount(batch.labels, {}, 10);
  EXPECT_EQ(counts.size(0), 10);
  EXPECT_GT(counts.min().item<int64_t>(), 300); // ~410 expected per class
}

TEST(SyntheticDataset, RejectsBadArguments) {
  EXPECT_THROW(SyntheticDataset(-1, {1, 2, 2}, 2), ConfigError);
  EXPECT_THROW(SyntheticDataset(10, {2, 2}, 2), ConfigError);
  EXPECT_THROW(SyntheticDataset(10, {1, 0, 2}, 2), ConfigError);
  EXPECT_THROW(SyntheticDataset(10, {1, 2, 2}, 0), ConfigError);
  EXPECT_THROW(SyntheticDataset(10, {1, 2, 2}, 2).get_batch({10}), DataError);
}

} // namespace
} // namespace largo::data::dataset_test
