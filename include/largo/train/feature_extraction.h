// Feature extraction (`largo extract`, docs/feature_extraction.md): VISSL's extract_features
// engine. The run's model — built as the trainer builds it, holding the weights `largo eval`
// would evaluate — reads every sample of DATA.TRAIN and DATA.TEST once, in evaluation mode
// without gradients, and each rank writes what it computed as VISSL's .npy files:
//
//   rank{r}_chunk0_{split}_{name}_features.npy   float32 [N, D]: each sample's output, flattened
//   rank{r}_chunk0_{split}_{name}_targets.npy    int64 [N]: its label
//   rank{r}_chunk0_{split}_{name}_inds.npy       int64 [N]: its index in the dataset
//
// `split` is train or test: train unless TEST_ONLY, test when TEST_MODEL (VISSL's
// available_splits). `name` says what the features are (extracted_feature_names):
//   EXTRACT_TRUNK_FEATURES_ONLY True    each LINEAR_EVAL_FEAT_POOL_OPS_MAP feature by its VISSL
//                                       name (res4, res5avg, ...; a repeated name gets _1, _2
//                                       as VISSL does), or "trunk" (the trunk's output) without
//   EXTRACT_TRUNK_FEATURES_ONLY False   the heads' outputs: "heads", or heads0, heads1, ... for
//                                       a linear evaluation's several heads
// One chunk per rank and split (VISSL's default CHUNK_THRESHOLD -1: all in memory).
//
// Weights, as `largo eval` chooses them: the newest intact checkpoint of CHECKPOINT.DIR (its
// "model" entry), else MODEL.WEIGHTS_INIT.PARAMS_FILE, else a ConfigError. Rank r reads samples
// r, r + world_size, ... of each split (after DATA_LIMIT), unshuffled and unpadded, with the
// split's TRANSFORMS and BATCHSIZE_PER_REPLICA (DROP_LAST does not apply: every sample once).
// The model runs in float32 on every rank whole: mixed precision, SyncBatchNorm (the same as
// BatchNorm in evaluation mode), DDP, ZeRO and FSDP are not applied.
//
// Files are written atomically (data/npy.h), so an interrupted extraction leaves no half file;
// the files of an earlier extraction of the same splits and names that this one would not
// replace (more ranks, later chunks, a split a rank now has no sample of) are removed.
//
// Collectives: extract_features() ends with one barrier (when it returns on any rank, every
// rank's files are written); call it on every rank of the group.
#pragma once

#include <largo/comm/process_group.h>
#include <largo/core/config.h>
#include <largo/models/linear_eval.h>
#include <largo/train/run_plan.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace largo::train {

// The three files of one split and name, as this rank wrote them.
struct ExtractedArrays {
  std::string split; // "train" | "test"
  std::string name;  // res4, trunk, heads, heads0, ...
  std::filesystem::path features_file;
  std::filesystem::path targets_file;
  std::filesystem::path inds_file;
  std::vector<int64_t> features_shape; // [N, D]; targets and inds are [N]
};

struct ExtractionResult {
  std::filesystem::path weights_file; // the checkpoint or MODEL.WEIGHTS_INIT.PARAMS_FILE read
  std::filesystem::path output_dir;
  int rank = 0;
  int world_size = 1;
  std::vector<ExtractedArrays> written; // this rank's, train's first
  // Splits of which this rank had no sample: no files for them (as VISSL writes none).
  std::vector<std::string> empty_splits;

  // One line per split and name: what was written where, with the shapes.
  std::string describe() const;
};

// A config resolved for extraction: as resolve_run(config), except that
// MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_AND_HEAD (without FREEZE_TRUNK_ONLY) is read as
// FREEZE_TRUNK_ONLY. resolve_run refuses it outside TEST_ONLY, since a training run would
// change nothing; but nothing trains here, both build the same forward in evaluation mode,
// and VISSL's extraction configs (its kNN benchmarks) freeze the whole model that way.
// Throws what resolve_run throws, and the ConfigError "nothing to extract from" when
// CHECKPOINT.DIR holds no checkpoint file and MODEL.WEIGHTS_INIT.PARAMS_FILE is empty.
RunPlan resolve_extraction(Config config);

// Extracts as described above into `output_dir` (empty: CHECKPOINT.DIR), created if needed.
// Without a `group`, the launcher's environment decides (as for the Trainer). Throws
// ConfigError when there are no weights to extract from, when MODEL.WEIGHTS_INIT would leave
// the heads whose outputs are asked for unloaded, or for an output directory that cannot be
// written; CheckpointError for a checkpoint or weights file that does not load or does not
// fit the model; DataError for missing data.
ExtractionResult extract_features(
    const RunPlan& plan,
    std::shared_ptr<comm::ProcessGroup> group = nullptr,
    const std::filesystem::path& output_dir = {});

// The names of the extracted outputs, in the order the model produces them (see above).
std::vector<std::string> extracted_feature_names(const models::FeatureEvalOptions& options);

// VISSL's file name: rank{rank}_chunk0_{split}_{name}_{array}.npy, array being features,
// targets or inds.
std::string extracted_file_name(
    int rank, const std::string& split, const std::string& name, const std::string& array);

} // namespace largo::train
