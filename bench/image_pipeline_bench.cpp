// Largo's side of bench/run_image_pipeline_bench.sh.
//
//   image_pipeline_bench throughput FOLDER train|val WORKERS BATCH [--no-dct]
//       images/s of disk_folder + DataLoader over one shuffled epoch (after a warm-up of 2
//       batches), the ImageNet training transform (RandomResizedCrop 224, flip, ToTensor,
//       Normalize) or validation transform (Resize 256, CenterCrop 224, ToTensor, Normalize)
//   image_pipeline_bench multicrop FOLDER WORKERS BATCH
//       the same for VISSL's SwAV multi-crop recipe: ImgPilToMultiCrop 2 x 224 (scale
//       0.14-1) + 6 x 96 (scale 0.05-0.14), RandomHorizontalFlip, ImgPilColorDistortion 1.0,
//       ImgPilGaussianBlur (p 0.5, radius 0.1-2.0), ToTensor, Normalize; one image is 8 views
//   image_pipeline_bench decode FOLDER WORKERS
//       libjpeg-turbo's plain full-size decode of every file (read + decode, no transform)
//       on WORKERS threads: the reference limit
//   image_pipeline_bench dct FOLDER train|val SIZE
//       what DCT-scaled decoding changes: every image through the transform at output SIZE
//       with and without DCT scaling (same draws), the pixel differences and the time
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>

#include "largo/core/malloc_tuning.h"
#include "largo/data/data_loader.h"
#include "largo/data/dataset_factory.h"
#include "largo/data/image_dataset.h"
#include "largo/data/image_list.h"
#include "largo/data/multi_view_pipeline.h"
#include "largo/data/sampler.h"
#include "loader_timing.h"

using namespace largo::data;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<TransformSpec>
transforms(const std::string& which, int64_t size, bool normalize = true) {
  std::vector<TransformSpec> specs;
  if (which == "train") {
    specs = {{"RandomResizedCrop", {{"size", {double(size)}}}}, {"RandomHorizontalFlip", {}}};
  } else {
    specs = {
        {"Resize", {{"size", {double(size * 256 / 224)}}}},
        {"CenterCrop", {{"size", {double(size)}}}}};
  }
  if (normalize) {
    specs.push_back({"ToTensor", {}});
    specs.push_back(
        {"Normalize", {{"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}}});
  }
  return specs;
}

double seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One shuffled epoch of `loader` (bench/loader_timing.h).
std::pair<int64_t, double> time_epoch(DataLoader& loader, int64_t dataset_size) {
  return largo::bench::time_epoch(
      loader, DistributedSampler(dataset_size, 1, 0, /*shuffle=*/true, 0).indices());
}

int throughput(
    const std::string& folder, const std::string& which, int64_t workers, int64_t batch, bool dct) {
  DataSourceOptions source;
  source.source = "disk_folder";
  source.path = folder;
  source.transforms = transforms(which, 224);
  source.images.decode.dct_scaling = dct;
  const OpenedDataset opened = open_dataset(source, Split::kTrain, 0);
  DataLoaderOptions options;
  options.batch_size = batch;
  options.num_workers = workers;
  options.transforms = opened.transforms;
  options.seed = 0;
  DataLoader loader(opened.dataset, options);
  const auto [images, elapsed] = time_epoch(loader, opened.dataset->size());
  const LoaderStats stats = loader.stats();
  std::printf(
      "largo %s workers=%lld%s: %.1f images/s (%lld images, %.2f s; consumer waited %.0f%%)\n",
      which.c_str(),
      static_cast<long long>(workers),
      dct ? "" : " no-dct",
      images / elapsed,
      static_cast<long long>(images),
      elapsed,
      100.0 * stats.wait_fraction());
  return 0;
}

std::vector<TransformSpec> swav_transforms() {
  TransformSpec multicrop(
      "ImgPilToMultiCrop",
      {{"total_num_crops", {8}}, {"num_crops", {2, 6}}, {"size_crops", {224, 96}}});
  multicrop.nested_args["crop_scales"] = {{0.14, 1.0}, {0.05, 0.14}};
  return {
      multicrop,
      {"RandomHorizontalFlip", {{"p", {0.5}}}},
      {"ImgPilColorDistortion", {{"strength", {1.0}}}},
      {"ImgPilGaussianBlur", {{"p", {0.5}}, {"radius_min", {0.1}}, {"radius_max", {2.0}}}},
      {"ToTensor", {}},
      {"Normalize", {{"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}}}};
}

int multicrop(const std::string& folder, int64_t workers, int64_t batch) {
  MultiViewTransforms transforms = make_multi_view_transforms(swav_transforms());
  auto dataset =
      std::make_shared<ImageDataset>(list_image_folder(folder), std::move(transforms.per_sample));
  DataLoaderOptions options;
  options.batch_size = batch;
  options.num_workers = workers;
  options.transforms = transforms.per_batch;
  DataLoader loader(dataset, options);
  const auto [images, elapsed] = time_epoch(loader, dataset->size());
  std::printf(
      "largo multicrop workers=%lld: %.1f images/s (%lld images of 8 views, %.2f s; consumer "
      "waited %.0f%%)\n",
      static_cast<long long>(workers),
      images / elapsed,
      static_cast<long long>(images),
      elapsed,
      100.0 * loader.stats().wait_fraction());
  return 0;
}

int decode(const std::string& folder, int64_t workers) {
  const ImageList list = list_image_folder(folder);
  std::atomic<int64_t> next{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      std::vector<uint8_t> bytes;
      Image image;
      for (int64_t i = next++; i < list.size(); i = next++) {
        read_file_bytes(list.paths[static_cast<size_t>(i)], bytes);
        EncodedImage(bytes.data(), bytes.size(), list.paths[static_cast<size_t>(i)], {})
            .decode(image);
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  const double elapsed = seconds(start);
  std::printf(
      "libjpeg-turbo full decode workers=%lld: %.1f images/s (%lld images, %.2f s)\n",
      static_cast<long long>(workers),
      list.size() / elapsed,
      static_cast<long long>(list.size()),
      elapsed);
  return 0;
}

// Runs one image through the per-sample transforms; returns the planar bytes.
std::vector<uint8_t>
run(const EncodedImage& encoded,
    const SamplePipeline& pipeline,
    bool dct,
    uint64_t seed,
    int64_t size,
    int* denominator) {
  DecodeOptions options;
  options.dct_scaling = dct;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  SampleImage image(encoded, options);
  for (const auto& transform : pipeline.transforms()) {
    transform->apply(image, gen);
  }
  std::vector<uint8_t> out(static_cast<size_t>(3 * size * size));
  image.write_planar(out.data());
  *denominator = image.last_scale_denominator();
  return out;
}

int dct(const std::string& folder, const std::string& which, int64_t size) {
  const ImageList list = list_image_folder(folder);
  const ImageTransforms pipeline =
      make_image_transforms(transforms(which, size, /*normalize=*/false));
  double total_difference = 0;
  int64_t values = 0;
  int worst = 0;
  int64_t scaled = 0;
  double seconds_exact = 0;
  double seconds_scaled = 0;
  std::vector<uint8_t> bytes;
  for (int64_t i = 0; i < list.size(); ++i) {
    read_file_bytes(list.paths[static_cast<size_t>(i)], bytes);
    const EncodedImage encoded(bytes.data(), bytes.size(), list.paths[static_cast<size_t>(i)], {});
    int denominator = 1;
    Clock::time_point start = Clock::now();
    const std::vector<uint8_t> exact =
        run(encoded, pipeline.per_sample, false, i, size, &denominator);
    seconds_exact += seconds(start);
    start = Clock::now();
    const std::vector<uint8_t> fast =
        run(encoded, pipeline.per_sample, true, i, size, &denominator);
    seconds_scaled += seconds(start);
    scaled += denominator > 1 ? 1 : 0;
    for (size_t v = 0; v < exact.size(); ++v) {
      const int difference = std::abs(int(exact[v]) - int(fast[v]));
      total_difference += difference;
      worst = std::max(worst, difference);
    }
    values += static_cast<int64_t>(exact.size());
  }
  std::printf(
      "dct %s %lld: %lld of %lld images decoded scaled; pixels vs full decode: mean |diff| %.3f "
      "levels, "
      "max %d; per image %.2f ms exact, %.2f ms with DCT scaling\n",
      which.c_str(),
      static_cast<long long>(size),
      static_cast<long long>(scaled),
      static_cast<long long>(list.size()),
      total_difference / double(std::max<int64_t>(values, 1)),
      worst,
      1000 * seconds_exact / double(list.size()),
      1000 * seconds_scaled / double(list.size()));
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  largo::tune_malloc_for_tensors();
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() >= 5 && args[0] == "throughput") {
      return throughput(
          args[1],
          args[2],
          std::stoll(args[3]),
          std::stoll(args[4]),
          !(args.size() > 5 && args[5] == "--no-dct"));
    }
    if (args.size() == 4 && args[0] == "multicrop") {
      return multicrop(args[1], std::stoll(args[2]), std::stoll(args[3]));
    }
    if (args.size() == 3 && args[0] == "decode") {
      return decode(args[1], std::stoll(args[2]));
    }
    if (args.size() == 4 && args[0] == "dct") {
      return dct(args[1], args[2], std::stoll(args[3]));
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "image_pipeline_bench: %s\n", error.what());
    return 1;
  }
  std::fprintf(
      stderr,
      "usage: image_pipeline_bench throughput FOLDER train|val WORKERS BATCH [--no-dct]\n"
      "       image_pipeline_bench multicrop FOLDER WORKERS BATCH\n"
      "       image_pipeline_bench decode FOLDER WORKERS\n"
      "       image_pipeline_bench dct FOLDER train|val SIZE\n");
  return 2;
}
