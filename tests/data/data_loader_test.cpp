// The loader's reproducibility contract (same batches for any worker count and after a
// mid-epoch restart), drop_last, error propagation, shutdown and
// the channels-last layout.
#include "largo/data/data_loader.h"

#include <numeric>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "largo/core/channels_last.h"
#include "largo/core/error.h"
#include "largo/data/sampler.h"

namespace largo::data::data_loader_test {
namespace {

constexpr int64_t kNumSamples = 50;

std::shared_ptr<const Dataset> small_dataset() {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(123);
  at::Tensor images = at::randint(0, 256, {kNumSamples, 2, 6, 6}, gen, at::kByte);
  at::Tensor labels = at::arange(kNumSamples, at::kLong).remainder(10);
  return std::make_shared<InMemoryDataset>(images, labels, 10);
}

TransformPipeline augmentations() {
  return make_pipeline({
      {"RandomCrop", {{"size", {6}}, {"padding", {2}}}},
      {"RandomHorizontalFlip", {}},
      {"ToTensor", {}},
      {"Normalize", {{"mean", {0.5, 0.4}}, {"std", {0.2, 0.3}}}},
  });
}

DataLoaderOptions options(int64_t num_workers, int64_t prefetch_batches = 2) {
  DataLoaderOptions opts;
  opts.batch_size = 8;
  opts.num_workers = num_workers;
  opts.prefetch_batches = prefetch_batches;
  opts.transforms = augmentations();
  opts.seed = 77;
  return opts;
}

std::vector<int64_t> epoch_order(int64_t epoch) {
  DistributedSampler sampler(kNumSamples, 1, 0, /*shuffle=*/true, /*seed=*/9);
  sampler.set_epoch(epoch);
  return sampler.indices();
}

std::vector<Batch> drain(DataLoader& loader) {
  std::vector<Batch> batches;
  while (auto batch = loader.next()) {
    batches.push_back(std::move(*batch));
  }
  return batches;
}

void expect_same_batches(
    const std::vector<Batch>& a, const std::vector<Batch>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(a[k].images.equal(b[k].images)) << what << ": batch " << k;
    EXPECT_TRUE(a[k].labels.equal(b[k].labels)) << what << ": batch " << k;
  }
}

TEST(DataLoader, DeliversTransformedFloatBatchesInIndexOrder) {
  const auto dataset = small_dataset();
  DataLoader loader(dataset, options(0));
  const auto order = epoch_order(0);
  loader.start_epoch(order, 0);
  EXPECT_EQ(loader.num_batches(), 7);
  const auto batches = drain(loader);
  ASSERT_EQ(batches.size(), 7U);
  for (size_t k = 0; k < batches.size(); ++k) {
    const int64_t expected_size = k < 6 ? 8 : 2;
    EXPECT_EQ(batches[k].images.sizes().vec(), (std::vector<int64_t>{expected_size, 2, 6, 6}));
    EXPECT_EQ(batches[k].images.scalar_type(), at::kFloat);
    for (int64_t i = 0; i < expected_size; ++i) {
      EXPECT_EQ(batches[k].labels[i].item<int64_t>(), order[k * 8 + i] % 10);
    }
  }
  EXPECT_FALSE(loader.next().has_value()); // stays finished
}

TEST(DataLoader, SameBatchesForAnyNumberOfWorkers) {
  const auto dataset = small_dataset();
  DataLoader serial(dataset, options(0));
  serial.start_epoch(epoch_order(1), 1);
  const auto reference = drain(serial);
  for (int64_t num_workers : {1, 3}) {
    for (int64_t prefetch : {1, 2}) {
      DataLoader loader(dataset, options(num_workers, prefetch));
      loader.start_epoch(epoch_order(1), 1);
      expect_same_batches(
          reference,
          drain(loader),
          "num_workers " + std::to_string(num_workers) + " prefetch " + std::to_string(prefetch));
    }
  }
}

TEST(DataLoader, AugmentationDependsOnSeedAndEpoch) {
  const auto dataset = small_dataset();
  const auto order = epoch_order(0);
  DataLoader loader(dataset, options(0));
  loader.start_epoch(order, 0);
  const at::Tensor epoch0 = loader.next()->images;
  loader.start_epoch(order, 1);
  const at::Tensor epoch1 = loader.next()->images;
  EXPECT_FALSE(epoch0.equal(epoch1));
  DataLoaderOptions other_seed = options(0);
  other_seed.seed = 78;
  DataLoader other(dataset, other_seed);
  other.start_epoch(order, 0);
  EXPECT_FALSE(other.next()->images.equal(epoch0));
}

TEST(DataLoader, RestartAtStartBatchGivesTheTailOfTheFullEpoch) {
  const auto dataset = small_dataset();
  DataLoader full(dataset, options(0));
  full.start_epoch(epoch_order(2), 2);
  const auto reference = drain(full);
  for (int64_t num_workers : {0, 2}) {
    for (int64_t start_batch : {1, 4, 6, 7}) {
      DataLoader loader(dataset, options(num_workers));
      loader.start_epoch(epoch_order(2), 2, start_batch);
      EXPECT_EQ(loader.next_batch_index(), start_batch);
      expect_same_batches(
          std::vector<Batch>(reference.begin() + start_batch, reference.end()),
          drain(loader),
          "workers " + std::to_string(num_workers) + " start " + std::to_string(start_batch));
    }
  }
  DataLoader loader(dataset, options(0));
  EXPECT_THROW(loader.start_epoch(epoch_order(2), 2, 8), ConfigError);
  EXPECT_THROW(loader.start_epoch(epoch_order(2), 2, -1), ConfigError);
}

TEST(DataLoader, DropLastDropsOnlyTheShortBatch) {
  const auto dataset = small_dataset();
  for (int64_t num_workers : {0, 2}) {
    DataLoaderOptions opts = options(num_workers);
    opts.drop_last = true;
    DataLoader loader(dataset, opts);
    loader.start_epoch(epoch_order(0), 0);
    EXPECT_EQ(loader.num_batches(), 6);
    const auto batches = drain(loader);
    ASSERT_EQ(batches.size(), 6U);
    for (const Batch& batch : batches) {
      EXPECT_EQ(batch.images.size(0), 8);
    }
    // 48 indices divide evenly: nothing is dropped.
    auto order = epoch_order(0);
    order.resize(48);
    loader.start_epoch(order, 0);
    EXPECT_EQ(loader.num_batches(), 6);
  }
}

TEST(DataLoader, WithoutTransformsBytesBecomeUnitFloats) {
  const auto dataset = small_dataset();
  DataLoaderOptions opts;
  opts.batch_size = 5;
  DataLoader loader(dataset, opts);
  loader.start_epoch({3, 1}, 0);
  const Batch batch = *loader.next();
  const Batch raw = dataset->get_batch({3, 1});
  EXPECT_EQ(batch.images.scalar_type(), at::kFloat);
  EXPECT_TRUE(batch.images.equal(raw.images.to(at::kFloat).div(255.0)));
}

// A dataset that fails for one sample index.
class FailingDataset : public InMemoryDataset {
 public:
  FailingDataset(const InMemoryDataset& base, int64_t bad_index)
      : InMemoryDataset(base.images(), base.labels(), base.num_classes()), bad_index_(bad_index) {}
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    for (int64_t index : indices) {
      if (index == bad_index_) {
        throw DataError("cannot decode sample " + std::to_string(index));
      }
    }
    return InMemoryDataset::get_batch(indices);
  }

 private:
  int64_t bad_index_;
};

TEST(DataLoader, WorkerExceptionIsRethrownInBatchOrder) {
  const auto base = small_dataset();
  const auto dataset = std::make_shared<FailingDataset>(
      dynamic_cast<const InMemoryDataset&>(*base), /*bad_index=*/29);
  std::vector<int64_t> order(kNumSamples);
  std::iota(order.begin(), order.end(), 0); // sample 29 is in batch 3
  for (int64_t num_workers : {0, 1, 3}) {
    DataLoader loader(dataset, options(num_workers, 1));
    loader.start_epoch(order, 0);
    for (int k = 0; k < 3; ++k) {
      EXPECT_TRUE(loader.next().has_value()) << "workers " << num_workers << " batch " << k;
    }
    try {
      loader.next();
      FAIL() << "expected a DataError, workers " << num_workers;
    } catch (const DataError& error) {
      EXPECT_NE(std::string(error.what()).find("sample 29"), std::string::npos);
    }
    EXPECT_THROW(loader.next(), DataError); // still failed
    // A new epoch that avoids the bad sample works again.
    loader.start_epoch({0, 1, 2}, 1);
    EXPECT_TRUE(loader.next().has_value());
    EXPECT_FALSE(loader.next().has_value());
  }
}

TEST(DataLoader, StoppingMidEpochDoesNotHang) {
  const auto dataset = small_dataset();
  std::vector<int64_t> order(kNumSamples * 4);
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = static_cast<int64_t>(i) % kNumSamples;
  }
  DataLoader serial(dataset, options(0));
  for (int repeat = 0; repeat < 20; ++repeat) {
    auto loader = std::make_unique<DataLoader>(dataset, options(3, 1));
    loader->start_epoch(order, 0);
    ASSERT_TRUE(loader->next().has_value());
    // Restart while the workers are blocked on full queues ...
    loader->start_epoch(order, 1, 2);
    serial.start_epoch(order, 1, 2);
    EXPECT_TRUE(loader->next()->images.equal(serial.next()->images));
    // ... and destroy while they are running.
    loader.reset();
  }
  // Never started: destroying must not hang either.
  DataLoader idle(dataset, options(2));
}

TEST(DataLoader, RejectsBadOptionsAndIndices) {
  const auto dataset = small_dataset();
  DataLoaderOptions opts;
  opts.batch_size = 0;
  EXPECT_THROW(DataLoader(dataset, opts), ConfigError);
  opts.batch_size = 4;
  opts.num_workers = -1;
  EXPECT_THROW(DataLoader(dataset, opts), ConfigError);
  opts.num_workers = 1;
  opts.prefetch_batches = 0;
  EXPECT_THROW(DataLoader(dataset, opts), ConfigError);
  EXPECT_THROW(DataLoader(nullptr, DataLoaderOptions{}), ConfigError);
  DataLoader loader(dataset, options(2));
  loader.start_epoch(epoch_order(0), 0);
  ASSERT_TRUE(loader.next().has_value());
  EXPECT_THROW(loader.start_epoch({0, kNumSamples}, 0), DataError);
  // The interrupted epoch is over, not resumed.
  EXPECT_FALSE(loader.next().has_value());
}

TEST(BatchSeed, IsStableAndDistinguishesItsInputs) {
  // Pinned (values from an independent Python splitmix64 implementation): a change would
  // silently break bit-exact resume from checkpoints written before it.
  EXPECT_EQ(batch_seed(0, 0, 0), 0xa706dd2f4d197e6fULL);
  EXPECT_EQ(batch_seed(77, 3, 5), 0x8bc7e16b6fa271beULL);
  EXPECT_NE(batch_seed(0, 0, 1), batch_seed(0, 1, 0));
  EXPECT_NE(batch_seed(1, 0, 0), batch_seed(0, 0, 0));
  EXPECT_NE(batch_seed(0, 0, 1), batch_seed(0, 0, 2));
}

TEST(SampleSeed, IsStableAndDistinguishesItsInputs) {
  // Pinned like batch_seed (values from the same independent Python splitmix64): the crops
  // a resumed run draws depend on it.
  EXPECT_EQ(sample_seed(0, 0, 0), 0xfa96123fe47275ceULL);
  EXPECT_EQ(sample_seed(5, 2, 1234), 0x15489bb3a8e3eb50ULL);
  EXPECT_NE(sample_seed(0, 0, 1), sample_seed(0, 1, 0));
  EXPECT_NE(sample_seed(0, 0, 0), batch_seed(0, 0, 0));
}

// The uint8 batch travels (pinned, non_blocking) and ToTensor/Normalize run on the device:
// the same floats as the fused CPU path. Channels-last: the batch is laid out NHWC on the
// host (pinned) and the copy keeps its strides, so the device's batch is channels-last
// without a kernel of its own.
void expect_cuda_delivery_equals_cpu_delivery(bool channels_last) {
  const auto dataset = small_dataset();
  DataLoader on_cpu(dataset, options(1));
  DataLoaderOptions cuda_options = options(2);
  cuda_options.device = at::Device(at::kCUDA, 0);
  cuda_options.channels_last = channels_last;
  DataLoader on_cuda(dataset, cuda_options);
  on_cpu.start_epoch(epoch_order(1), 1);
  on_cuda.start_epoch(epoch_order(1), 1);
  while (auto expected = on_cpu.next()) {
    auto batch = on_cuda.next();
    ASSERT_TRUE(batch.has_value());
    EXPECT_TRUE(batch->images.is_cuda());
    EXPECT_EQ(has_channels_last_strides(batch->images), channels_last);
    EXPECT_TRUE(batch->images.cpu().equal(expected->images));
    EXPECT_TRUE(batch->labels.cpu().equal(expected->labels));
  }
  EXPECT_FALSE(on_cuda.next().has_value());
}

TEST(DataLoader, CudaDeliveryEqualsCpuDelivery) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device visible";
  }
  expect_cuda_delivery_equals_cpu_delivery(/*channels_last=*/false);
}

TEST(DataLoader, ChannelsLastDeliversTheSameValuesInNhwcStrides) {
  const auto dataset = small_dataset();
  DataLoader plain(dataset, options(0));
  DataLoaderOptions nhwc_options = options(2);
  nhwc_options.channels_last = true;
  DataLoader nhwc(dataset, nhwc_options);
  plain.start_epoch(epoch_order(1), 1);
  nhwc.start_epoch(epoch_order(1), 1);
  const auto expected = drain(plain);
  const auto batches = drain(nhwc);
  expect_same_batches(expected, batches, "channels-last");
  for (const Batch& batch : batches) {
    EXPECT_TRUE(has_channels_last_strides(batch.images));
  }
}

TEST(DataLoader, CudaChannelsLastDeliveryEqualsCpuDelivery) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device visible";
  }
  expect_cuda_delivery_equals_cpu_delivery(/*channels_last=*/true);
}

} // namespace
} // namespace largo::data::data_loader_test
