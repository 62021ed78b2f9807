// Feature extraction (train/feature_extraction.h): from a briefly trained ResNet-18, every
// sample of both splits is written once, under VISSL's file names, with its label and dataset
// index, and its features equal the model's recomputed here from the same weights; two ranks
// together write what one process writes; what cannot be extracted is a clear error.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/run_directory.h>
#include <largo/core/error.h>
#include <largo/data/npy.h>
#include <largo/models/model_factory.h>
#include <largo/train/feature_extraction.h>
#include <largo/train/training_data.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <numeric>

namespace largo::train::feature_extraction_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

// 32 training and 16 test samples of 1x24x24, read deterministically (no random flip), so that
// the recomputation sees the images the extraction saw. Both splits go in batches of 8: one
// process and each of two ranks then run batches of the same size (see TwoRanks... below).
const Overrides kResNet{
    "MODEL.TRUNK.NAME=resnet",
    "MODEL.TRUNK.RESNETS.DEPTH=18",
    "OPTIMIZER.num_epochs=1",
    "DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=32",
    "DATA.TEST.SYNTHETIC.NUM_SAMPLES=16",
    "DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
    "DATA.TEST.BATCHSIZE_PER_REPLICA=8",
    "DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]"};
constexpr int64_t kTrainSamples = 32;
constexpr int64_t kTestSamples = 16;

const std::string kEval = "MODEL.FEATURE_EVAL_SETTINGS.";

// Three taps, two of them on res4 (res4 is 2x2 from 24x24 images): res4 averaged to 1x1,
// res4 as it is, and res5avg; kThreeHeads puts a head on each.
const Overrides kThreeTaps{
    kEval + "EVAL_MODE_ON=True",
    kEval + "FREEZE_TRUNK_ONLY=True",
    kEval + "SHOULD_FLATTEN_FEATS=False",
    kEval +
        R"(LINEAR_EVAL_FEAT_POOL_OPS_MAP=[["res4", ["AdaptiveAvgPool2d", [[1, 1]]]], ["res4", ["Identity", []]], ["res5avg", ["Identity", []]]])"};
const Overrides kThreeHeads =
    kThreeTaps +
    Overrides{
        R"(MODEL.HEAD.PARAMS=[["eval_mlp", {"in_channels": 256, "dims": [256, 10]}], ["eval_mlp", {"in_channels": 256, "dims": [1024, 10]}], ["mlp", {"dims": [512, 10]}]])"};

const Overrides kTrunkOnly{kEval + "EXTRACT_TRUNK_FEATURES_ONLY=True"};

fs::path checkpoint_of(const fs::path& run) {
  return run / checkpoint::kLatestCheckpointName;
}

// A ResNet-18 trained for one epoch (collective), then heads on three of its features trained
// for one epoch on its frozen trunk: dir/pretrain and dir/linear.
void train_resnet_and_heads(const fs::path& dir, comm::ProcessGroup& group) {
  train_run(dir / "pretrain", kResNet, borrow(group));
  train_run(
      dir / "linear",
      kResNet + kThreeHeads +
          Overrides{"MODEL.WEIGHTS_INIT.PARAMS_FILE=" + checkpoint_of(dir / "pretrain").string()},
      borrow(group));
}

Config job_config(const fs::path& run_dir, const Overrides& overrides) {
  return synthetic_job_config(run_dir, kResNet + overrides);
}

// The arrays of one .npy file, as a tensor.
at::Tensor read_array(const fs::path& path) {
  const data::NpyArray array = data::read_npy(path);
  const at::ScalarType type = array.descr == "<f4" ? at::kFloat : at::kLong;
  EXPECT_TRUE(array.descr == "<f4" || array.descr == "<i8") << path << ": " << array.descr;
  EXPECT_FALSE(array.fortran_order) << path;
  return at::from_blob(const_cast<char*>(array.data.data()), array.shape, type).clone();
}

struct Extracted {
  at::Tensor features; // [N, D]
  at::Tensor targets;  // [N]
  at::Tensor inds;     // [N]
};

// The three files of one rank, split and name, checked for their shapes.
Extracted
read_extracted(const fs::path& dir, int rank, const std::string& split, const std::string& name) {
  Extracted e{
      read_array(dir / extracted_file_name(rank, split, name, "features")),
      read_array(dir / extracted_file_name(rank, split, name, "targets")),
      read_array(dir / extracted_file_name(rank, split, name, "inds"))};
  EXPECT_EQ(e.features.dim(), 2) << name;
  EXPECT_EQ(e.targets.sizes().vec(), std::vector<int64_t>{e.features.size(0)}) << name;
  EXPECT_EQ(e.inds.sizes().vec(), std::vector<int64_t>{e.features.size(0)}) << name;
  return e;
}

// What the model gives for each sample of a split, recomputed from `weights` (a checkpoint's
// "model") in a model built here: the extraction's batches (one process reads samples 0..N-1
// in order, 8 at a time), so that each row is bit-equal to the extraction's if that loaded the
// same weights and ran the same forward; and each sample's label.
struct Recomputed {
  std::vector<at::Tensor> outputs; // one per name, [N, D] in sample order
  at::Tensor labels;               // [N]
};

void load_model_entries(torch::nn::Module& model, const fs::path& weights, bool trunk_only) {
  torch::NoGradGuard no_grad;
  const auto parameters = model.named_parameters();
  const auto buffers = model.named_buffers();
  for (const auto& entry : checkpoint::load_checkpoint(weights).at("model").toGenericDict()) {
    const std::string name = entry.key().toStringRef();
    const at::Tensor* target = parameters.find(name) ? parameters.find(name) : buffers.find(name);
    if (target == nullptr && trunk_only && name.rfind("trunk.", 0) != 0) {
      continue; // a head the trunk's features do not use
    }
    ASSERT_NE(target, nullptr) << "the model has no " << name;
    at::Tensor(*target).copy_(entry.value().toTensor());
  }
}

Recomputed recompute(const RunPlan& plan, const fs::path& weights, const std::string& split) {
  models::TrunkHeadModel model = models::build_model(plan.model);
  models::LinearEvalModel linear{nullptr};
  if (plan.model.feature_eval.enabled()) {
    linear = models::LinearEvalModel(model, plan.model.feature_eval);
  }
  torch::nn::Module& module = linear ? static_cast<torch::nn::Module&>(*linear) : *model;
  const bool trunk_only = plan.model.feature_eval.extract_trunk_features_only;
  load_model_entries(module, weights, trunk_only);
  module.eval();
  torch::NoGradGuard no_grad;
  TrainingData data(plan.options, 0, 1);
  data::DataLoader& loader = split == "train" ? data.train_loader() : data.test_loader();
  std::vector<int64_t> order(split == "train" ? kTrainSamples : kTestSamples);
  std::iota(order.begin(), order.end(), 0);
  loader.start_epoch(order, 0);
  std::vector<std::vector<at::Tensor>> pieces;
  std::vector<at::Tensor> labels;
  while (auto batch = loader.next()) {
    std::vector<at::Tensor> outputs = linear ? (trunk_only ? linear->forward_features(batch->images)
                                                           : linear->forward_outputs(batch->images))
                                             : std::vector<at::Tensor>{
                                                   trunk_only ? model->forward_trunk(batch->images)
                                                              : model->forward(batch->images)};
    pieces.resize(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      pieces[i].push_back(outputs[i].flatten(1));
    }
    labels.push_back(batch->labels);
  }
  Recomputed result;
  for (const auto& piece : pieces) {
    result.outputs.push_back(at::cat(piece));
  }
  result.labels = at::cat(labels);
  return result;
}

// One process's files for `config` in `dir`: every sample once (inds a permutation of 0..N-1,
// here in order), its label, and its features equal to the recomputed ones bit for bit.
void expect_extracted_as_recomputed(
    const Config& config,
    const fs::path& dir,
    const fs::path& weights,
    const std::vector<std::string>& names,
    const std::vector<int64_t>& dims) {
  const RunPlan plan = resolve_extraction(config);
  ASSERT_EQ(extracted_feature_names(plan.model.feature_eval), names);
  for (const std::string split : {"train", "test"}) {
    const int64_t samples = split == "train" ? kTrainSamples : kTestSamples;
    const Recomputed expected = recompute(plan, weights, split);
    ASSERT_EQ(expected.outputs.size(), names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      SCOPED_TRACE(split + " " + names[i]);
      const Extracted e = read_extracted(dir, 0, split, names[i]);
      EXPECT_EQ(e.features.sizes().vec(), (std::vector<int64_t>{samples, dims[i]}));
      EXPECT_TRUE(e.inds.equal(at::arange(samples, at::kLong)));
      EXPECT_TRUE(e.targets.equal(expected.labels));
      EXPECT_TRUE(e.features.equal(expected.outputs[i].index_select(0, e.inds)));
    }
  }
}

// From a linear evaluation's checkpoint (the newest of CHECKPOINT.DIR): with
// EXTRACT_TRUNK_FEATURES_ONLY each tapped feature by its VISSL name (the second res4 as
// res4_1, as VISSL renames it), pooled and flattened; without it each head's output. Both
// equal LinearEvalModel::forward_features / forward_outputs recomputed from the checkpoint.
TEST(FeatureExtractionTest, WritesEachSamplesTrunkFeaturesOrHeadOutputsOnce) {
  const fs::path dir = test_dir_for("feature_extraction");
  fs::remove_all(dir);
  const auto one = comm::ProcessGroup::single_process();
  train_resnet_and_heads(dir, *one);
  const fs::path run = dir / "linear";

  const Config trunk = job_config(run, kThreeHeads + kTrunkOnly);
  const ExtractionResult result = extract_features(resolve_extraction(trunk), one);
  EXPECT_EQ(fs::canonical(result.weights_file), fs::canonical(checkpoint_of(run)));
  EXPECT_EQ(result.written.size(), 6u); // 2 splits x 3 features
  EXPECT_TRUE(result.empty_splits.empty());
  EXPECT_EQ(result.written.front().features_file, run / "rank0_chunk0_train_res4_features.npy");
  expect_extracted_as_recomputed(
      trunk, run, checkpoint_of(run), {"res4", "res4_1", "res5avg"}, {256, 1024, 512});

  // VISSL's trunk extraction configs name no heads (MODEL.HEAD.PARAMS empty): the same files,
  // written afresh.
  std::vector<fs::path> written;
  for (const auto& entry : fs::directory_iterator(run)) {
    if (entry.path().extension() == ".npy") {
      written.push_back(entry.path());
    }
  }
  for (const fs::path& file : written) {
    fs::remove(file);
  }
  const Config bare = job_config(run, kThreeTaps + Overrides{"MODEL.HEAD.PARAMS=[]"} + kTrunkOnly);
  EXPECT_EQ(extract_features(resolve_extraction(bare), one).written.size(), 6u);
  expect_extracted_as_recomputed(
      bare, run, checkpoint_of(run), {"res4", "res4_1", "res5avg"}, {256, 1024, 512});

  const Config heads = job_config(run, kThreeHeads);
  extract_features(resolve_extraction(heads), one);
  expect_extracted_as_recomputed(
      heads, run, checkpoint_of(run), {"heads0", "heads1", "heads2"}, {10, 10, 10});
  for (const auto& entry : fs::directory_iterator(run)) {
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

// The plain model from MODEL.WEIGHTS_INIT (its CHECKPOINT.DIR empty): the trunk's output as
// "trunk", the head's as "heads"; TEST_ONLY extracts the test split alone (VISSL's splits).
TEST(FeatureExtractionTest, WithoutTapsTheTrunkOutputOrTheHeadFromWeightsInit) {
  const fs::path dir = test_dir_for("feature_extraction");
  fs::remove_all(dir);
  const auto one = comm::ProcessGroup::single_process();
  train_run(dir / "pretrain", kResNet, one);
  const fs::path weights = checkpoint_of(dir / "pretrain");
  const fs::path out = dir / "out";
  const Overrides from_weights{"MODEL.WEIGHTS_INIT.PARAMS_FILE=" + weights.string()};

  const Config trunk = job_config(out, from_weights + kTrunkOnly);
  EXPECT_EQ(extract_features(resolve_extraction(trunk), one).weights_file, weights);
  expect_extracted_as_recomputed(trunk, out, weights, {"trunk"}, {512});
  const Config head = job_config(out, from_weights);
  extract_features(resolve_extraction(head), one);
  expect_extracted_as_recomputed(head, out, weights, {"heads"}, {10});

  const fs::path test_only = dir / "test_only";
  const ExtractionResult result = extract_features(
      resolve_extraction(job_config(test_only, from_weights + Overrides{"TEST_ONLY=True"})), one);
  ASSERT_EQ(result.written.size(), 1u);
  EXPECT_EQ(result.written[0].split, "test");
  EXPECT_EQ(result.written[0].features_shape, (std::vector<int64_t>{kTestSamples, 10}));
  EXPECT_FALSE(fs::exists(test_only / "rank0_chunk0_train_heads_features.npy"));
}

// Two ranks, each with every second sample: together every sample once, each row equal to the
// one process's row of the same index; a later one-process extraction removes rank 1's files. Bit
// for bit: every batch has 8 samples in both runs, so the same kernels run, and on the CPU a
// sample's result does not depend on the other samples of its batch (the BatchNorm layers use their
// running statistics).
TEST(FeatureExtractionTest, TwoRanksTogetherWriteTheOneProcessRows) {
  const fs::path dir = test_dir_for("feature_extraction");
  const Overrides job = kThreeHeads + kTrunkOnly;
  if (largo::testing::is_parent()) {
    fs::remove_all(dir);
    const auto one = comm::ProcessGroup::single_process();
    train_resnet_and_heads(dir, *one);
    extract_features(resolve_extraction(job_config(dir / "linear", job)), one, dir / "one");
  }
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    const ExtractionResult result = extract_features(
        resolve_extraction(job_config(dir / "linear", job)), borrow(group), dir / "two");
    EXPECT_EQ(result.written.size(), 6u);
    EXPECT_EQ(
        result.written.front().features_shape, (std::vector<int64_t>{kTrainSamples / 2, 256}));
  });
  for (const std::string split : {"train", "test"}) {
    for (const std::string name : {"res4", "res4_1", "res5avg"}) {
      SCOPED_TRACE(split + " " + name);
      const Extracted one = read_extracted(dir / "one", 0, split, name);
      const Extracted rank0 = read_extracted(dir / "two", 0, split, name);
      const Extracted rank1 = read_extracted(dir / "two", 1, split, name);
      const at::Tensor inds = at::cat({rank0.inds, rank1.inds});
      const at::Tensor features = at::cat({rank0.features, rank1.features});
      EXPECT_TRUE(std::get<0>(inds.sort()).equal(one.inds)); // each sample once
      EXPECT_TRUE(rank0.inds.equal(at::arange(0, one.inds.size(0), 2, at::kLong)));
      EXPECT_TRUE(features.equal(one.features.index_select(0, inds)));
      EXPECT_TRUE(at::cat({rank0.targets, rank1.targets}).equal(one.targets.index_select(0, inds)));
    }
  }
  // One process extracting into the two ranks' directory leaves no rank-1 shard to be merged
  // with its files.
  extract_features(
      resolve_extraction(job_config(dir / "linear", job)),
      comm::ProcessGroup::single_process(),
      dir / "two");
  EXPECT_TRUE(fs::exists(dir / "two" / "rank0_chunk0_test_res4_inds.npy"));
  for (const auto& entry : fs::directory_iterator(dir / "two")) {
    EXPECT_NE(entry.path().filename().string().rfind("rank1_", 0), 0u) << entry.path();
  }
}

// A small CNN's checkpoint, trained in a blink, for the error cases that need weights.
fs::path small_weights(const fs::path& dir) {
  train_run(
      dir / "small",
      {"DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16", "OPTIMIZER.num_epochs=1"},
      comm::ProcessGroup::single_process());
  return checkpoint_of(dir / "small");
}

template <typename ErrorType>
void expect_error(const Config& config, const std::string& message, const fs::path& out = {}) {
  try {
    extract_features(resolve_extraction(config), comm::ProcessGroup::single_process(), out);
    ADD_FAILURE() << "no error; expected: " << message;
  } catch (const ErrorType& error) {
    EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
  }
}

// Nothing to extract from, a weights file or run directory that holds no checkpoint, heads
// asked for that MODEL.WEIGHTS_INIT would not load, a directory that cannot be written: each
// stops before any file is written, with a message naming the keys or the file.
TEST(FeatureExtractionTest, WhatCannotBeExtractedIsAClearError) {
  const fs::path dir = test_dir_for("feature_extraction");
  fs::remove_all(dir);
  fs::create_directories(dir);
  expect_error<ConfigError>(
      synthetic_job_config(dir / "empty"),
      "nothing to extract from: CHECKPOINT.DIR (" + (dir / "empty").string() +
          ") holds no checkpoint and MODEL.WEIGHTS_INIT.PARAMS_FILE is empty");

  const fs::path text = dir / "notes.txt";
  std::ofstream(text) << "not a checkpoint\n";
  expect_error<CheckpointError>(
      synthetic_job_config(dir / "empty", {"MODEL.WEIGHTS_INIT.PARAMS_FILE=" + text.string()}),
      text.string());
  fs::create_directories(dir / "junk");
  std::ofstream(dir / "junk" / "model_phase1.torch") << "not a checkpoint either\n";
  expect_error<CheckpointError>(synthetic_job_config(dir / "junk"), "model_phase1.torch");

  const Overrides from_weights{"MODEL.WEIGHTS_INIT.PARAMS_FILE=" + small_weights(dir).string()};
  expect_error<ConfigError>(
      synthetic_job_config(
          dir / "empty",
          from_weights + Overrides{kEval + "EVAL_MODE_ON=True", kEval + "FREEZE_TRUNK_ONLY=True"}),
      "EVAL_TRUNK_AND_HEAD=True");
  expect_error<ConfigError>(
      synthetic_job_config(dir / "empty", from_weights),
      "cannot write the extracted features to " + (text / "features").string(),
      text / "features");
  EXPECT_FALSE(fs::exists(dir / "empty"));
}

// A model extracted on a test split alone (TEST_ONLY): sized from DATA.TEST, DATA.TRAIN
// neither read nor checked (here a folder that does not exist), and a head given by
// MODEL.HEAD.PARAMS keeps its width (12 outputs for a 3-class test split, as a torchvision
// 1000-class model on a 2-class folder); a test split with more classes than the head is
// refused. Without TEST_ONLY both splits are extracted, and a training split of another size
// is refused with the way out: TEST_ONLY=True.
TEST(FeatureExtractionTest, TheTestSplitAloneSizesTheModelAndKeepsTheHeadsWidth) {
  const fs::path dir = test_dir_for("feature_extraction");
  fs::remove_all(dir);
  const Overrides mlp{
      "MODEL.TRUNK.NAME=mlp",
      "MODEL.TRUNK.MLP.HIDDEN_DIMS=[16]",
      R"(MODEL.HEAD.PARAMS=[["mlp", {"dims": [16, 12]}]])",
      "OPTIMIZER.num_epochs=1"};
  train_run(dir / "pretrain", mlp, comm::ProcessGroup::single_process());
  const Overrides test_split_alone =
      mlp + Overrides{
                "MODEL.WEIGHTS_INIT.PARAMS_FILE=" + checkpoint_of(dir / "pretrain").string(),
                "DATA.TRAIN.DATA_SOURCES=[disk_folder]",
                "DATA.TRAIN.DATA_PATHS=[" + (dir / "no_such_folder").string() + "]",
                "DATA.TEST.SYNTHETIC.NUM_CLASSES=3"};

  const Config config =
      synthetic_job_config(dir / "out", test_split_alone + Overrides{"TEST_ONLY=True"});
  const RunPlan plan = resolve_extraction(config);
  EXPECT_TRUE(plan.train_shape.sample_shape.empty()) << "DATA.TRAIN is not read";
  EXPECT_EQ(plan.model.num_classes, 12) << "the head's own width, not the test split's 3";
  const ExtractionResult result = extract_features(plan, comm::ProcessGroup::single_process());
  ASSERT_EQ(result.written.size(), 1u);
  EXPECT_EQ(result.written[0].split, "test");
  EXPECT_EQ(result.written[0].features_shape, (std::vector<int64_t>{32, 12}));

  expect_error<ConfigError>(
      synthetic_job_config(
          dir / "out",
          mlp +
              Overrides{
                  "TEST_ONLY=True",
                  "MODEL.WEIGHTS_INIT.PARAMS_FILE=" + checkpoint_of(dir / "pretrain").string(),
                  "DATA.TEST.SYNTHETIC.NUM_CLASSES=13"}),
      "DATA.TEST has 13 classes but the model's head has 12 outputs");
  expect_error<ConfigError>(
      synthetic_job_config(
          dir / "out",
          mlp +
              Overrides{
                  "MODEL.WEIGHTS_INIT.PARAMS_FILE=" + checkpoint_of(dir / "pretrain").string(),
                  "DATA.TRAIN.SYNTHETIC.IMAGE_SHAPE=[1,20,20]"}),
      "or set TEST_ONLY=True to read DATA.TEST alone and size the model from it");
  fs::remove_all(dir);
}

} // namespace
} // namespace largo::train::feature_extraction_test
