#include <largo/train/feature_extraction.h>

#include "run_environment.h"
#include <largo/checkpoint/weights_init.h>
#include <largo/core/error.h>
#include <largo/core/rng_state.h>
#include <largo/data/npy.h>
#include <largo/models/model_factory.h>
#include <largo/train/local_data_copy.h>
#include <largo/train/option_keys.h>
#include <largo/train/resume_policy.h>
#include <largo/train/training_data.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <regex>

namespace largo::train {
namespace fs = std::filesystem;
namespace {

// VISSL's _to_unique_feature_names: two taps of one feature (pooled differently) would write
// the same file; the later ones get _1, _2, ...: [res4, res4, res5] -> [res4, res4_1, res5].
std::vector<std::string> unique_names(const std::vector<std::string>& names) {
  std::map<std::string, int> seen;
  std::vector<std::string> unique;
  for (const auto& name : names) {
    const int index = seen[name]++;
    unique.push_back(index == 0 ? name : fmt::format("{}_{}", name, index));
  }
  return unique;
}

// The model as the trainer builds it (models::build_run_model, seeded with SEED_VALUE), and
// what extraction reads of it.
struct ExtractionModel {
  models::RunModel run;

  explicit ExtractionModel(const RunPlan& plan) {
    seed_everything(plan.options.seed);
    run = models::build_run_model(plan.model);
  }

  torch::nn::Module& module() {
    return *run.module();
  }

  // images -> the outputs extracted_feature_names() names, in its order.
  std::vector<at::Tensor> outputs(const at::Tensor& images, bool trunk_only) {
    if (run.linear_eval) {
      return trunk_only ? run.linear_eval->forward_features(images)
                        : run.linear_eval->forward_outputs(images);
    }
    return {trunk_only ? run.model->forward_trunk(images) : run.model->forward(images)};
  }
};

// Trunk features need only the trunk: any checkpoint of a model with this trunk serves, and
// its heads (or a linear evaluation's fresh ones) are neither loaded nor compared.
checkpoint::WeightsInitReport
load_checkpoint_model(torch::nn::Module& module, const ResumeChoice& choice, bool trunk_only) {
  checkpoint::WeightsInitOptions weights;
  weights.state_dict_key_name = {"model"};
  weights.init_heads = !trunk_only;
  return checkpoint::init_weights(module, choice.state, weights, choice.path.string());
}

// MODEL.WEIGHTS_INIT as the trainer applies it, except that heads whose outputs are to be
// written must come from the file: fresh heads would write random numbers.
checkpoint::WeightsInitReport
load_weights_file(torch::nn::Module& module, const TrainerOptions& options, bool trunk_only) {
  checkpoint::WeightsInitOptions weights = options.weights_init;
  if (trunk_only) {
    weights.init_heads = false;
  } else if (!weights.init_heads) {
    throw ConfigError(
        "MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY = False writes the heads' "
        "outputs, but MODEL.WEIGHTS_INIT does not load the heads (EVAL_MODE_ON without "
        "EVAL_TRUNK_AND_HEAD), so they would be freshly initialized: set "
        "MODEL.FEATURE_EVAL_SETTINGS.EVAL_TRUNK_AND_HEAD=True to load them, or "
        "EXTRACT_TRUNK_FEATURES_ONLY=True to extract the trunk's features");
  }
  try {
    return checkpoint::init_weights_from_file(module, weights);
  } catch (const CheckpointError& error) {
    throw CheckpointError(fmt::format("MODEL.WEIGHTS_INIT.PARAMS_FILE: {}", error.what()));
  }
}

// Checked before any work (and before `largo extract` starts workers): the run directory
// holds checkpoint files, or MODEL.WEIGHTS_INIT names a file.
void check_something_to_extract(const TrainerOptions& options) {
  const fs::path& run_dir = options.checkpoint.dir;
  if (!options.weights_init.params_file.empty() ||
      (fs::is_directory(run_dir) && !checkpoint_files(run_dir).empty())) {
    return;
  }
  throw ConfigError(fmt::format(
      "nothing to extract from: CHECKPOINT.DIR ({}) holds no checkpoint and "
      "MODEL.WEIGHTS_INIT.PARAMS_FILE is empty; point CHECKPOINT.DIR at a trained run, or "
      "PARAMS_FILE at the weights to extract with",
      run_dir.string()));
}

// The weights `largo eval` would evaluate (run_start.cpp, load_for_evaluation): the newest
// intact checkpoint of CHECKPOINT.DIR, else MODEL.WEIGHTS_INIT's file. Every rank reads the
// file itself. Returns the file read.
fs::path load_weights(torch::nn::Module& module, const RunPlan& plan, int rank) {
  const TrainerOptions& options = plan.options;
  const fs::path& run_dir = options.checkpoint.dir;
  const bool trunk_only = plan.model.feature_eval.extract_trunk_features_only;
  check_something_to_extract(options);
  std::optional<ResumeChoice> choice;
  if (fs::is_directory(run_dir)) {
    choice = choose_resume_checkpoint(run_dir); // nullopt when it holds no checkpoint files
  }
  const fs::path& params_file = options.weights_init.params_file;
  const checkpoint::WeightsInitReport report =
      choice ? load_checkpoint_model(module, *choice, trunk_only)
             : load_weights_file(module, options, trunk_only);
  const fs::path source = choice ? choice->path : params_file;
  if (rank == 0) {
    if (choice && !choice->warning.empty()) {
      spdlog::warn("{}", choice->warning);
    }
    spdlog::info("loaded for extraction: {}", report.describe(source.string()));
  }
  return source;
}

// Created when missing; checked before any work so that a long extraction does not fail at
// its first write.
void prepare_output_dir(const fs::path& dir, bool is_run_dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  std::string reason;
  if (error) {
    reason = error.message();
  } else if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    reason = std::strerror(errno);
  } else {
    return;
  }
  throw ConfigError(fmt::format(
      "cannot write the extracted features to {}{}: {}; point {} at a writable directory",
      dir.string(),
      is_run_dir ? " (CHECKPOINT.DIR)" : "",
      reason,
      is_run_dir ? "CHECKPOINT.DIR" : "the output directory"));
}

// What one split gave on this rank.
struct SplitOutputs {
  std::vector<at::Tensor> features; // one per name: float32 [N, D]
  at::Tensor targets;               // int64 [N]
  at::Tensor inds;                  // int64 [N]
};

// Runs `order` (dataset indices, non-empty) through the model, batch by batch.
SplitOutputs run_split(
    ExtractionModel& model,
    data::DataLoader& loader,
    const std::vector<int64_t>& order,
    size_t num_names,
    bool trunk_only) {
  std::vector<std::vector<at::Tensor>> pieces(num_names);
  std::vector<at::Tensor> labels;
  loader.start_epoch(order, /*epoch=*/0);
  while (auto batch = loader.next()) {
    const std::vector<at::Tensor> outputs = model.outputs(batch->images, trunk_only);
    TORCH_INTERNAL_ASSERT(
        outputs.size() == num_names,
        "the model gave ",
        outputs.size(),
        " outputs, not ",
        num_names);
    for (size_t i = 0; i < num_names; ++i) {
      pieces[i].push_back(outputs[i].reshape({outputs[i].size(0), -1}).to(at::kCPU, at::kFloat));
    }
    labels.push_back(batch->labels.to(at::kCPU, at::kLong));
  }
  SplitOutputs split;
  for (const auto& piece : pieces) {
    split.features.push_back(at::cat(piece).contiguous());
  }
  split.targets = at::cat(labels).contiguous();
  split.inds = at::tensor(at::ArrayRef<int64_t>(order), at::kLong);
  TORCH_INTERNAL_ASSERT(
      split.targets.size(0) == split.inds.size(0),
      "the loader delivered ",
      split.targets.size(0),
      " samples of ",
      split.inds.size(0));
  return split;
}

ExtractedArrays write_arrays(
    const fs::path& dir,
    int rank,
    const std::string& split,
    const std::string& name,
    const at::Tensor& features,
    const SplitOutputs& outputs) {
  ExtractedArrays arrays{
      split,
      name,
      dir / extracted_file_name(rank, split, name, "features"),
      dir / extracted_file_name(rank, split, name, "targets"),
      dir / extracted_file_name(rank, split, name, "inds"),
      features.sizes().vec()};
  data::write_npy(arrays.features_file, features);
  data::write_npy(arrays.targets_file, outputs.targets);
  data::write_npy(arrays.inds_file, outputs.inds);
  return arrays;
}

// Files of an earlier extraction of these splits and names that this one would not replace:
// a larger world's ranks (rank 0 removes those), VISSL's later chunks, and this rank's files of
// a split it now has no sample of. Left in place, they would be merged with the new ones by
// anything that reads rank*_chunk*_{split}_{name}_*.npy.
void remove_stale_shards(
    const fs::path& dir,
    int rank,
    int world_size,
    const std::map<std::string, bool>& split_is_empty,
    const std::vector<std::string>& names) {
  static const std::regex shard(
      R"(rank(\d+)_chunk(\d+)_([^_]+)_(.+)_(features|targets|inds)\.npy)");
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch match;
    const std::string file = entry.path().filename().string();
    if (!std::regex_match(file, match, shard) || split_is_empty.count(match[3].str()) == 0 ||
        std::find(names.begin(), names.end(), match[4].str()) == names.end()) {
      continue;
    }
    const int file_rank = std::stoi(match[1].str());
    const bool mine =
        file_rank == rank && (match[2].str() != "0" || split_is_empty.at(match[3].str()));
    if (mine || (rank == 0 && file_rank >= world_size)) {
      fs::remove(entry.path());
    }
  }
}

// VISSL's available_splits: train unless TEST_ONLY, test when TEST_MODEL.
std::vector<std::string> splits_to_extract(const TrainerOptions& options) {
  std::vector<std::string> splits;
  if (!options.test_only) {
    splits.emplace_back("train");
  }
  if (options.test_model) {
    splits.emplace_back("test");
  }
  return splits;
}

// Both splits' data, every sample kept: DROP_LAST would leave out a rank's last samples.
std::unique_ptr<TrainingData>
open_data(const TrainerOptions& options, const comm::ProcessGroup& group, torch::Device device) {
  TrainerOptions data_options = options;
  data_options.train.drop_last = false;
  data_options.test.drop_last = false;
  data_options.test_model = false; // an empty test split is reported, not refused
  return std::make_unique<TrainingData>(data_options, group.rank(), group.world_size(), device);
}

} // namespace

RunPlan resolve_extraction(Config config) {
  const std::string key = "MODEL.FEATURE_EVAL_SETTINGS.";
  if (config.get_bool(key + "FREEZE_TRUNK_AND_HEAD") &&
      !config.get_bool(key + "FREEZE_TRUNK_ONLY")) {
    config.apply_override(key + "FREEZE_TRUNK_AND_HEAD=False");
    config.apply_override(key + "FREEZE_TRUNK_ONLY=True");
  }
  RunPlan plan = resolve_run(config);
  check_something_to_extract(plan.options);
  return plan;
}

std::vector<std::string> extracted_feature_names(const models::FeatureEvalOptions& options) {
  const bool tapped = options.enabled() && !options.taps.empty();
  if (options.extract_trunk_features_only) {
    if (!tapped) {
      return {"trunk"};
    }
    std::vector<std::string> features;
    for (const auto& tap : options.taps) {
      features.push_back(tap.feature);
    }
    return unique_names(features);
  }
  if (!tapped || options.taps.size() == 1) {
    return {"heads"};
  }
  std::vector<std::string> heads;
  for (size_t i = 0; i < options.taps.size(); ++i) {
    heads.push_back(fmt::format("heads{}", i));
  }
  return heads;
}

std::string extracted_file_name(
    int rank, const std::string& split, const std::string& name, const std::string& array) {
  return fmt::format("rank{}_chunk0_{}_{}_{}.npy", rank, split, name, array);
}

namespace {

ExtractionResult extract(
    const RunPlan& plan, std::shared_ptr<comm::ProcessGroup> group, const fs::path& output_dir) {
  const TrainerOptions& options = plan.options;
  if (!group) {
    group = join_world(options.distributed, plan.world.backend);
  }
  ExtractionResult result;
  result.rank = group->rank();
  result.world_size = group->world_size();
  result.output_dir = output_dir.empty() ? options.checkpoint.dir : output_dir;
  set_threads(options.num_threads, plan.world.procs_per_node);
  apply_kernel_switches(options);
  const torch::Device device = pick_device(options);

  ExtractionModel model(plan);
  result.weights_file = load_weights(model.module(), plan, result.rank);
  model.module().to(device);
  model.module().eval();
  prepare_output_dir(result.output_dir, output_dir.empty());
  if (result.rank == 0) {
    remove_stale_temporaries(result.output_dir); // of an extraction killed while writing
    const parallel::ParallelOptions& layout = plan.parallel;
    if (layout.pipeline.size * layout.tensor_parallel_size > 1) { // the checkpoint is whole
      spdlog::info(
          "extraction runs the whole model on each of the {} ranks, each on its share of the "
          "data; DISTRIBUTED.PIPELINE_SIZE = {} and TENSOR_PARALLEL_SIZE = {} apply to training",
          result.world_size,
          layout.pipeline.size,
          layout.tensor_parallel_size);
    }
  }

  const bool trunk_only = plan.model.feature_eval.extract_trunk_features_only;
  const std::vector<std::string> names = extracted_feature_names(plan.model.feature_eval);
  const std::unique_ptr<TrainingData> data =
      open_data(with_local_data_copies(options, *group, plan.world.procs_per_node), *group, device);
  std::map<std::string, std::vector<int64_t>> orders; // split -> this rank's share
  std::map<std::string, bool> split_is_empty;
  for (const std::string& split : splits_to_extract(options)) {
    orders[split] = split == "train" ? data->train_order() : data->test_order();
    split_is_empty[split] = orders[split].empty();
  }
  remove_stale_shards(result.output_dir, result.rank, result.world_size, split_is_empty, names);
  torch::NoGradGuard no_grad;
  for (const std::string& split : splits_to_extract(options)) {
    const std::vector<int64_t>& order = orders[split];
    if (order.empty()) {
      result.empty_splits.push_back(split);
      continue;
    }
    data::DataLoader& loader = split == "train" ? data->train_loader() : data->test_loader();
    const SplitOutputs outputs = run_split(model, loader, order, names.size(), trunk_only);
    for (size_t i = 0; i < names.size(); ++i) {
      result.written.push_back(write_arrays(
          result.output_dir, result.rank, split, names[i], outputs.features[i], outputs));
    }
  }
  group->barrier(); // every rank's files are written when any rank returns
  return result;
}

} // namespace

ExtractionResult extract_features(
    const RunPlan& plan, std::shared_ptr<comm::ProcessGroup> group, const fs::path& output_dir) {
  // The library's errors name its options; the plan came from YAML keys.
  return rethrow_with_yaml_keys([&] { return extract(plan, std::move(group), output_dir); });
}

std::string ExtractionResult::describe() const {
  std::string text = fmt::format(
      "rank {} of {}: features of {} written to {}",
      rank,
      world_size,
      weights_file.string(),
      output_dir.string());
  for (const ExtractedArrays& arrays : written) {
    const int64_t samples = arrays.features_shape.front();
    text += fmt::format(
        "\n  {} {}: features [{}], targets [{}], inds [{}]: {}",
        arrays.split,
        arrays.name,
        fmt::join(arrays.features_shape, ", "),
        samples,
        samples,
        extracted_file_name(rank, arrays.split, arrays.name, "{features,targets,inds}"));
  }
  for (const std::string& split : empty_splits) {
    text += fmt::format("\n  {}: no sample on this rank, nothing written", split);
  }
  return text;
}

} // namespace largo::train
