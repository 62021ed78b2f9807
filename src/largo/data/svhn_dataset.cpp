#include "largo/data/svhn_dataset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "largo/core/error.h"
#include "largo/data/matlab_file.h"

namespace largo::data {

SvhnDataset::SvhnDataset(at::Tensor images, at::Tensor labels)
    : InMemoryDataset(std::move(images), std::move(labels), kNumClasses) {}

SvhnDataset SvhnDataset::load(const std::filesystem::path& root_dir, Split split) {
  const std::string name = split == Split::kTest ? "test_32x32.mat" : "train_32x32.mat";
  const std::filesystem::path path = root_dir / name;
  if (!std::filesystem::is_regular_file(path)) {
    throw DataError(fmt::format(
        "SVHN {} data not found: {} does not exist. Download {} (the cropped digits, "
        "http://ufldl.stanford.edu/housenumbers/, as torchvision's SVHN does) and point "
        "DataSourceOptions::path ({} split) at its directory.",
        to_string(split),
        path.string(),
        name,
        to_string(split)));
  }
  auto arrays = read_matlab_arrays(path, {"X", "y"});
  const MatlabArray& x = arrays.at("X");
  const MatlabArray& y = arrays.at("y");
  const int64_t count = x.dims.size() == 4 ? x.dims[3] : -1;
  if (x.dims.size() != 4 || x.dims[0] != kSide || x.dims[1] != kSide || x.dims[2] != kChannels ||
      x.values.scalar_type() != at::kByte) {
    throw DataError(fmt::format(
        "SVHN file {}: X is [{}] of {}, expected uint8 [32, 32, 3, N]; is this the cropped "
        "digits' {}?",
        path.string(),
        fmt::join(x.dims, ", "),
        c10::toString(x.values.scalar_type()),
        name));
  }
  if (y.values.numel() != count) {
    throw DataError(fmt::format(
        "SVHN file {}: X holds {} images but y {} labels", path.string(), count, y.values.numel()));
  }
  at::Tensor labels = y.values.to(at::kLong);
  if (count > 0 && (labels.min().item<int64_t>() < 1 || labels.max().item<int64_t>() > 10 ||
                    !labels.to(y.values.scalar_type()).equal(y.values))) {
    throw DataError(fmt::format(
        "SVHN file {}: labels must be the integers 1..10, found {}..{}",
        path.string(),
        y.values.min().item<double>(),
        y.values.max().item<double>()));
  }
  labels.masked_fill_(labels == 10, 0); // SVHN's 10 is the digit 0 (torchvision's mapping)
  // Column-major [row, column, channel, image] is row-major [image, channel, column, row].
  at::Tensor images =
      x.values.view({count, kChannels, kSide, kSide}).transpose(2, 3).contiguous();
  return SvhnDataset(std::move(images), std::move(labels));
}

} // namespace largo::data
