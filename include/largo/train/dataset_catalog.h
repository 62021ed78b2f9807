// VISSL's dataset catalog: a JSON file (VISSL's configs/config/dataset_catalog.json) that
// names datasets, so that a config says DATASET_NAMES: [imagenet1k_folder] and not where the
// data is. Each entry gives, for the "train" and "val" splits, [images, labels]:
//
//   {"imagenet1k_folder": {"train": ["/data/in1k/train", "<unused>"],
//                          "val":   ["/data/in1k/val", "<unused>"]},
//    "in1k_filelist":     {"train": ["/data/train_images.npy", "/data/train_labels.npy"],
//                          "val":   ["/data/val_images.npy", "/data/val_labels.npy"]}}
//
// The images are what DATA_PATHS would hold for the split's source (a class-folder tree, a
// .npy of paths, a torchvision root, a shard pattern), the labels what LABEL_PATHS would (a
// file list's .npy). DATA.TRAIN reads "train", DATA.TEST "val", as VISSL's get_data_files.
// Which file: $VISSL_DATASET_CATALOG_PATH (VISSL's variable; it must exist when set), else
// config/dataset_catalog.json under the config root (config_composition.h), when it exists.
#pragma once

#include <largo/core/config.h>

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace largo::train {

struct CatalogSplit {
  std::string images;
  std::string labels;
};

class DatasetCatalog {
 public:
  // Reads `file`; throws ConfigError naming it when it is not a map of that shape.
  static DatasetCatalog read(const std::filesystem::path& file);

  const std::filesystem::path& file() const {
    return file_;
  }
  // `split` ("train" or "val") of dataset `name`; nullopt when the catalog lacks either.
  std::optional<CatalogSplit> find(const std::string& name, const std::string& split) const;
  std::vector<std::string> names() const;

 private:
  std::filesystem::path file_;
  std::map<std::string, std::map<std::string, CatalogSplit>> datasets_;
};

// The catalog's file as the header says; nullopt when there is none. Throws ConfigError when
// $VISSL_DATASET_CATALOG_PATH names no file. `getenv` is for tests.
std::optional<std::filesystem::path> find_dataset_catalog(
    const std::filesystem::path& config_root,
    const std::function<const char*(const char*)>& getenv = nullptr);

// For DATA.TRAIN and DATA.TEST: a split whose DATASET_NAMES a config gave (other than Largo's
// default) and whose DATA_PATHS none gave reads its paths from the catalog: DATA_PATHS the
// datasets' images and, for a disk_filelist without given LABEL_PATHS, LABEL_PATHS their
// labels. Synthetic splits are left as they are.
// Returns a line per split resolved for the log ("DATA.TRAIN.DATASET_NAMES [in1k_folder]
// through the catalog /x/dataset_catalog.json: DATA_PATHS [/data/in1k/train]"). Throws
// ConfigError naming the split's DATASET_NAMES, the dataset and the catalog file (or how to
// give one) when a name cannot be resolved: never Largo's default path.
std::vector<std::string>
resolve_dataset_names(Config& config, const std::optional<std::filesystem::path>& catalog_file);

} // namespace largo::train
