// `largo extract`: the program's part of feature extraction (the features themselves are
// checked in tests/train/feature_extraction_test.cpp). It starts its own workers for
// DISTRIBUTED.NUM_PROC_PER_NODE = 2, each rank printing what it wrote; it takes VISSL's
// FREEZE_TRUNK_AND_HEAD extraction configs; it refuses before starting workers when there is
// nothing to extract from; `largo train` refuses EXTRACT_TRUNK_FEATURES_ONLY and a config
// whose engine_name is extract_features.
#include "apps/program_runner.h"

#include <largo/data/npy.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

namespace largo::testing::extract_command_test {
namespace {

namespace fs = std::filesystem;

// An MLP on 24 synthetic training and 12 test samples, one epoch, in `run_dir`.
std::vector<std::string> command(
    const std::string& subcommand,
    const fs::path& run_dir,
    std::vector<std::string> overrides = {}) {
  std::vector<std::string> argv = {
      largo_program(),
      subcommand,
      "DATA.TRAIN.DATA_SOURCES=[synthetic]",
      "DATA.TEST.DATA_SOURCES=[synthetic]",
      "DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=24",
      "DATA.TEST.SYNTHETIC.NUM_SAMPLES=12",
      "DATA.TRAIN.SYNTHETIC.IMAGE_SHAPE=[1,8,8]",
      "DATA.TEST.SYNTHETIC.IMAGE_SHAPE=[1,8,8]",
      "DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]",
      "MODEL.TRUNK.NAME=mlp",
      "OPTIMIZER.num_epochs=1",
      "MACHINE.NUM_THREADS=1",
      "DISTRIBUTED.NUM_PROC_PER_NODE=1",
      "CHECKPOINT.DIR=" + run_dir.string()};
  argv.insert(argv.end(), overrides.begin(), overrides.end());
  return argv;
}

std::vector<int64_t> inds_of(const fs::path& file) {
  return data::npy_integers(data::read_npy(file), file);
}

// Two workers over a FREEZE_TRUNK_AND_HEAD config (VISSL's kNN form: the frozen model's head
// output): each prints its files and shapes, and their inds together are every sample once.
TEST(ExtractCommandTest, TwoWorkersWriteAndPrintTheirShares) {
  TestDir dir;
  const fs::path run = dir / "run";
  const ProgramResult trained = run_program(command("train", run));
  ASSERT_TRUE(trained.succeeded()) << trained.output;
  const ProgramResult extracted = run_program(command(
      "extract",
      run,
      {"DISTRIBUTED.NUM_PROC_PER_NODE=2",
       "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
       "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_AND_HEAD=True"}));
  ASSERT_TRUE(extracted.succeeded()) << extracted.output;
  for (const std::string rank : {"0", "1"}) {
    EXPECT_NE(extracted.output.find("rank " + rank + " of 2: features of "), std::string::npos)
        << extracted.output;
    EXPECT_NE(
        extracted.output.find(
            "  train heads: features [12, 10], targets [12], inds [12]: "
            "rank" +
            rank + "_chunk0_train_heads_{features,targets,inds}.npy"),
        std::string::npos)
        << extracted.output;
    EXPECT_NE(extracted.output.find("  test heads: features [6, 10]"), std::string::npos)
        << extracted.output;
  }
  for (const auto& [split, samples] : {std::pair{"train", 24}, std::pair{"test", 12}}) {
    const std::string prefix = std::string("_chunk0_") + split + "_heads_inds.npy";
    std::vector<int64_t> inds = inds_of(run / ("rank0" + prefix));
    const std::vector<int64_t> rank1 = inds_of(run / ("rank1" + prefix));
    inds.insert(inds.end(), rank1.begin(), rank1.end());
    std::sort(inds.begin(), inds.end());
    std::vector<int64_t> every(samples);
    std::iota(every.begin(), every.end(), 0);
    EXPECT_EQ(inds, every) << split;
  }
}

// Nothing to extract from: refused with exit code 2 before any worker starts.
TEST(ExtractCommandTest, NothingToExtractFromIsRefusedBeforeWorkersStart) {
  TestDir dir;
  const ProgramResult run =
      run_program(command("extract", dir / "empty", {"DISTRIBUTED.NUM_PROC_PER_NODE=2"}));
  EXPECT_TRUE(run.exited_with(2)) << run.status() << "\n" << run.output;
  EXPECT_NE(run.output.find("nothing to extract from: CHECKPOINT.DIR"), std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("starting 2 workers"), std::string::npos) << run.output;
}

// VISSL reads EXTRACT_TRUNK_FEATURES_ONLY in its extraction engine only: in `largo train` it
// would change nothing, so it is refused (exit code 2) and the message says where it belongs.
TEST(ExtractCommandTest, TrainRefusesExtractTrunkFeaturesOnly) {
  TestDir dir;
  const ProgramResult run = run_program(command(
      "train", dir / "run", {"MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=True"}));
  EXPECT_TRUE(run.exited_with(2)) << run.status() << "\n" << run.output;
  EXPECT_NE(
      run.output.find("EXTRACT_TRUNK_FEATURES_ONLY = True is read by `largo extract`"),
      std::string::npos)
      << run.output;
  EXPECT_FALSE(fs::exists(dir / "run" / "metrics.jsonl"));
}

// engine_name (VISSL's Hydra key): `largo train` and `largo eval` refuse an extract_features
// config, naming `largo extract`, before anything runs; `largo config` checks it as `largo
// extract` does (here: nothing to extract from, where training's check would refuse
// EXTRACT_TRUNK_FEATURES_ONLY); VISSL's engines Largo lacks are refused by name.
TEST(ExtractCommandTest, EngineNameSendsAConfigToItsCommand) {
  TestDir dir;
  const std::vector<std::string> extraction = {
      "engine_name=extract_features",
      "MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=True"};
  for (const std::string subcommand : {"train", "eval"}) {
    const ProgramResult run = run_program(command(subcommand, dir / "run", extraction));
    EXPECT_TRUE(run.exited_with(2)) << subcommand << ": " << run.status() << "\n" << run.output;
    EXPECT_NE(
        run.output.find("which `largo extract` runs, not `largo " + subcommand + "`"),
        std::string::npos)
        << run.output;
  }
  EXPECT_FALSE(fs::exists(dir / "run" / "metrics.jsonl"));

  const ProgramResult checked = run_program(command("config", dir / "run", extraction));
  EXPECT_TRUE(checked.exited_with(2)) << checked.status() << "\n" << checked.output;
  EXPECT_NE(checked.output.find("nothing to extract from"), std::string::npos) << checked.output;

  const ProgramResult lacking =
      run_program(command("extract", dir / "run", {"engine_name=extract_label_predictions"}));
  EXPECT_TRUE(lacking.exited_with(2)) << lacking.status() << "\n" << lacking.output;
  EXPECT_NE(lacking.output.find("engine_name: extract_label_predictions"), std::string::npos)
      << lacking.output;
}

} // namespace
} // namespace largo::testing::extract_command_test
