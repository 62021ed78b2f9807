#include "largo/data/cifar100_dataset.h"

#include <fmt/format.h>

#include "largo/core/error.h"
#include "largo/data/binary_records.h"

namespace largo::data {

Cifar100Dataset::Cifar100Dataset(at::Tensor images, at::Tensor labels)
    : InMemoryDataset(std::move(images), std::move(labels), kNumClasses) {}

Cifar100Dataset Cifar100Dataset::load(const std::filesystem::path& root_dir, Split split) {
  const std::string name = split == Split::kTest ? "test.bin" : "train.bin";
  std::filesystem::path path = root_dir / name;
  if (!std::filesystem::is_regular_file(path)) {
    path = root_dir / "cifar-100-binary" / name;
  }
  if (!std::filesystem::is_regular_file(path)) {
    throw DataError(fmt::format(
        "CIFAR-100 {} data not found: tried {} and {}. Download the binary version "
        "(cifar-100-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html), extract "
        "it and point DataSourceOptions::path ({} split) at the extracted directory.",
        to_string(split),
        (root_dir / name).string(),
        path.string(),
        to_string(split)));
  }
  const at::Tensor records = read_binary_records(path, kRecordBytes, "CIFAR-100"); // [n, 3074]
  const int64_t count = records.size(0);
  at::Tensor labels = records.select(1, 1).to(at::kLong); // the fine label; column 0 is coarse
  if (count > 0 && labels.max().item<int64_t>() >= kNumClasses) {
    throw DataError(fmt::format(
        "CIFAR-100 file {}: fine label {} is out of range, expected 0..{}; is this the "
        "CIFAR-100 binary version?",
        path.string(),
        labels.max().item<int64_t>(),
        kNumClasses - 1));
  }
  at::Tensor images =
      records.narrow(1, 2, kRecordBytes - 2).reshape({count, kChannels, kSide, kSide}).contiguous();
  return Cifar100Dataset(std::move(images), std::move(labels));
}

} // namespace largo::data
