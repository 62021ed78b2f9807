// The YAML -> options mapping of the data keys: DATA.TRAIN / DATA.TEST (one split each:
// source, paths, labels, transforms, sampling, image decoding) and the loader-wide DATA.*
// keys. Library code never reads YAML; this is the one place these keys are read.
#pragma once

#include <largo/core/config.h>
#include <largo/data/dataset_factory.h>
#include <largo/data/transform_spec.h>
#include <largo/train/trainer_options.h>

#include <cstdint>
#include <string>
#include <vector>

namespace largo::train {

// DATA.TRAIN or DATA.TEST (`prefix`) -> a split. Checks every value it reads and throws
// ConfigError naming the key (e.g. "DATA.TRAIN.DATA_SOURCES = [foo]: expected ...").
//   DATA_SOURCES    [torchvision_dataset] | [synthetic] | [disk_folder] | [disk_filelist]
//   DATA_PATHS      one path: the idx/CIFAR folder, the ImageFolder root, the .npy of paths
//   DATASET_NAMES   torchvision_dataset: [MNIST] | [FashionMNIST] | [CIFAR10]; ignored
//                   (a catalog name) for the disk sources
//   LABEL_SOURCES / LABEL_PATHS   disk_filelist: [disk_filelist] and one .npy of labels;
//                   disk_folder: [] or [disk_folder] (labels are the class folders)
//   LABEL_TYPE      standard, or sample_index (labels = indices; self-supervised runs only)
//   REMOVE_IMG_PATH_PREFIX / NEW_IMG_PATH_PREFIX   disk_filelist path rewriting
//   TRANSFORMS      see transforms_from; in DATA.TEST one image per sample (multi-view
//                   transforms are refused: evaluation reads one image each)
//   COLLATE_FUNCTION  default_collate; DATA.TRAIN with multi-view TRANSFORMS
//                   (ImgPilToMultiCrop, ImgReplicatePil) needs multicrop_collator, or
//                   simclr_collator for exactly 2 views of one size, and those two need such
//                   TRANSFORMS. Other collators (VISSL's mixup, cutmix, ...) are refused.
//   SKIP_BAD_SAMPLES, MAX_IMAGE_PIXELS, DCT_SCALING   (Largo extensions) image decoding
//   BATCHSIZE_PER_REPLICA, DROP_LAST, USE_STATEFUL_DISTRIBUTED_SAMPLER, DATA_LIMIT,
//   DATA_LIMIT_SAMPLING.SEED, SYNTHETIC.*
data::DataSplitOptions data_split_from(const Config& config, const std::string& prefix);

// A TRANSFORMS list: each entry a map with `name`; numbers and lists of numbers become
// args, words and booleans (interpolation: bicubic) text_args, lists of lists of numbers
// (ImgPilToMultiCrop's crop_scales: [[0.14, 1], [0.05, 0.14]]) nested_args, and lists of
// transform maps (ImgPilMultiCropRandomApply's transforms) transform_args, each read as an
// entry. Whether a transform takes an argument is checked when it is built
// (data::make_pipeline, make_image_transforms, make_multi_view_transforms).
std::vector<data::TransformSpec> transforms_from(const Config& config, const std::string& key);

// The loader-wide keys (DataLoadingOptions, trainer_options.h).
DataLoadingOptions data_loading_from(const Config& config);

} // namespace largo::train
