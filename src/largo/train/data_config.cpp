#include <largo/train/data_config.h>

#include "config_checks.h"

#include <largo/core/config_value.h>
#include <largo/core/resources.h>
#include <largo/data/multi_view_pipeline.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace largo::train {
namespace {

std::string list_text(const std::vector<std::string>& values) {
  return fmt::format("[{}]", fmt::join(values, ", "));
}

// The single entry of a one-element list key.
std::string single(const Config& config, const std::string& key, const std::string& expected) {
  const std::vector<std::string> values = config.get_string_list(key);
  require(values.size() == 1, key, list_text(values), expected);
  return values[0];
}

// A disk_filelist's LABEL_SOURCES: [disk_filelist] reads LABEL_PATHS; [] reads no labels,
// which only LABEL_TYPE sample_index can train with (VISSL's self-supervised configs on
// unlabeled lists). The catalog may have filled LABEL_PATHS for [] (VISSL's catalog does the
// same, and VISSL reads them only for a label source); a LABEL_PATHS written in the config
// beside [] is refused rather than ignored.
void read_filelist_labels(
    const Config& config,
    const std::string& prefix,
    const std::vector<std::string>& label_sources,
    data::DataSourceOptions& source) {
  source.remove_path_prefix = config.get_string(prefix + ".REMOVE_IMG_PATH_PREFIX");
  source.new_path_prefix = config.get_string(prefix + ".NEW_IMG_PATH_PREFIX");
  if (label_sources == std::vector<std::string>{"disk_filelist"}) {
    source.label_path = single(config, prefix + ".LABEL_PATHS", "one .npy file of labels");
    return;
  }
  require(
      label_sources.empty(),
      prefix + ".LABEL_SOURCES",
      list_text(label_sources),
      "[disk_filelist] with LABEL_PATHS naming the .npy of labels, or [] with LABEL_TYPE "
      "sample_index (no labels read)");
  require(
      source.label_type == "sample_index",
      prefix + ".LABEL_SOURCES",
      "[]",
      fmt::format(
          "[disk_filelist] with LABEL_PATHS: {}.LABEL_TYPE = {} takes its labels from "
          "LABEL_SOURCES; or LABEL_TYPE sample_index (a self-supervised loss), which reads none",
          prefix,
          source.label_type));
  const std::vector<std::string> paths = config.get_string_list(prefix + ".LABEL_PATHS");
  require(
      paths.empty() || !config.given(prefix + ".LABEL_PATHS"),
      prefix + ".LABEL_PATHS",
      list_text(paths),
      "unset with LABEL_SOURCES []: no labels are read; set LABEL_SOURCES [disk_filelist] to "
      "read them");
}

// DATA_SOURCES, DATASET_NAMES, DATA_PATHS and the label keys.
void read_source(const Config& config, const std::string& prefix, data::DataSourceOptions& source) {
  source.source = single(
      config,
      prefix + ".DATA_SOURCES",
      "exactly one source: [torchvision_dataset], [synthetic], [disk_folder], [disk_filelist] or "
      "[webdataset]");
  const std::string& kind = source.source;
  require(
      kind == "torchvision_dataset" || kind == "synthetic" || kind == "disk_folder" ||
          kind == "disk_filelist" || kind == "webdataset",
      prefix + ".DATA_SOURCES",
      list_text({kind}),
      "[torchvision_dataset], [synthetic], [disk_folder], [disk_filelist] or [webdataset]");
  if (kind != "disk_filelist") { // keys only a file list reads: refused rather than ignored
    for (const char* key : {".LABEL_PATHS", ".REMOVE_IMG_PATH_PREFIX", ".NEW_IMG_PATH_PREFIX"}) {
      const YAML::Node value = config.node(prefix + key);
      require(
          value.IsNull() || (value.IsScalar() && value.Scalar().empty()) ||
              (value.IsSequence() && value.size() == 0),
          prefix + key,
          "(given)",
          "unset: it applies to DATA_SOURCES [disk_filelist] only");
    }
  }
  if (kind == "synthetic") {
    return;
  }
  if (kind == "torchvision_dataset") {
    const std::string names = data::torchvision_dataset_names_text();
    source.dataset_name = single(config, prefix + ".DATASET_NAMES", "one name: " + names);
    const std::vector<std::string> known = data::torchvision_dataset_names();
    require(
        std::find(known.begin(), known.end(), source.dataset_name) != known.end(),
        prefix + ".DATASET_NAMES",
        source.dataset_name,
        names);
  }
  source.path = single(
      config,
      prefix + ".DATA_PATHS",
      kind == "disk_filelist" ? "one .npy file of image paths"
      : kind == "disk_folder" ? "one folder holding a subfolder per class"
      : kind == "webdataset"  ? "one shard list: tar files as a glob or brace pattern, e.g. "
                                "/data/train-{000000..000127}.tar"
                              : "one directory holding the dataset's files");
  source.label_type = config.get_string(prefix + ".LABEL_TYPE");
  require(
      source.label_type == "standard" || source.label_type == "sample_index",
      prefix + ".LABEL_TYPE",
      source.label_type,
      "standard (labels from LABEL_SOURCES) or sample_index (each image's index, for a "
      "self-supervised loss; VISSL's zero labels are not supported)");
  const std::vector<std::string> label_sources = config.get_string_list(prefix + ".LABEL_SOURCES");
  if (!label_sources.empty() && source.label_type == "sample_index") {
    // VISSL's rule (its defaults.yaml, LABEL_TYPE): labels a LABEL_SOURCES gives override
    // LABEL_TYPE, so the images get their source's labels, not their indices.
    spdlog::info(
        "config key {}.LABEL_TYPE = sample_index: {}.LABEL_SOURCES = {} gives the labels "
        "instead, as in VISSL",
        prefix,
        prefix,
        list_text(label_sources));
    source.label_type = "standard";
  }
  if (kind == "disk_filelist") {
    read_filelist_labels(config, prefix, label_sources, source);
  } else if (kind == "disk_folder" || kind == "webdataset") {
    require(
        label_sources.empty() || label_sources == std::vector<std::string>{kind},
        prefix + ".LABEL_SOURCES",
        list_text(label_sources),
        kind == "disk_folder" ? "[] or [disk_folder] (labels are the class folders)"
                              : "[] or [webdataset] (labels are the samples' .cls members)");
  }
}

// COPY_TO_LOCAL_DISK and COPY_DESTINATION_DIR (docs/data.md). As in VISSL, the directory
// matters only with the switch on (VISSL's configs name one beside a False switch).
void read_local_copy(
    const Config& config, const std::string& prefix, data::DataSourceOptions& source) {
  const std::string destination = config.get_string(prefix + ".COPY_DESTINATION_DIR");
  if (!config.get_bool(prefix + ".COPY_TO_LOCAL_DISK")) {
    return;
  }
  require(
      !destination.empty(),
      prefix + ".COPY_DESTINATION_DIR",
      "\"\"",
      "a directory on the machine's local disk, e.g. /tmp/imagenet1k (VISSL makes a temporary "
      "one; the ranks of a machine share the copy, so Largo needs it named)");
  require(
      source.source != "synthetic" && source.source != "webdataset",
      prefix + ".COPY_TO_LOCAL_DISK",
      "True",
      fmt::format(
          "False with DATA_SOURCES [{}]: {}",
          source.source,
          source.source == "synthetic" ? "it has no files to copy"
                                       : "its shards are streamed, not copied"));
  source.local_copy_dir = destination;
}

// DATA.TRAIN with DATA_SOURCES [webdataset]: its shuffle buffer, and the keys that would
// change its streaming order, refused rather than ignored (docs/data.md).
void read_webdataset_order(
    const Config& config, const std::string& prefix, data::DataSplitOptions& split) {
  if (prefix != "DATA.TRAIN") {
    return; // DATA.TEST is read in index order, as every test split
  }
  split.shuffle_buffer = positive_int(config, prefix + ".WEBDATASET.SHUFFLE_BUFFER");
  if (split.source.source != "webdataset") {
    require(
        split.shuffle_buffer == data::DataSplitOptions{}.shuffle_buffer,
        prefix + ".WEBDATASET.SHUFFLE_BUFFER",
        std::to_string(split.shuffle_buffer),
        fmt::format(
            "unset ({}): it applies to DATA_SOURCES [webdataset] only",
            data::DataSplitOptions{}.shuffle_buffer));
    return;
  }
  require(
      split.data_limit == -1,
      prefix + ".DATA_LIMIT",
      std::to_string(split.data_limit),
      "-1 with DATA_SOURCES [webdataset]: its epochs stream whole shards, not a subset of "
      "samples; list fewer shards in DATA_PATHS instead");
  require(
      !split.use_stateful_sampler,
      prefix + ".USE_STATEFUL_DISTRIBUTED_SAMPLER",
      "True",
      "False with DATA_SOURCES [webdataset]: its order is its own (shards per rank and loader "
      "thread, a shuffle buffer), and it resumes mid-epoch without VISSL's sampler");
}

void read_image_options(
    const Config& config, const std::string& prefix, data::ImageDatasetOptions& images) {
  images.skip_bad_samples = config.get_bool(prefix + ".SKIP_BAD_SAMPLES");
  images.decode.max_pixels = config.get_int(prefix + ".MAX_IMAGE_PIXELS");
  require(
      images.decode.max_pixels >= 0,
      prefix + ".MAX_IMAGE_PIXELS",
      std::to_string(images.decode.max_pixels),
      "a pixel count >= 0 (0: no limit)");
  images.decode.dct_scaling = config.get_bool(prefix + ".DCT_SCALING");
}

} // namespace

namespace {

data::TransformSpec read_transform(const YAML::Node& entry, const std::string& entry_key);

// A list argument, read by its first element's kind: numbers (mean: [0.485, 0.456, 0.406]),
// lists of numbers (ImgPilToMultiCrop's crop_scales: [[0.14, 1], [0.05, 0.14]]) or transforms
// (ImgPilMultiCropRandomApply's transforms: [{name: ...}, ...]). An element of another kind
// fails where it is read, naming it.
void read_list_argument(
    const YAML::Node& list,
    const std::string& arg_name,
    const std::string& arg_key,
    data::TransformSpec& spec) {
  const YAML::Node first = list.size() > 0 ? list[0] : YAML::Node();
  if (first.IsSequence()) {
    std::vector<std::vector<double>>& rows = spec.nested_args[arg_name];
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string row_key = fmt::format("{}[{}]", arg_key, i);
      const YAML::Node row = list[i];
      require(
          row.IsSequence(),
          row_key,
          config_value_text(row),
          "a list of numbers like the first entry: a list of lists, e.g. [[0.14, 1], [0.05, "
          "0.14]]");
      std::vector<double>& values = rows.emplace_back();
      for (size_t j = 0; j < row.size(); ++j) {
        values.push_back(yaml_to_double(row[j], fmt::format("{}[{}]", row_key, j)));
      }
    }
  } else if (first.IsMap()) {
    std::vector<data::TransformSpec>& transforms = spec.transform_args[arg_name];
    for (size_t i = 0; i < list.size(); ++i) {
      transforms.push_back(read_transform(list[i], fmt::format("{}[{}]", arg_key, i)));
    }
  } else {
    std::vector<double>& values = spec.args[arg_name];
    for (const auto& element : list) {
      values.push_back(yaml_to_double(element, arg_key));
    }
  }
}

// One {name: ..., ...} map (a TRANSFORMS entry, or one nested in an argument).
data::TransformSpec read_transform(const YAML::Node& entry, const std::string& entry_key) {
  if (!entry.IsMap() || !entry["name"] || !entry["name"].IsScalar()) {
    throw config_error(entry_key, "(entry)", "a map with a 'name' key, e.g. {name: ToTensor}");
  }
  data::TransformSpec spec;
  spec.name = entry["name"].Scalar();
  for (const auto& argument : entry) {
    const std::string arg_name = argument.first.as<std::string>();
    if (arg_name == "name") {
      continue;
    }
    const std::string arg_key = fmt::format("{}.{}", entry_key, arg_name);
    const YAML::Node& value = argument.second;
    if (value.IsScalar() && !yaml_scalar_is_number(value)) {
      spec.text_args[arg_name] = value.Scalar(); // a word or a boolean
    } else if (value.IsSequence()) {
      read_list_argument(value, arg_name, arg_key, spec);
    } else {
      spec.args[arg_name] = {yaml_to_double(value, arg_key)};
    }
  }
  return spec;
}

} // namespace

std::vector<data::TransformSpec> transforms_from(const Config& config, const std::string& key) {
  std::vector<data::TransformSpec> specs;
  const YAML::Node list = config.node(key);
  if (!list.IsSequence()) {
    throw config_error(key, "(not a list)", "a list of {name: ..., ...} maps");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    specs.push_back(read_transform(list[i], fmt::format("{}[{}]", key, i)));
  }
  return specs;
}

namespace {

// Bounds before work: what a synthetic split asks for, against the machine's memory. A batch
// is held as uint8 and float32 by the loader and the model; the samplers order every index.
void check_synthetic_fits_machine(const data::DataSplitOptions& split, const std::string& prefix) {
  const data::DataSourceOptions& source = split.source;
  const auto& shape = source.synthetic_image_shape;
  const auto batch = static_cast<uint64_t>(split.batch_size);
  require_memory(
      saturating_product(
          {batch,
           static_cast<uint64_t>(shape[0]),
           static_cast<uint64_t>(shape[1]),
           static_cast<uint64_t>(shape[2]),
           1 + 4}),
      fmt::format(
          "a batch of {}.BATCHSIZE_PER_REPLICA = {} images of {}.SYNTHETIC.IMAGE_SHAPE = "
          "[{}]",
          prefix,
          split.batch_size,
          prefix,
          fmt::join(shape, ", ")));
  require_memory(
      saturating_product({static_cast<uint64_t>(source.synthetic_num_samples), 16}),
      fmt::format(
          "the samplers' index order over {}.SYNTHETIC.NUM_SAMPLES = {}",
          prefix,
          source.synthetic_num_samples));
  // A batch's logits, their gradient and the softmax: one float per class and sample each.
  require_memory(
      saturating_product({batch, static_cast<uint64_t>(source.synthetic_num_classes), 4 * 3}),
      fmt::format(
          "the logits of a batch of {} for {}.SYNTHETIC.NUM_CLASSES = {}",
          split.batch_size,
          prefix,
          source.synthetic_num_classes));
}

// DATA.TEST is scored one image per sample: a list that makes several views is refused at
// the entry that makes them.
void refuse_views_in_test(
    const std::vector<data::TransformSpec>& transforms, const std::string& key) {
  for (size_t i = 0; i < transforms.size(); ++i) {
    require(
        !data::is_multi_view_transform(transforms[i].name),
        fmt::format("{}[{}].name", key, i),
        transforms[i].name,
        "a one-image transform: evaluation reads one image per sample, so multi-view "
        "transforms (ImgPilToMultiCrop, ImgReplicatePil, ImgPilMultiCropRandomApply) belong in "
        "DATA.TRAIN only; give DATA.TEST a one-view list, e.g. Resize, CenterCrop, ToTensor, "
        "Normalize");
  }
}

// The size of each view a multi-view TRANSFORMS list makes, built as the loader builds it
// (its errors said with the key).
std::vector<data::ImageSize>
view_sizes_of(const std::vector<data::TransformSpec>& transforms, const std::string& key) {
  try {
    std::vector<data::ImageSize> sizes;
    for (const auto& size : data::make_multi_view_transforms(transforms).per_sample.view_sizes()) {
      sizes.push_back(*size); // make_multi_view_transforms refuses a size left open
    }
    return sizes;
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("config key {}: {}", key, e.what()));
  }
}

// simclr_collator stacks the two views of each sample into one tensor (simclr_collate);
// moco_collator hands view 0 to the encoder and view 1 to the momentum encoder.
void check_two_views(
    const std::vector<data::TransformSpec>& transforms,
    const std::string& prefix,
    const std::string& collator) {
  const std::vector<data::ImageSize> sizes = view_sizes_of(transforms, prefix + ".TRANSFORMS");
  std::vector<std::string> texts;
  for (const data::ImageSize& size : sizes) {
    texts.push_back(fmt::format("{}x{}", size.height, size.width));
  }
  require(
      sizes.size() == 2 && sizes[0] == sizes[1],
      prefix + ".COLLATE_FUNCTION",
      collator,
      fmt::format(
          "2 views of one size, but {}.TRANSFORMS makes {} (h x w: {}); for SimCLR or MoCo use "
          "ImgReplicatePil num_times 2 followed by a fixed-size crop (RandomResizedCrop size "
          "224), or multicrop_collator for crops of several sizes",
          prefix,
          sizes.size(),
          fmt::join(texts, ", ")));
}

// COLLATE_FUNCTION, against the views TRANSFORMS makes. Both multi-view collators reach the
// model as Batch::views, one tensor per view: the model concatenates the views of one
// resolution, which for simclr_collator's 2 views is simclr_collator's own order (view 0's
// samples, then view 1's).
std::string read_collate(
    const Config& config,
    const std::string& prefix,
    const std::vector<data::TransformSpec>& transforms) {
  const std::string key = prefix + ".COLLATE_FUNCTION";
  const std::string name = config.get_string(key);
  const bool views_collator =
      name == "multicrop_collator" || name == "simclr_collator" || name == "moco_collator";
  if (name != "default_collate" && !views_collator) {
    throw ConfigError(fmt::format(
        "config key {} = {}: this collate function is not available in this version of Largo; "
        "set it to default_collate, or to multicrop_collator, simclr_collator or moco_collator "
        "for multi-view TRANSFORMS in DATA.TRAIN",
        key,
        abbreviate(name)));
  }
  if (!data::is_multi_view_list(transforms)) {
    require(
        !views_collator,
        key,
        name,
        prefix == "DATA.TEST"
            ? "default_collate: evaluation reads one image per sample"
            : fmt::format(
                  "default_collate: {} collates several views per sample, but {}.TRANSFORMS "
                  "makes one; add ImgPilToMultiCrop (SwAV) or ImgReplicatePil (SimCLR) to "
                  "TRANSFORMS, or set default_collate",
                  name,
                  prefix));
    return name;
  }
  require(
      views_collator,
      key,
      name,
      fmt::format(
          "multicrop_collator, simclr_collator or moco_collator: {}.TRANSFORMS makes several "
          "views per sample, which default_collate cannot stack into one batch (VISSL fails there "
          "too)",
          prefix));
  if (name == "simclr_collator" || name == "moco_collator") {
    check_two_views(transforms, prefix, name);
  }
  return name;
}

} // namespace

data::DataSplitOptions data_split_from(const Config& config, const std::string& prefix) {
  data::DataSplitOptions split;
  data::DataSourceOptions& source = split.source;
  read_source(config, prefix, source);
  read_local_copy(config, prefix, source);
  read_image_options(config, prefix, source.images);
  source.transforms = transforms_from(config, prefix + ".TRANSFORMS");
  if (prefix == "DATA.TEST") {
    refuse_views_in_test(source.transforms, prefix + ".TRANSFORMS");
  }
  split.collate = read_collate(config, prefix, source.transforms);
  source.synthetic_num_samples = positive_int(config, prefix + ".SYNTHETIC.NUM_SAMPLES");
  source.synthetic_image_shape = config.get_int_list(prefix + ".SYNTHETIC.IMAGE_SHAPE");
  const auto& shape = source.synthetic_image_shape;
  require(
      shape.size() == 3 && std::all_of(shape.begin(), shape.end(), [](int64_t d) { return d > 0; }),
      prefix + ".SYNTHETIC.IMAGE_SHAPE",
      fmt::format("[{}]", fmt::join(shape, ", ")),
      "[channels, height, width], each > 0");
  source.synthetic_num_classes = positive_int(config, prefix + ".SYNTHETIC.NUM_CLASSES");

  split.batch_size = positive_int(config, prefix + ".BATCHSIZE_PER_REPLICA");
  split.drop_last = config.get_bool(prefix + ".DROP_LAST");
  split.use_stateful_sampler = config.get_bool(prefix + ".USE_STATEFUL_DISTRIBUTED_SAMPLER");
  split.data_limit = config.get_int(prefix + ".DATA_LIMIT");
  require(
      split.data_limit == -1 || split.data_limit > 0,
      prefix + ".DATA_LIMIT",
      std::to_string(split.data_limit),
      "-1 (all samples) or a count > 0");
  split.data_limit_seed =
      static_cast<uint64_t>(config.get_int(prefix + ".DATA_LIMIT_SAMPLING.SEED"));
  read_webdataset_order(config, prefix, split);
  if (source.source == "synthetic") {
    check_synthetic_fits_machine(split, prefix);
  }
  return split;
}

DataLoadingOptions data_loading_from(const Config& config) {
  DataLoadingOptions loading;
  loading.num_workers = config.get_int("DATA.NUM_DATALOADER_WORKERS");
  require(
      loading.num_workers >= 0,
      "DATA.NUM_DATALOADER_WORKERS",
      std::to_string(loading.num_workers),
      "an integer >= 0 (0 loads in the training thread)");
  // Loader workers are threads that mostly wait on reads: a few per core help, thousands
  // exhaust the process's threads. A config written for a bigger machine (VISSL's set 10
  // per GPU) runs here with what this one has; a count no machine could mean is an error.
  constexpr int64_t kMostWorkersAnyMachine = 4096;
  if (loading.num_workers > kMostWorkersAnyMachine) {
    throw ResourceError(fmt::format(
        "config key DATA.NUM_DATALOADER_WORKERS = {}: expected at most {} (loader threads of "
        "one process; 4 per core help at most)",
        loading.num_workers,
        kMostWorkersAnyMachine));
  }
  const int64_t limit = 4 * available_cpu_cores();
  if (loading.num_workers > limit) {
    spdlog::warn(
        "config key DATA.NUM_DATALOADER_WORKERS = {}: this machine gives the process {} "
        "core(s), so {} loader threads are used (4 per core)",
        loading.num_workers,
        available_cpu_cores(),
        limit);
    loading.num_workers = limit;
  }
  loading.pin_memory = config.get_bool("DATA.PIN_MEMORY");
  loading.async_gpu_copy = config.get_bool("DATA.ENABLE_ASYNC_GPU_COPY");
  return loading;
}

} // namespace largo::train
