// Every data source behind one call.
#include "largo/data/dataset_factory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "largo/core/error.h"
#include "largo/data/cifar100_dataset.h"
#include "largo/data/cifar10_dataset.h"
#include "largo/data/idx_dataset.h"
#include "largo/data/image_list.h"
#include "largo/data/in_memory_image_dataset.h"
#include "largo/data/multi_view_pipeline.h"
#include "largo/data/sample_index_labels.h"
#include "largo/data/sample_pipeline.h"
#include "largo/data/stl10_dataset.h"
#include "largo/data/svhn_dataset.h"
#include "largo/data/synthetic_dataset.h"
#include "largo/data/webdataset_index.h"

namespace largo::data {
namespace {

DatasetShape in_memory_shape(const DataSourceOptions& options);

// A list of batch transforms only runs on whole batches of the stored tensor (the fast path);
// anything else (Resize, ColorJitter, several views ...) on each image, as for image files.
bool needs_per_sample_pipeline(const std::vector<TransformSpec>& specs) {
  return std::any_of(specs.begin(), specs.end(), [](const TransformSpec& spec) {
    return !is_batch_transform(spec.name);
  });
}

// An in-memory list that needs the per-sample pipeline, built before any file is read: a
// leading MNISTImgPil2RGB (the canvas that makes a gray image RGB), then a one-view or a
// multi-view list.
struct InMemoryPipelines {
  std::optional<RgbCanvas> canvas;
  ImageTransforms one_view;
  std::optional<MultiViewTransforms> views;

  const TransformPipeline& per_batch() const {
    return views ? views->per_batch : one_view.per_batch;
  }
};

InMemoryPipelines make_in_memory_pipelines(const std::vector<TransformSpec>& specs) {
  InMemoryPipelines pipelines;
  std::vector<TransformSpec> rest = specs;
  if (!rest.empty() && rest.front().name == "MNISTImgPil2RGB") {
    pipelines.canvas = RgbCanvas::from_spec(rest.front());
    rest.erase(rest.begin());
  }
  for (const TransformSpec& spec : rest) {
    if (spec.name == "MNISTImgPil2RGB") {
      throw ConfigError(
          "transform MNISTImgPil2RGB makes the stored image RGB, so it comes first in the list");
    }
  }
  if (is_multi_view_list(rest)) {
    pipelines.views = make_multi_view_transforms(rest);
  } else {
    pipelines.one_view = make_image_transforms(rest);
  }
  return pipelines;
}

// [channels, h, w] of each view's batches: the dataset's uint8 views after the per-batch
// transforms (ToTensor, Normalize).
std::vector<std::vector<int64_t>> view_shapes_after(
    const std::vector<std::vector<int64_t>>& dataset_view_shapes,
    const TransformPipeline& per_batch) {
  std::vector<std::vector<int64_t>> shapes;
  for (const std::vector<int64_t>& shape : dataset_view_shapes) {
    shapes.push_back(per_batch.output_shape(shape));
  }
  return shapes;
}

// What an in-memory split delivers for stored images of `stored_shape`, through `pipelines`.
DatasetShape in_memory_pipelines_shape(
    const InMemoryPipelines& pipelines, const std::vector<int64_t>& stored_shape) {
  const ImageSize rgb = InMemoryImageDataset::rgb_size(stored_shape, pipelines.canvas);
  std::vector<std::vector<int64_t>> shapes;
  if (pipelines.views) {
    for (const std::optional<ImageSize>& size : pipelines.views->per_sample.view_sizes(rgb)) {
      shapes.push_back({Image::kChannels, size->height, size->width});
    }
  } else {
    const ImageSize size = *pipelines.one_view.per_sample.output_size(rgb);
    shapes.push_back({Image::kChannels, size.height, size.width});
  }
  DatasetShape shape;
  shape.view_shapes = view_shapes_after(shapes, pipelines.per_batch());
  shape.sample_shape = shape.view_shapes.front();
  if (!pipelines.views) {
    shape.view_shapes.clear();
  }
  return shape;
}

OpenedDataset in_memory_per_sample(
    const std::function<std::shared_ptr<const Dataset>()>& load, const DataSourceOptions& options) {
  InMemoryPipelines pipelines = make_in_memory_pipelines(options.transforms);
  // A gray dataset without MNISTImgPil2RGB is refused before a file is read.
  InMemoryImageDataset::rgb_size(in_memory_shape(options).sample_shape, pipelines.canvas);
  std::shared_ptr<const Dataset> stored = load();
  std::shared_ptr<const Dataset> dataset =
      pipelines.views ? std::make_shared<InMemoryImageDataset>(
                            stored, std::move(pipelines.views->per_sample), pipelines.canvas)
                      : std::make_shared<InMemoryImageDataset>(
                            stored, std::move(pipelines.one_view.per_sample), pipelines.canvas);
  OpenedDataset opened;
  opened.transforms = pipelines.per_batch();
  opened.view_shapes = view_shapes_after(dataset->view_shapes(), opened.transforms);
  opened.sample_shape = opened.transforms.output_shape(dataset->sample_shape());
  opened.num_classes = dataset->num_classes();
  opened.dataset = std::move(dataset);
  return opened;
}

// An in-memory source (synthetic, torchvision_dataset) loaded by `load`: its batches as
// stored, through the batch transforms, or each image through the per-sample pipeline.
OpenedDataset in_memory(
    const std::function<std::shared_ptr<const Dataset>()>& load, const DataSourceOptions& options) {
  if (needs_per_sample_pipeline(options.transforms)) {
    return in_memory_per_sample(load, options);
  }
  OpenedDataset opened;
  opened.transforms = make_pipeline(options.transforms); // before a file is read
  std::shared_ptr<const Dataset> dataset = load();
  opened.sample_shape = opened.transforms.output_shape(dataset->sample_shape());
  opened.num_classes = dataset->num_classes();
  opened.dataset = std::move(dataset);
  return opened;
}

// Several views per sample: a MultiViewPipeline per image, each view its own batch.
OpenedDataset multi_view_image_files(ImageList list, const DataSourceOptions& options) {
  MultiViewTransforms transforms = make_multi_view_transforms(options.transforms);
  auto dataset = std::make_shared<ImageDataset>(
      std::move(list), std::move(transforms.per_sample), options.images);
  OpenedDataset opened;
  opened.transforms = std::move(transforms.per_batch);
  opened.view_shapes = view_shapes_after(dataset->view_shapes(), opened.transforms);
  opened.sample_shape = opened.view_shapes.front();
  opened.num_classes = dataset->num_classes();
  opened.dataset = std::move(dataset);
  return opened;
}

OpenedDataset image_files(ImageList list, const DataSourceOptions& options) {
  if (is_multi_view_list(options.transforms)) {
    return multi_view_image_files(std::move(list), options);
  }
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

// The model is planned from in_memory_shape() before any file is read: files of another
// size are refused here, naming them, rather than failing in the model's first layer.
void check_mnist_image_size(
    const IdxDataset& dataset, const DataSourceOptions& options, Split split) {
  const std::vector<int64_t> shape = dataset.sample_shape(); // [1, rows, cols]
  const int64_t side = IdxDataset::kMnistImageSide;
  if (shape[1] == side && shape[2] == side) {
    return;
  }
  throw DataError(fmt::format(
      "DataSplitOptions ({} split): {} holds {}x{} images, but {} images are {}x{} (what the "
      "model is sized for); use the dataset's own files, or store the images as an image "
      "folder (DataSourceOptions::source: [disk_folder]) with DataSourceOptions::transforms "
      "that crop both splits to one size",
      to_string(split),
      IdxDataset::images_file(options.path, split).string(),
      shape[1],
      shape[2],
      options.dataset_name,
      side,
      side));
}

// A dataset of the torchvision_dataset source: torchvision's name for it, what its images
// are, and how its official files are read.
struct TorchvisionDataset {
  std::string name;
  std::vector<int64_t> sample_shape; // [channels, h, w]
  int64_t num_classes;
  std::function<std::shared_ptr<const Dataset>(const DataSourceOptions&, Split)> load;
};

std::shared_ptr<const Dataset> load_mnist(const DataSourceOptions& options, Split split) {
  auto dataset = std::make_shared<IdxDataset>(IdxDataset::load(options.path, split));
  check_mnist_image_size(*dataset, options, split);
  return dataset;
}

const std::vector<TorchvisionDataset>& torchvision_datasets() {
  const int64_t mnist = IdxDataset::kMnistImageSide;
  static const std::vector<TorchvisionDataset> datasets{
      {"MNIST", {1, mnist, mnist}, IdxDataset::kNumClasses, load_mnist},
      {"FashionMNIST", {1, mnist, mnist}, IdxDataset::kNumClasses, load_mnist},
      {"CIFAR10",
       {3, 32, 32},
       Cifar10Dataset::kNumClasses,
       [](const DataSourceOptions& options, Split split) {
         return std::make_shared<Cifar10Dataset>(Cifar10Dataset::load(options.path, split));
       }},
      {"CIFAR100",
       {3, 32, 32},
       Cifar100Dataset::kNumClasses,
       [](const DataSourceOptions& options, Split split) {
         return std::make_shared<Cifar100Dataset>(Cifar100Dataset::load(options.path, split));
       }},
      {"STL10",
       {3, Stl10Dataset::kSide, Stl10Dataset::kSide},
       Stl10Dataset::kNumClasses,
       [](const DataSourceOptions& options, Split split) {
         return std::make_shared<Stl10Dataset>(Stl10Dataset::load(options.path, split));
       }},
      {"SVHN",
       {3, SvhnDataset::kSide, SvhnDataset::kSide},
       SvhnDataset::kNumClasses,
       [](const DataSourceOptions& options, Split split) {
         return std::make_shared<SvhnDataset>(SvhnDataset::load(options.path, split));
       }},
  };
  return datasets;
}

const TorchvisionDataset& torchvision_dataset(const DataSourceOptions& options) {
  for (const TorchvisionDataset& dataset : torchvision_datasets()) {
    if (dataset.name == options.dataset_name) {
      return dataset;
    }
  }
  throw ConfigError(fmt::format(
      "data source torchvision_dataset: unknown dataset name '{}'; expected {}",
      options.dataset_name,
      torchvision_dataset_names_text()));
}

// The stored [channels, h, w] and class count of the built-in in-memory datasets.
DatasetShape in_memory_shape(const DataSourceOptions& options) {
  if (options.source == "synthetic") {
    return {options.synthetic_image_shape, options.synthetic_num_classes};
  }
  const TorchvisionDataset& dataset = torchvision_dataset(options);
  return {dataset.sample_shape, dataset.num_classes};
}

bool is_image_source(const std::string& source) {
  return source == "disk_folder" || source == "disk_filelist" || source == "webdataset";
}

// The images of a disk_folder, disk_filelist or webdataset source and their labels.
ImageList list_images(const DataSourceOptions& options) {
  if (options.source == "webdataset") {
    return index_webdataset(options.path.string(), options.images.skip_bad_samples)->list;
  }
  if (options.source == "disk_folder") {
    return list_image_folder(options.path, options.images.skip_bad_samples);
  }
  // Without a label file the labels are the samples' indices (sample_index), never zeros
  // taken for classes.
  if (options.label_path.empty() && options.label_type != "sample_index") {
    throw ConfigError(fmt::format(
        "data source disk_filelist ({}): no label file; give the .npy of labels "
        "(DataSourceOptions::label_path), or label_type sample_index for a list without labels",
        options.path.string()));
  }
  return list_image_filelist(options.path, options.label_path, options.remove_path_prefix,
                             options.new_path_prefix);
}

// make_multi_view_transforms fixes every view's size, so only the classes need the files:
// the class folders (disk_folder) or the listed labels (disk_filelist).
DatasetShape multi_view_image_files_shape(const DataSourceOptions& options) {
  const MultiViewTransforms transforms = make_multi_view_transforms(options.transforms);
  std::vector<std::vector<int64_t>> dataset_view_shapes;
  for (const std::optional<ImageSize>& size : transforms.per_sample.view_sizes()) {
    dataset_view_shapes.push_back({Image::kChannels, size->height, size->width});
  }
  DatasetShape shape;
  shape.view_shapes = view_shapes_after(dataset_view_shapes, transforms.per_batch);
  shape.sample_shape = shape.view_shapes.front();
  shape.num_classes = options.source == "disk_folder"
                          ? static_cast<int64_t>(list_class_folders(options.path).size())
                          : list_images(options).num_classes();
  return shape;
}

// Image files: the transforms fix the size and the class folders name the classes, without
// listing an image; otherwise (a size set by the images, a file list) the files are listed
// and the dataset says, as it will in training.
DatasetShape image_files_shape(const DataSourceOptions& options) {
  if (is_multi_view_list(options.transforms)) {
    return multi_view_image_files_shape(options);
  }
  ImageTransforms transforms = make_image_transforms(options.transforms);
  const std::optional<ImageSize> size = transforms.per_sample.output_size();
  if (size && options.source == "disk_folder") {
    return {transforms.per_batch.output_shape({Image::kChannels, size->height, size->width}),
            static_cast<int64_t>(list_class_folders(options.path).size())};
  }
  const ImageDataset dataset(list_images(options), std::move(transforms.per_sample),
                             options.images);
  return {transforms.per_batch.output_shape(dataset.sample_shape()), dataset.num_classes()};
}

} // namespace

DatasetShape peek_dataset_shape(const DataSourceOptions& options) {
  if (options.source == "synthetic" || options.source == "torchvision_dataset") {
    DatasetShape stored = in_memory_shape(options);
    if (!needs_per_sample_pipeline(options.transforms)) {
      stored.sample_shape = make_pipeline(options.transforms).output_shape(stored.sample_shape);
      return stored;
    }
    DatasetShape shape = in_memory_pipelines_shape(
        make_in_memory_pipelines(options.transforms), stored.sample_shape);
    shape.num_classes = stored.num_classes;
    return shape;
  }
  if (!is_image_source(options.source)) {
    throw ConfigError(fmt::format(
        "unknown data source '{}'; expected torchvision_dataset, synthetic, disk_folder, "
        "disk_filelist or webdataset",
        options.source));
  }
  return image_files_shape(options);
}

namespace {

OpenedDataset open_source(const DataSourceOptions& options, Split split, uint64_t seed) {
  if (options.source == "synthetic") {
    return in_memory(
        [&] {
          return std::make_shared<SyntheticDataset>(
              options.synthetic_num_samples,
              options.synthetic_image_shape,
              options.synthetic_num_classes,
              seed);
        },
        options);
  }
  if (options.source == "torchvision_dataset") {
    const TorchvisionDataset& dataset = torchvision_dataset(options);
    return in_memory([&] { return dataset.load(options, split); }, options);
  }
  if (options.source == "webdataset") {
    auto shards = index_webdataset(options.path.string(), options.images.skip_bad_samples);
    OpenedDataset opened = image_files(shards->list, options);
    opened.shard_sizes = shards->shard_sizes;
    return opened;
  }
  if (is_image_source(options.source)) {
    return image_files(list_images(options), options);
  }
  throw ConfigError(fmt::format(
      "unknown data source '{}'; expected torchvision_dataset, synthetic, disk_folder, "
      "disk_filelist or webdataset",
      options.source));
}

} // namespace

OpenedDataset open_dataset(const DataSourceOptions& options, Split split, uint64_t seed) {
  OpenedDataset opened = open_source(options, split, seed);
  if (options.label_type == "sample_index") {
    opened.dataset = std::make_shared<SampleIndexLabels>(opened.dataset);
  } else if (options.label_type != "standard") {
    throw ConfigError(
        fmt::format("label type '{}'; expected standard or sample_index", options.label_type));
  }
  return opened;
}

std::vector<std::string> torchvision_dataset_names() {
  std::vector<std::string> names;
  for (const TorchvisionDataset& dataset : torchvision_datasets()) {
    names.push_back(dataset.name);
  }
  return names;
}

std::string torchvision_dataset_names_text() {
  std::vector<std::string> names = torchvision_dataset_names();
  const std::string last = names.back();
  names.pop_back();
  return fmt::format("{} or {}", fmt::join(names, ", "), last);
}

} // namespace largo::data
