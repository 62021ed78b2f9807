// Largo's side of bench/run_loader_webdataset.sh: one epoch's images/s of the training
// transform (RandomResizedCrop 224, flip, ToTensor, Normalize) through Largo's DataLoader,
// reading the same images either as files or as WebDataset shards.
//
//   webdataset_loader_bench folder FOLDER WORKERS BATCH
//       disk_folder in DistributedSampler's shuffled order
//   webdataset_loader_bench webdataset SHARDS WORKERS BATCH SHUFFLE_BUFFER
//       webdataset (SHARDS a glob or brace pattern) in WebDatasetSampler's order: shards
//       shuffled and dealt to the loader threads, each through its shuffle buffer
//   webdataset_loader_bench index SHARDS
//       the start-up cost: indexing the shards' headers (and reading every .cls)
// Rates count the images after a warm-up of 2 batches; the index is built before timing.
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "largo/core/malloc_tuning.h"
#include "largo/data/data_loader.h"
#include "largo/data/dataset_factory.h"
#include "largo/data/sampler.h"
#include "largo/data/webdataset_index.h"
#include "largo/data/webdataset_sampler.h"
#include "loader_timing.h"

using namespace largo::data;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<TransformSpec> training_transform() {
  return {
      {"RandomResizedCrop", {{"size", {224}}}},
      {"RandomHorizontalFlip", {}},
      {"ToTensor", {}},
      {"Normalize", {{"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}}}};
}

double seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int throughput(
    const std::string& source_name,
    const std::string& path,
    int64_t workers,
    int64_t batch,
    int64_t shuffle_buffer) {
  DataSourceOptions source;
  source.source = source_name;
  source.path = path;
  source.transforms = training_transform();
  const OpenedDataset opened = open_dataset(source, Split::kTrain, 0);
  DataLoaderOptions options;
  options.batch_size = batch;
  options.num_workers = workers;
  options.transforms = opened.transforms;
  DataLoader loader(opened.dataset, options);
  std::vector<int64_t> order;
  if (source_name == "webdataset") {
    WebDatasetSamplerOptions stream;
    stream.streams_per_replica = std::max<int64_t>(1, workers);
    stream.batch_size = batch;
    stream.shuffle_buffer = shuffle_buffer;
    order = WebDatasetSampler(opened.shard_sizes, stream).indices();
  } else {
    order = DistributedSampler(opened.dataset->size()).indices();
  }
  const auto [images, elapsed] = largo::bench::time_epoch(loader, order);
  std::printf(
      "largo %s workers=%lld: %.1f images/s (%lld images, %.2f s; consumer waited %.0f%%)\n",
      source_name.c_str(),
      static_cast<long long>(workers),
      images / elapsed,
      static_cast<long long>(images),
      elapsed,
      100.0 * loader.stats().wait_fraction());
  return 0;
}

int index(const std::string& pattern) {
  const Clock::time_point start = Clock::now();
  const auto shards = index_webdataset(pattern, false);
  const double elapsed = seconds(start);
  std::printf(
      "largo webdataset index: %zu shards, %lld samples in %.3f s (%.1f us a sample)\n",
      shards->shard_paths.size(),
      static_cast<long long>(shards->list.size()),
      elapsed,
      1e6 * elapsed / static_cast<double>(shards->list.size()));
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  largo::tune_malloc_for_tensors();
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 4 && args[0] == "folder") {
      return throughput("disk_folder", args[1], std::stoll(args[2]), std::stoll(args[3]), 0);
    }
    if (args.size() == 5 && args[0] == "webdataset") {
      return throughput(
          "webdataset", args[1], std::stoll(args[2]), std::stoll(args[3]), std::stoll(args[4]));
    }
    if (args.size() == 2 && args[0] == "index") {
      return index(args[1]);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "webdataset_loader_bench: %s\n", error.what());
    return 1;
  }
  std::fprintf(
      stderr,
      "usage: webdataset_loader_bench folder FOLDER WORKERS BATCH\n"
      "       webdataset_loader_bench webdataset SHARDS WORKERS BATCH SHUFFLE_BUFFER\n"
      "       webdataset_loader_bench index SHARDS\n");
  return 2;
}
