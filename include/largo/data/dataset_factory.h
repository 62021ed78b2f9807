// From a split's description (VISSL's DATA.TRAIN / DATA.TEST keys, as typed options) to a
// dataset, the batch transforms its loader applies, and the shape of the batches that come
// out -- the one place that knows every data source:
//   torchvision_dataset  MNIST / FashionMNIST (idx files), CIFAR10 / CIFAR100 / STL10
//                        (binary versions) under `path`
//   synthetic            random images, synthetic_* options
//   disk_folder          an ImageFolder tree at `path` (image_list.h)
//   disk_filelist        a .npy of image paths at `path`, a .npy of labels at `label_path`
//                        (none with label_type sample_index and no label_path)
//   webdataset           tar shards named by `path`, a glob or brace pattern
//                        (webdataset_index.h); read in WebDatasetSampler's order
// For image files the transforms before ToTensor run per sample inside the dataset
// (sample_pipeline.h) and the rest per batch in the loader. An in-memory dataset whose list
// holds only batch transforms (is_batch_transform: RandomCrop, RandomHorizontalFlip, ToTensor,
// Normalize) runs them on whole batches of the stored tensor; any other list runs as for
// image files, each stored image through the per-sample pipeline (in_memory_image_dataset.h),
// after a leading MNISTImgPil2RGB that makes a gray image RGB.
//
// A transform list that makes several views per sample (ImgPilToMultiCrop, ImgReplicatePil;
// is_multi_view_list, multi_view_pipeline.h) cuts the views from each image, and the dataset
// delivers Batch::views, one tensor per view.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "largo/data/dataset.h"
#include "largo/data/image_dataset.h"
#include "largo/data/transforms.h"

namespace largo::data {

struct DataSourceOptions {
  std::string source = "torchvision_dataset"; // DATA_SOURCES[0]
  std::string dataset_name = "FashionMNIST";  // DATASET_NAMES[0], torchvision_dataset only
  // DATA_PATHS[0]; webdataset: the shard list, e.g. "/data/train-{000000..000127}.tar"
  std::filesystem::path path = "/usr/share/datasets/fashion-mnist";
  // LABEL_PATHS[0], disk_filelist only; empty (LABEL_SOURCES []) only with label_type
  // sample_index: then no labels are read.
  std::filesystem::path label_path;
  // COPY_TO_LOCAL_DISK with COPY_DESTINATION_DIR: a directory on the machine's own disk that
  // `path` and `label_path` are copied into before the data is opened (data/local_copy.h);
  // empty: read them where they are. The copy is the caller's to make (a trainer makes it
  // once per machine: train/local_data_copy.h); open_dataset() reads `path` as given.
  std::filesystem::path local_copy_dir;
  // disk_filelist: a path starting with remove_path_prefix gets new_path_prefix instead
  // (REMOVE_IMG_PATH_PREFIX / NEW_IMG_PATH_PREFIX).
  std::string remove_path_prefix;
  std::string new_path_prefix;
  std::vector<TransformSpec> transforms; // TRANSFORMS
  // LABEL_TYPE: "standard" (labels from the source) or "sample_index" (each sample's index:
  // data/sample_index_labels.h).
  std::string label_type = "standard";
  // synthetic (SYNTHETIC.*)
  int64_t synthetic_num_samples = 2048;
  std::vector<int64_t> synthetic_image_shape{3, 32, 32};
  int64_t synthetic_num_classes = 10;
  // disk_folder / disk_filelist / webdataset: decoding limits and bad-file handling.
  // skip_bad_samples also lets a disk_folder keep class folders without images, and a
  // webdataset drop samples without a label or image and the rest of a truncated shard.
  ImageDatasetOptions images;
};

// One split with its sampling and batching (the split-level keys of DATA.TRAIN/DATA.TEST).
struct DataSplitOptions {
  DataSourceOptions source;
  // COLLATE_FUNCTION: default_collate (one image per sample), or VISSL's multicrop_collator
  // (SwAV) / simclr_collator (SimCLR) / moco_collator (MoCo: view 0 for the encoder, view 1
  // for the momentum encoder) for a multi-view source. The loader delivers
  // Batch::views, one tensor per view, for both; simclr_collator's one tensor of two
  // same-size views, view 0's samples then view 1's, is their concatenation.
  std::string collate = "default_collate";
  int64_t batch_size = 256;          // BATCHSIZE_PER_REPLICA
  bool drop_last = false;            // DROP_LAST
  bool use_stateful_sampler = false; // USE_STATEFUL_DISTRIBUTED_SAMPLER
  int64_t data_limit = -1;           // DATA_LIMIT (-1: all samples)
  uint64_t data_limit_seed = 0;      // DATA_LIMIT_SAMPLING.SEED
  // webdataset (training): samples each stream shuffles in (WEBDATASET.SHUFFLE_BUFFER;
  // WebDatasetSamplerOptions::shuffle_buffer).
  int64_t shuffle_buffer = 1000;
};

struct OpenedDataset {
  std::shared_ptr<const Dataset> dataset;
  // For DataLoaderOptions::transforms.
  TransformPipeline transforms;
  // [channels, h, w] of the batches the loader delivers (after every transform): what a
  // model's input layer must accept.
  std::vector<int64_t> sample_shape;
  // A multi-view source: [channels, h, w] of each view's batches, in view order (sample_shape
  // is view 0's). Empty for one view per sample.
  std::vector<std::vector<int64_t>> view_shapes;
  int64_t num_classes = 0;
  // webdataset: the samples of each shard, in dataset index order (WebDatasetSampler's
  // input). Empty for the other sources.
  std::vector<int64_t> shard_sizes;
};

// What a split delivers, known without loading a sample: the shape of its batches' samples
// (after every transform) and its class count. The built-in datasets' shapes are fixed, a
// synthetic split says its own; for image files the transforms fix the size, and the class
// folders (disk_folder) or the label file (disk_filelist) the classes. For a config's checks
// and `largo estimate`. Throws ConfigError for a bad transform or source, DataError for a
// missing class folder root or label file.
struct DatasetShape {
  std::vector<int64_t> sample_shape; // [channels, h, w]; multi-view: view 0's
  int64_t num_classes = 0;
  // [channels, h, w] of each view, as OpenedDataset::view_shapes; empty for one view.
  std::vector<std::vector<int64_t>> view_shapes{};
};
DatasetShape peek_dataset_shape(const DataSourceOptions& options);

// The dataset names of the torchvision_dataset source (DataSourceOptions::dataset_name), as
// torchvision spells them, and as one phrase: "MNIST, FashionMNIST, ... or STL10".
std::vector<std::string> torchvision_dataset_names();
std::string torchvision_dataset_names_text();

// Opens a split. `seed` seeds the synthetic source. Throws ConfigError for an unknown source
// or dataset name, a missing label path or a bad transform (before any file is read);
// DataError for missing or malformed files.
OpenedDataset open_dataset(const DataSourceOptions& options, Split split, uint64_t seed);

} // namespace largo::data
