// A WebDataset through the DataLoader as a training run reads it: each rank's loader threads
// deliver their streams' batches, every sample once an epoch over 2 ranks x 2 threads, and an
// epoch restarted at batch k delivers what the uninterrupted epoch delivered from k on.
#include <algorithm>
#include <numeric>

#include <gtest/gtest.h>

#include "data/tar_test_util.h"
#include "data/temp_dir.h"
#include "largo/data/data_loader.h"
#include "largo/data/dataset_factory.h"
#include "largo/data/webdataset_sampler.h"

namespace largo::data::webdataset_loading_test {
namespace {

OpenedDataset open_shards(const std::filesystem::path& dir) {
  DataSourceOptions source;
  source.source = "webdataset";
  source.path = dir / "shard-{000000..000007}.tar";
  source.transforms = {
      {"RandomResizedCrop", {{"size", {6}}}}, {"RandomHorizontalFlip", {}}, {"ToTensor", {}}};
  return open_dataset(source, Split::kTrain, 0);
}

std::unique_ptr<DataLoader> make_loader(const OpenedDataset& opened, int64_t workers) {
  DataLoaderOptions options;
  options.batch_size = 4;
  options.num_workers = workers;
  options.transforms = opened.transforms;
  options.seed = 5;
  return std::make_unique<DataLoader>(opened.dataset, options);
}

WebDatasetSampler sampler_for(const OpenedDataset& opened, int64_t rank, int64_t epoch) {
  WebDatasetSamplerOptions order;
  order.num_replicas = 2;
  order.rank = rank;
  order.streams_per_replica = 2;
  order.batch_size = 4;
  order.shuffle_buffer = 5;
  order.seed = 5;
  WebDatasetSampler sampler(opened.shard_sizes, order);
  sampler.set_epoch(epoch);
  return sampler;
}

TEST(WebDatasetLoading, TwoRanksOfTwoThreadsDeliverEverySampleOnceAnEpoch) {
  testing::TempDir dir;
  testing::write_labelled_shards(dir.path(), 8, 6); // 48 samples, label = sample number
  const OpenedDataset opened = open_shards(dir.path());
  EXPECT_EQ(opened.num_classes, 48);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> labels;
    for (int64_t rank = 0; rank < 2; ++rank) {
      auto loader = make_loader(opened, 2);
      const WebDatasetSampler sampler = sampler_for(opened, rank, epoch);
      loader->start_epoch(sampler.indices(), epoch);
      while (auto batch = loader->next()) {
        const auto* data = batch->labels.data_ptr<int64_t>();
        labels.insert(labels.end(), data, data + batch->labels.size(0));
        EXPECT_EQ(batch->images.sizes(), (at::IntArrayRef{4, 3, 6, 6}));
      }
    }
    std::sort(labels.begin(), labels.end());
    std::vector<int64_t> expected(48);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(labels, expected) << "epoch " << epoch;
  }
}

TEST(WebDatasetLoading, AnEpochResumedAtBatchKDeliversTheRestOfTheUninterruptedOne) {
  testing::TempDir dir;
  testing::write_labelled_shards(dir.path(), 8, 6);
  const OpenedDataset opened = open_shards(dir.path());
  const std::vector<int64_t> order = sampler_for(opened, 1, 3).indices(); // 24 samples, 6 batches
  auto uninterrupted = make_loader(opened, 2);
  uninterrupted->start_epoch(order, 3);
  std::vector<Batch> full;
  while (auto batch = uninterrupted->next()) {
    full.push_back(*batch);
  }
  ASSERT_EQ(full.size(), 6u);
  // The resumed run re-derives the order (a pure function) and starts at batch 3: nothing is
  // read twice, nothing skipped, and the crops are the same draws.
  auto resumed = make_loader(opened, 2);
  resumed->start_epoch(sampler_for(opened, 1, 3).indices(), 3, /*start_batch=*/3);
  for (size_t k = 3; k < full.size(); ++k) {
    auto batch = resumed->next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_TRUE(batch->labels.equal(full[k].labels)) << "batch " << k;
    EXPECT_TRUE(batch->images.equal(full[k].images)) << "batch " << k;
  }
  EXPECT_FALSE(resumed->next().has_value());
}

} // namespace
} // namespace largo::data::webdataset_loading_test
