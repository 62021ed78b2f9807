#include "largo/data/stl10_dataset.h"

#include <fmt/format.h>

#include "largo/core/error.h"
#include "largo/data/binary_records.h"

namespace largo::data {

Stl10Dataset::Stl10Dataset(at::Tensor images, at::Tensor labels)
    : InMemoryDataset(std::move(images), std::move(labels), kNumClasses) {}

Stl10Dataset Stl10Dataset::load(const std::filesystem::path& root_dir, Split split) {
  const std::string prefix = split == Split::kTest ? "test" : "train";
  std::filesystem::path dir = root_dir;
  if (!std::filesystem::is_regular_file(dir / (prefix + "_X.bin"))) {
    dir = root_dir / "stl10_binary";
  }
  for (const std::string suffix : {"_X.bin", "_y.bin"}) {
    if (!std::filesystem::is_regular_file(dir / (prefix + suffix))) {
      throw DataError(fmt::format(
          "STL-10 {} data not found: tried {} and {}. Download the binary version "
          "(stl10_binary.tar.gz from https://cs.stanford.edu/~acoates/stl10/), extract it and "
          "point DataSourceOptions::path ({} split) at the extracted directory.",
          to_string(split),
          (root_dir / (prefix + suffix)).string(),
          (dir / (prefix + suffix)).string(),
          to_string(split)));
    }
  }
  const auto images_path = dir / (prefix + "_X.bin");
  const auto labels_path = dir / (prefix + "_y.bin");
  const at::Tensor stored = read_binary_records(images_path, kImageBytes, "STL-10");
  const at::Tensor label_bytes = read_binary_records(labels_path, 1, "STL-10").view({-1});
  const int64_t count = stored.size(0);
  if (label_bytes.size(0) != count) {
    throw DataError(fmt::format(
        "STL-10: {} holds {} images but {} holds {} labels; download both files again",
        images_path.string(),
        count,
        labels_path.string(),
        label_bytes.size(0)));
  }
  at::Tensor labels = label_bytes.to(at::kLong);
  if (count > 0 && (labels.min().item<int64_t>() < 1 || labels.max().item<int64_t>() > 10)) {
    throw DataError(fmt::format(
        "STL-10 file {}: labels must be 1..10, found {}..{}",
        labels_path.string(),
        labels.min().item<int64_t>(),
        labels.max().item<int64_t>()));
  }
  // Stored [n, c, column, row]: swap to [n, c, row, column].
  at::Tensor images = stored.view({count, kChannels, kSide, kSide}).transpose(2, 3).contiguous();
  return Stl10Dataset(std::move(images), labels - 1);
}

} // namespace largo::data
