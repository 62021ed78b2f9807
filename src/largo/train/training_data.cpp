#include <largo/train/training_data.h>

#include <largo/core/error.h>
#include <largo/data/sampler.h>
#include <largo/train/option_keys.h>

#include <spdlog/spdlog.h>

#include <fmt/format.h>

#include <numeric>

namespace largo::train {
namespace {

// The sample indices of a split with DATA_LIMIT applied: the first `limit` entries of a
// permutation seeded with DATA_LIMIT_SAMPLING.SEED (all indices when no limit).
std::vector<int64_t> subset_indices(int64_t dataset_size, const data::DataSplitOptions& split) {
  std::vector<int64_t> indices(dataset_size);
  std::iota(indices.begin(), indices.end(), 0);
  if (split.data_limit < 0 || split.data_limit >= dataset_size) {
    return indices;
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(split.data_limit_seed);
  at::Tensor permutation = torch::randperm(dataset_size, generator, torch::kLong);
  auto* data = permutation.data_ptr<int64_t>();
  std::vector<int64_t> subset(data, data + split.data_limit);
  std::sort(subset.begin(), subset.end());
  return subset;
}

// Rank `rank`'s unpadded share of `subset`: its entries rank, rank + world_size, ...
std::vector<int64_t>
every_world_size_th(const std::vector<int64_t>& subset, int rank, int world_size) {
  std::vector<int64_t> share;
  for (size_t i = static_cast<size_t>(rank); i < subset.size();
       i += static_cast<size_t>(world_size)) {
    share.push_back(subset[i]);
  }
  return share;
}

// Rank r's batch seed: rank 0 keeps the configured seed (a one-process run is unchanged);
// the others get distinct streams, so ranks do not augment their batches identically. Per-
// sample draws keep the configured seed (they are keyed by the sample's index, which no two
// ranks share in an epoch), so a sample is cropped alike at any world size and 2 ranks train
// on what one process would.
uint64_t loader_seed(uint64_t seed, int rank) {
  return seed ^ (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull);
}

std::unique_ptr<data::DataLoader> make_loader(
    const TrainerOptions& options,
    const data::DataSplitOptions& split,
    data::OpenedDataset opened,
    int rank,
    torch::Device device) {
  data::DataLoaderOptions loader_options;
  loader_options.batch_size = split.batch_size;
  loader_options.num_workers = options.loading.num_workers;
  loader_options.drop_last = split.drop_last;
  loader_options.transforms = std::move(opened.transforms);
  loader_options.seed = loader_seed(options.seed, rank);
  loader_options.sample_seed = options.seed;
  loader_options.device = device;
  loader_options.pin_memory = options.loading.pin_memory;
  loader_options.non_blocking = options.loading.async_gpu_copy;
  // kAuto is the Trainer's to resolve (RunPlan::channels_last); it passes kOn or kOff here.
  loader_options.channels_last = options.channels_last == TrainerOptions::ChannelsLast::kOn;
  return std::make_unique<data::DataLoader>(std::move(opened.dataset), loader_options);
}

// Where a split's samples come from, for messages: the keys that say so.
std::string source_text(const std::string& key, const data::DataSplitOptions& split) {
  const data::DataSourceOptions& source = split.source;
  std::string text =
      source.source == "synthetic"
          ? fmt::format(
                "synthetic data, {}.SYNTHETIC.NUM_SAMPLES = {}", key, source.synthetic_num_samples)
          : fmt::format(
                "{} at {} ({}.DATA_PATHS)",
                source.source == "torchvision_dataset" ? source.dataset_name : source.source,
                source.path.string(),
                key);
  if (split.data_limit >= 0) {
    text += fmt::format(", {}.DATA_LIMIT = {}", key, split.data_limit);
  }
  return text;
}

// A split without samples would train on nothing or report "top-1 0.00 %": refused before
// the model is built, saying where the samples were to come from.
void check_not_empty(
    const std::string& key,
    const data::DataSplitOptions& split,
    size_t num_samples,
    bool training) {
  if (num_samples > 0) {
    return;
  }
  throw DataError(fmt::format(
      "{} has no samples ({}), so there is nothing to {}; point {}.DATA_PATHS at data{}",
      key,
      source_text(key, split),
      training ? "train on" : "evaluate",
      key,
      training ? "" : ", or set TEST_MODEL=False to train without evaluating"));
}

// What a webdataset epoch reads, said once: streams are whole shards, so some samples may
// be left out of each epoch (a different set every epoch).
void log_webdataset_epoch(const data::WebDatasetSampler& sampler, size_t num_shards, int rank) {
  if (rank != 0) {
    return;
  }
  const int64_t unread = sampler.num_unread_per_epoch();
  const int64_t read = sampler.num_samples();
  spdlog::info(
      "webdataset: {} shards; each rank reads {} samples an epoch ({} per loader thread){}",
      num_shards,
      read,
      sampler.samples_per_stream(),
      unread == 0 ? std::string()
                  : fmt::format(
                        "; {} samples are left unread in each epoch (shards of unequal size, or "
                        "not a multiple of ranks x loader threads)",
                        unread));
}

} // namespace

TrainingData::TrainingData(
    const TrainerOptions& options, int rank, int world_size, torch::Device device)
    : options_(options), rank_(rank), world_size_(world_size) {
  if (!options_.test_only) { // an evaluation reads DATA.TEST only: DATA.TRAIN need not exist
    open_train_split(device);
  }
  if (!options_.reads_test_split()) { // a self-supervised run that does not evaluate
    return;
  }
  data::OpenedDataset test =
      data::open_dataset(options_.test.source, data::Split::kTest, options_.seed + 1);
  test_shape_ = test.sample_shape;
  test_data_ = test.dataset;
  test_subset_ = subset_indices(test_data_->size(), options_.test);
  if (options_.test_model) {
    check_not_empty("DATA.TEST", options_.test, test_subset_.size(), /*training=*/false);
  }
  test_loader_ = make_loader(options_, options_.test, std::move(test), rank_, device);
}

void TrainingData::open_train_split(torch::Device device) {
  data::OpenedDataset train =
      data::open_dataset(options_.train.source, data::Split::kTrain, options_.seed);
  train_shape_ = train.sample_shape;
  train_view_shapes_ = train.view_shapes;
  train_data_ = train.dataset;
  train_shard_sizes_ = train.shard_sizes;
  train_subset_ = subset_indices(train_data_->size(), options_.train);
  check_not_empty("DATA.TRAIN", options_.train, train_subset_.size(), /*training=*/true);
  train_loader_ = make_loader(options_, options_.train, std::move(train), rank_, device);

  if (streams_webdataset()) {
    log_webdataset_epoch(webdataset_sampler(0), train_shard_sizes_.size(), rank_);
  }
  const int64_t samples_per_rank = static_cast<int64_t>(train_epoch_order(0).size());
  iterations_per_epoch_ = iterations_for(samples_per_rank);
  if (iterations_per_epoch_ == 0) {
    throw ConfigError(fmt::format(
        "DATA.TRAIN.BATCHSIZE_PER_REPLICA = {}{} leaves no batch from the {} samples each of the "
        "{} ranks reads",
        options_.train.batch_size,
        options_.train.drop_last ? " with DROP_LAST" : "",
        samples_per_rank,
        world_size_));
  }
}

int64_t TrainingData::train_samples_per_epoch() const {
  const auto samples = static_cast<int64_t>(train_epoch_order(0).size());
  return options_.train.drop_last ? samples - samples % options_.train.batch_size : samples;
}

int64_t TrainingData::iterations_for(int64_t samples_per_rank) const {
  const int64_t batch_size = options_.train.batch_size;
  const int64_t batches = options_.train.drop_last
                              ? samples_per_rank / batch_size
                              : (samples_per_rank + batch_size - 1) / batch_size;
  const int64_t accumulation = options_.gradient_accumulation_steps;
  return (batches + accumulation - 1) / accumulation;
}

data::DataLoader& TrainingData::train_loader() {
  TORCH_INTERNAL_ASSERT(train_loader_, "an evaluation-only run (TEST_ONLY) has no training data");
  return *train_loader_;
}

data::StatefulDistributedSampler TrainingData::stateful_sampler(
    int64_t epoch, const std::vector<checkpoint::ReadStretch>& earlier) const {
  data::StatefulDistributedSampler sampler(
      static_cast<int64_t>(train_subset_.size()),
      world_size_,
      rank_,
      options_.train.batch_size,
      options_.seed);
  sampler.set_epoch(epoch);
  std::vector<data::StatefulDistributedSampler::Stretch> stretches;
  for (const checkpoint::ReadStretch& stretch : earlier) {
    stretches.push_back({stretch.num_replicas, stretch.samples_per_replica});
  }
  sampler.set_earlier_stretches(std::move(stretches));
  return sampler;
}

double TrainingData::fraction_read(const std::vector<checkpoint::ReadStretch>& earlier) const {
  if (earlier.empty()) {
    return 0.0;
  }
  const data::StatefulDistributedSampler sampler = stateful_sampler(0, earlier);
  return static_cast<double>(sampler.num_earlier_samples()) /
         static_cast<double>(std::max<int64_t>(sampler.epoch_size(), 1));
}

bool TrainingData::streams_webdataset() const {
  return options_.train.source.source == "webdataset";
}

data::WebDatasetSampler TrainingData::webdataset_sampler(int64_t epoch) const {
  data::WebDatasetSamplerOptions order;
  order.num_replicas = world_size_;
  order.rank = rank_;
  order.streams_per_replica = std::max<int64_t>(1, options_.loading.num_workers);
  order.batch_size = options_.train.batch_size;
  order.shuffle_buffer = options_.train.shuffle_buffer;
  order.seed = options_.seed;
  data::WebDatasetSampler sampler =
      rethrow_with_yaml_keys([&] { return data::WebDatasetSampler(train_shard_sizes_, order); });
  sampler.set_epoch(epoch);
  return sampler;
}

checkpoint::SamplerDescription TrainingData::sampler_description() const {
  checkpoint::SamplerDescription sampler{
      options_.train.use_stateful_sampler ? "StatefulDistributedSampler" : "DistributedSampler",
      options_.train.batch_size,
      options_.gradient_accumulation_steps,
      num_train_samples()};
  if (streams_webdataset()) {
    sampler.type = "WebDatasetSampler";
    sampler.order = fmt::format(
        "streams_per_replica={} shuffle_buffer={}",
        std::max<int64_t>(1, options_.loading.num_workers),
        options_.train.shuffle_buffer);
  }
  return sampler;
}

std::vector<int64_t> TrainingData::train_epoch_order(
    int64_t epoch, const std::vector<checkpoint::ReadStretch>& earlier) const {
  const auto size = static_cast<int64_t>(train_subset_.size());
  std::vector<int64_t> positions;
  if (streams_webdataset()) {
    // TrainingState refuses to continue a webdataset epoch in another layout; DATA_LIMIT is
    // refused with it, so its indices are the dataset's.
    TORCH_INTERNAL_ASSERT(earlier.empty(), "a webdataset epoch cannot be continued");
    return webdataset_sampler(epoch).indices();
  }
  if (options_.train.use_stateful_sampler) {
    positions = stateful_sampler(epoch, earlier).epoch_indices();
  } else {
    // TrainingState refuses to continue an epoch at another world size without the stateful
    // sampler.
    TORCH_INTERNAL_ASSERT(earlier.empty(), "DistributedSampler cannot continue an epoch");
    data::DistributedSampler sampler(
        size, world_size_, rank_, /*shuffle=*/true, options_.seed, options_.train.drop_last);
    sampler.set_epoch(epoch);
    positions = sampler.indices();
  }
  for (auto& position : positions) {
    position = train_subset_[static_cast<size_t>(position)];
  }
  return positions;
}

std::vector<int64_t> TrainingData::test_order() const {
  return every_world_size_th(test_subset_, rank_, world_size_);
}

std::vector<int64_t> TrainingData::train_order() const {
  return every_world_size_th(train_subset_, rank_, world_size_);
}

} // namespace largo::train
