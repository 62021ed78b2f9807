// Checks between the data and the model, made before any training: what would otherwise fail
// mid-run inside libtorch (a matrix product of the wrong width, a class index past the head)
// or train on nothing ("top-1 0.00 %" from an empty test split).
//
// The model is built for the images its training batches hold, i.e. the dataset's samples
// *after* DATA.TRAIN.TRANSFORMS (a RandomCrop may change their size). split_facts() finds that
// shape by transforming one blank sample with the split's pipeline; check_data_fits_model()
// then refuses, naming the keys:
//   - a split with no samples (the train split always; the test split when TEST_MODEL is on;
//     the message says where the samples come from, not DROP_LAST);
//   - test images with another channel count than the train images;
//   - for trunks whose input size is fixed by their weights (mlp, vision_transformer):
//     non-square images, or test images of another size than the train images (CNNs pool
//     globally and take any size);
//   - test labels beyond the head's width: more test classes than train classes.
// No collectives.
#pragma once

#include <largo/data/dataset.h>
#include <largo/train/trainer_options.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace largo::train {

// One split as the model sees it.
struct SplitFacts {
  std::string key;                  // "DATA.TRAIN" or "DATA.TEST"
  std::string source;               // where the samples come from, for messages
  int64_t num_samples = 0;          // after DATA_LIMIT
  std::vector<int64_t> input_shape; // [C, H, W] of a sample after the split's transforms
  int64_t num_classes = 0;
};

// The facts of a split whose dataset is loaded: `num_samples` is the size of its subset
// (DATA_LIMIT applied). Throws ConfigError naming <key>.TRANSFORMS when the pipeline cannot
// take the dataset's samples (a RandomCrop larger than the padded image, a Normalize with
// another channel count).
SplitFacts split_facts(
    const std::string& key,
    const DataSplitOptions& split,
    const data::Dataset& dataset,
    int64_t num_samples);

// The checks listed above; `test` is nullopt when no evaluation runs (TEST_MODEL False).
// Throws ConfigError (settings that do not fit together) or DataError (a split without
// samples).
void check_data_fits_model(
    const SplitFacts& train, const std::optional<SplitFacts>& test, const std::string& trunk_name);

} // namespace largo::train
