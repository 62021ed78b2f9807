// CIFAR-10 binary parsing: a whole file is read into one [n, 3073] byte tensor, then the
// label column and the image columns are split off with tensor ops.
#include "largo/data/cifar10_dataset.h"

#include <fmt/format.h>

#include "largo/core/error.h"
#include "largo/data/binary_records.h"

namespace largo::data {
namespace {

std::vector<std::string> split_file_names(Split split) {
  if (split == Split::kTest) {
    return {"test_batch.bin"};
  }
  return {
      "data_batch_1.bin",
      "data_batch_2.bin",
      "data_batch_3.bin",
      "data_batch_4.bin",
      "data_batch_5.bin"};
}

// The directory that holds the split's first file: root_dir itself or the folder the
// official tarball creates inside it.
std::filesystem::path find_cifar_dir(const std::filesystem::path& root_dir, Split split) {
  const std::string first = split_file_names(split).front();
  const std::filesystem::path candidates[] = {root_dir, root_dir / "cifar-10-batches-bin"};
  for (const auto& dir : candidates) {
    if (std::filesystem::is_regular_file(dir / first)) {
      return dir;
    }
  }
  throw DataError(fmt::format(
      "CIFAR-10 {} data not found: tried {} and {}. Download the binary version "
      "(cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html), extract it "
      "and point DataSourceOptions::path ({} split) at the extracted directory.",
      to_string(split),
      (candidates[0] / first).string(),
      (candidates[1] / first).string(),
      to_string(split)));
}

} // namespace

Cifar10Dataset::Cifar10Dataset(at::Tensor images, at::Tensor labels)
    : InMemoryDataset(std::move(images), std::move(labels), kNumClasses) {}

Batch Cifar10Dataset::read_batch_file(const std::filesystem::path& path) {
  const at::Tensor records = read_binary_records(path, kRecordBytes, "CIFAR-10"); // [n, 3073]
  const int64_t num_records = records.size(0);
  at::Tensor labels = records.select(1, 0).to(at::kLong); // [n]
  at::Tensor images = records.narrow(1, 1, kRecordBytes - 1)
                          .reshape({num_records, kChannels, kHeight, kWidth})
                          .contiguous(); // [n, 3, 32, 32]
  if (num_records > 0) {
    const int64_t max_label = labels.max().item<int64_t>();
    if (max_label >= kNumClasses) {
      throw DataError(fmt::format(
          "CIFAR-10 file {}: label {} is out of range, expected 0..{}; "
          "is this CIFAR-100 or another format?",
          path.string(),
          max_label,
          kNumClasses - 1));
    }
  }
  return Batch{images, labels};
}

Cifar10Dataset Cifar10Dataset::load(const std::filesystem::path& root_dir, Split split) {
  const std::filesystem::path dir = find_cifar_dir(root_dir, split);
  std::vector<at::Tensor> images;
  std::vector<at::Tensor> labels;
  for (const std::string& name : split_file_names(split)) {
    const std::filesystem::path path = dir / name;
    if (!std::filesystem::is_regular_file(path)) {
      throw DataError(fmt::format(
          "CIFAR-10 file {} is missing (found {}); the {} split needs "
          "all of data_batch_1.bin .. data_batch_5.bin",
          path.string(),
          (dir / split_file_names(split).front()).string(),
          to_string(split)));
    }
    Batch batch = read_batch_file(path);
    images.push_back(std::move(batch.images));
    labels.push_back(std::move(batch.labels));
  }
  return Cifar10Dataset(at::cat(images, 0), at::cat(labels, 0));
}

} // namespace largo::data
