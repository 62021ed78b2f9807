// Training on WebDataset shards (DATA_SOURCES: [webdataset]): `largo train` on a folder packed
// by scripts/pack_webdataset.py; a mid-epoch resume equal to the uninterrupted run bit for bit;
// 2 ranks on shards of unequal size taking the same steps; and what it cannot honour refused
// naming the key.
#include <largo/core/error.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "apps/program_runner.h"
#include "comm/distributed_test_util.h"
#include "data/image_test_util.h"
#include "data/tar_test_util.h"
#include "test_paths.h"
#include "train/trainer_run_util.h"

#include <cstdlib>

namespace largo::train::trainer_webdataset_test {
namespace {

namespace fs = std::filesystem;

// 2 classes of 12 PNGs of 10 x 9 pixels, packed with the script into shards of
// `shard_size` samples. Returns the shard list.
std::string packed_folder(const fs::path& dir, int shard_size = 4) {
  fs::remove_all(dir);
  int seed = 0;
  for (const std::string label : {"cat", "dog"}) {
    fs::create_directories(dir / "images" / label);
    for (int i = 0; i < 12; ++i, ++seed) {
      data::testing::write_bytes(
          dir / "images" / label / fmt::format("{:02d}.png", i),
          data::testing::encode_png(data::testing::pattern_image(10, 9, seed)));
    }
  }
  const std::string command = fmt::format(
      "python3 {}/../scripts/pack_webdataset.py {} {} --shard-size {} > /dev/null",
      largo::test_paths::data_dir(),
      (dir / "images").string(),
      (dir / "shards" / "train").string(),
      shard_size);
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  return (dir / "shards" / fmt::format("train-{{000000..{:06d}}}.tar", 24 / shard_size - 1))
      .string();
}

// A list holding one shard list: quoted, as YAML reads braces as a map otherwise.
std::string shard_list(const std::string& shards) {
  return "[\"" + shards + "\"]";
}

Overrides webdataset_job(const std::string& shards) {
  return {
      "DATA.TRAIN.DATA_SOURCES=[webdataset]",
      "DATA.TRAIN.DATA_PATHS=" + shard_list(shards),
      "DATA.TEST.DATA_SOURCES=[webdataset]",
      "DATA.TEST.DATA_PATHS=" + shard_list(shards),
      "DATA.TEST.TRANSFORMS=[{name: CenterCrop, size: 8}, {name: ToTensor}]",
      "DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
      "DATA.TRAIN.WEBDATASET.SHUFFLE_BUFFER=5",
      "DATA.TRAIN.TRANSFORMS=[{name: RandomResizedCrop, size: 8}, {name: "
      "RandomHorizontalFlip}, {name: ToTensor}]",
      "DATA.NUM_DATALOADER_WORKERS=2",
      "TEST_MODEL=False",
      "OPTIMIZER.num_epochs=2"};
}

// Shards s-0.tar ... s-7.tar of 4 samples each, but s-5.tar of 2.
void write_unequal_shards(const fs::path& dir) {
  fs::create_directories(dir);
  for (int j = 0; j < 8; ++j) {
    std::vector<data::testing::TarEntry> entries;
    for (int k = 0; k < (j == 5 ? 2 : 4); ++k) {
      const std::string key = fmt::format("{}_{}", j, k);
      const auto image = data::testing::pattern_image(10, 9, j * 4 + k);
      entries.push_back({key + ".png", data::testing::encode_png(image)});
      entries.push_back({key + ".cls", data::testing::text_bytes(std::to_string(k % 2))});
    }
    data::testing::write_tar(dir / fmt::format("s-{}.tar", j), entries);
  }
}

std::string config_error(const Overrides& overrides, const fs::path& dir) {
  try {
    Trainer(trainer_options_from_config(synthetic_job_config(dir, overrides))).run();
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(no ConfigError)";
}

TEST(TrainerWebDatasetTest, LargoTrainRunsOnAFolderPackedIntoShards) {
  largo::testing::TestDir dir;
  const std::string shards = packed_folder(dir / "data", 3);
  const largo::testing::ProgramResult run = largo::testing::run_program(
      {largo::testing::largo_program(),
       "train",
       "DATA.TRAIN.DATA_SOURCES=[webdataset]",
       "DATA.TRAIN.DATA_PATHS=" + shard_list(shards),
       "DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
       "DATA.TRAIN.TRANSFORMS=[{name: RandomResizedCrop, size: 8}, {name: ToTensor}]",
       "DATA.TEST.DATA_SOURCES=[webdataset]",
       "DATA.TEST.DATA_PATHS=" + shard_list(shards),
       "DATA.TEST.BATCHSIZE_PER_REPLICA=8",
       "DATA.TEST.TRANSFORMS=[{name: CenterCrop, size: 8}, {name: ToTensor}]",
       "DATA.NUM_DATALOADER_WORKERS=2",
       "MODEL.TRUNK.NAME=small_cnn",
       "OPTIMIZER.num_epochs=1",
       "LOG_FREQUENCY=1",
       "MACHINE.DEVICE=cpu",
       "CHECKPOINT.DIR=" + (dir / "run").string()});
  ASSERT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  // The default job's 2 ranks x 2 loader threads: 4 streams of 2 shards of 3 samples, so
  // each rank reads 12 samples, 3 steps of 4.
  EXPECT_NE(
      run.output.find("webdataset: 8 shards; each rank reads 12 samples an epoch"),
      std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("iter 3/3"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("final test accuracy"), std::string::npos) << run.output;
}

TEST(TrainerWebDatasetTest, MidEpochResumeIsBitExactAndAnotherLoaderThreadCountIsRefused) {
  const fs::path dir = test_dir_for("webdataset");
  const Overrides job = webdataset_job(packed_folder(dir / "data"));
  auto single = comm::ProcessGroup::single_process();
  RunResult reference = train_run(dir / "full", job, single);
  ASSERT_EQ(reference.summary.iteration_losses.size(), 12u); // 2 epochs of 6 steps
  const Overrides interrupted = job + Overrides{"CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2"};
  EXPECT_TRUE(train_run(dir / "resumed", interrupted, single, 9).summary.interrupted);
  copy_run(dir / "resumed", dir / "three_threads");
  // Iteration 8 is mid-epoch 2: the resumed run re-derives the epoch's streams and starts at
  // its batch 2, so it reads neither a sample again nor skips one.
  expect_resumed_bit_exactly(
      train_run(dir / "resumed", interrupted, single), reference, 8, "resumed at iteration 8");
  try {
    train_run(
        dir / "three_threads", interrupted + Overrides{"DATA.NUM_DATALOADER_WORKERS=3"}, single);
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& error) {
    const std::string message = error.what();
    EXPECT_NE(
        message.find("WebDatasetSampler streams_per_replica=2 shuffle_buffer=5"), std::string::npos)
        << message;
    EXPECT_NE(message.find("DATA.NUM_DATALOADER_WORKERS"), std::string::npos) << message;
  }
  fs::remove_all(dir);
}

// 7 shards of 4 samples and one of 2 (30 samples) over 2 ranks of 2 loader threads: each
// stream reads L = 2 + 4 = 6 samples, so each rank 12 (3 steps) in every epoch, whichever
// shards it is dealt; unequal counts would leave a rank waiting in the other's all-reduce.
TEST(TrainerWebDatasetTest, TwoRanksTakeTheSameStepsOnShardsOfUnequalSize) {
  const fs::path dir = test_dir_for("webdataset");
  if (largo::testing::is_parent()) { // the ranks run this test again, in child processes
    fs::remove_all(dir);
    write_unequal_shards(dir / "shards");
  }
  largo::testing::run_on_ranks(2, [&](comm::ProcessGroup& group) {
    const Overrides job = webdataset_job((dir / "shards" / "s-*.tar").string());
    RunResult run = train_run(dir / "run", job, train::borrow(group));
    EXPECT_EQ(run.summary.iteration_losses.size(), 6u) << "rank " << group.rank();
  });
  fs::remove_all(dir);
}

TEST(TrainerWebDatasetTest, WhatItCannotHonourIsRefusedNamingTheKey) {
  const fs::path dir = test_dir_for("webdataset");
  const Overrides job = webdataset_job(packed_folder(dir / "data"));
  EXPECT_NE(
      config_error(job + Overrides{"DATA.TRAIN.DATA_LIMIT=10"}, dir / "run")
          .find("DATA.TRAIN.DATA_LIMIT = 10: expected -1 with DATA_SOURCES [webdataset]"),
      std::string::npos);
  EXPECT_NE(
      config_error(job + Overrides{"DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER=True"}, dir / "run")
          .find("DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER = True: expected False"),
      std::string::npos);
  // 6 shards cannot feed 8 loader threads whole shards.
  const std::string threads =
      config_error(job + Overrides{"DATA.NUM_DATALOADER_WORKERS=8"}, dir / "run");
  EXPECT_NE(
      threads.find("config key DATA.NUM_DATALOADER_WORKERS = 8: expected at most 6"),
      std::string::npos)
      << threads;
  EXPECT_NE(
      config_error({"DATA.TRAIN.WEBDATASET.SHUFFLE_BUFFER=10"}, dir / "run")
          .find("applies to DATA_SOURCES [webdataset] only"),
      std::string::npos);
  fs::remove_all(dir);
}

} // namespace
} // namespace largo::train::trainer_webdataset_test
