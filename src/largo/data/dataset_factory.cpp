// Every data source behind one call.
#include "largo/data/dataset_factory.h"

#include <fmt/format.h>

#include "largo/core/error.h"
#include "largo/data/cifar10_dataset.h"
#include "largo/data/idx_dataset.h"
#include "largo/data/image_list.h"
#include "largo/data/sample_pipeline.h"
#include "largo/data/synthetic_dataset.h"

namespace largo::data {
namespace {

OpenedDataset in_memory(std::shared_ptr<const Dataset> dataset, const DataSourceOptions& options) {
  OpenedDataset opened;
  opened.transforms = make_pipeline(options.transforms);
  opened.sample_shape = opened.transforms.output_shape(dataset->sample_shape());
  opened.num_classes = dataset->num_classes();
  opened.dataset = std::move(dataset);
  return opened;
}

OpenedDataset image_files(ImageList list, const DataSourceOptions& options) {
  ImageTransforms transforms = make_image_transforms(options.transforms);
  auto dataset = std::make_shared<ImageDataset>(
      std::move(list), std::move(transforms.per_sample), options.images);
  OpenedDataset opened;
  opened.transforms = std::move(transforms.per_batch);
  opened.sample_shape = opened.transforms.output_shape(dataset->sample_shape());
  opened.num_classes = dataset->num_classes();
  opened.dataset = std::move(dataset);
  return opened;
}

} // namespace

OpenedDataset open_dataset(const DataSourceOptions& options, Split split, uint64_t seed) {
  if (options.source == "synthetic") {
    return in_memory(
        std::make_shared<SyntheticDataset>(
            options.synthetic_num_samples,
            options.synthetic_image_shape,
            options.synthetic_num_classes,
            seed),
        options);
  }
  if (options.source == "torchvision_dataset") {
    if (options.dataset_name == "CIFAR10") {
      return in_memory(
          std::make_shared<Cifar10Dataset>(Cifar10Dataset::load(options.path, split)), options);
    }
    if (options.dataset_name == "MNIST" || options.dataset_name == "FashionMNIST") {
      return in_memory(
          std::make_shared<IdxDataset>(IdxDataset::load(options.path, split)), options);
    }
    throw ConfigError(fmt::format(
        "data source torchvision_dataset: unknown dataset name '{}'; expected MNIST, FashionMNIST "
        "or CIFAR10",
        options.dataset_name));
  }
  if (options.source == "disk_folder") {
    return image_files(list_image_folder(options.path, options.images.skip_bad_samples), options);
  }
  if (options.source == "disk_filelist") {
    if (options.label_path.empty()) {
      throw ConfigError(fmt::format(
          "data source disk_filelist ({}): no label file; give the .npy of labels (LABEL_PATHS, "
          "with "
          "LABEL_SOURCES: [disk_filelist])",
          options.path.string()));
    }
    return image_files(
        list_image_filelist(
            options.path, options.label_path, options.remove_path_prefix, options.new_path_prefix),
        options);
  }
  throw ConfigError(fmt::format(
      "unknown data source '{}'; expected torchvision_dataset, synthetic, disk_folder or "
      "disk_filelist",
      options.source));
}

} // namespace largo::data
