// A run interrupted mid-epoch resumes at another world size (Gloo over 127.0.0.1): the
// stateful sampler continues the epoch with exactly the samples not yet read, split over
// the new ranks, and the run finishes its epochs there; for DDP, ZeRO-2 and FSDP (whose
// sharded optimizer state is resharded). Where an epoch cannot be continued (a pipeline) the
// resume is refused by name.
#include <largo/core/error.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

namespace largo::train::trainer_resume_world_size_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

// 48 samples in batches of 4 on the stateful sampler, 2 epochs, a checkpoint every
// `checkpoint_every` iterations, no evaluation (what is checked is what the steps read), every
// step's learning rate logged (a cosine from 0.1 over the run's steps).
Overrides job(int64_t checkpoint_every) {
  return {
      "LOG_FREQUENCY=1",
      "DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=48",
      "DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
      "DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER=True",
      "OPTIMIZER.num_epochs=2",
      "TEST_MODEL=False",
      "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=" + std::to_string(checkpoint_every)};
}

// Trains `overrides` on `group`, recording the samples read; rank r writes them, by epoch, to
// dir/read_<name>_<r>.json for the parent to check.
TrainSummary train_and_record(
    const fs::path& dir,
    const Overrides& overrides,
    comm::ProcessGroup& group,
    const std::string& name,
    int64_t stop_after = -1) {
  auto options = trainer_options_from_config(synthetic_job_config(dir / "run", overrides));
  options.stop_after_iterations = stop_after;
  options.record_samples_read = true;
  TrainSummary summary = Trainer(options, "", borrow(group)).run();
  nlohmann::json read;
  for (const auto& [epoch, indices] : summary.samples_read) {
    read[std::to_string(epoch)] = indices;
  }
  std::ofstream(dir / ("read_" + name + "_" + std::to_string(group.rank()) + ".json")) << read;
  return summary;
}

// What every rank of a run read in `epoch`.
std::vector<int64_t>
read_in_epoch(const fs::path& dir, const std::string& name, int ranks, int64_t epoch) {
  std::vector<int64_t> read;
  for (int rank = 0; rank < ranks; ++rank) {
    std::ifstream in(dir / ("read_" + name + "_" + std::to_string(rank) + ".json"));
    const auto record = nlohmann::json::parse(in);
    const std::string key = std::to_string(epoch);
    if (record.contains(key)) {
      const auto indices = record.at(key).get<std::vector<int64_t>>();
      read.insert(read.end(), indices.begin(), indices.end());
    }
  }
  return read;
}

// The learning rate rank 0 logged last for global iteration `iteration` (1-based).
double logged_lr(const fs::path& run_dir, int64_t iteration) {
  double lr = -1.0;
  for (const auto& event : read_metrics(run_dir / "metrics.jsonl")) {
    if (event["phase"] == "train" && event["iteration"] == iteration) {
      lr = event["lr"].get<double>();
    }
  }
  return lr;
}

// The synthetic job's cosine at `position` (0 to 1) through the run.
double cosine_lr(double position) {
  return 0.1 * (1.0 + std::cos(M_PI * position)) / 2.0;
}

void expect_each_sample_once(std::vector<int64_t> read, const std::string& what) {
  std::sort(read.begin(), read.end());
  std::vector<int64_t> all(48);
  std::iota(all.begin(), all.end(), int64_t{0});
  EXPECT_EQ(read, all) << what;
}

// `from` ranks train `mode` and are interrupted after `stop_after` iterations (a checkpoint
// just written, mid-epoch 0); `to` ranks resume and finish both epochs. Epoch 0 is read
// exactly once by the two runs together, epoch 1 exactly once by the second.
void expect_epoch_continued(
    const std::string& name,
    int from,
    int to,
    int64_t stop_after,
    const Overrides& mode,
    int64_t iterations_after) {
  const fs::path dir = test_dir_for("resume_world_size") / name;
  if (largo::testing::is_parent()) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  const Overrides overrides = job(stop_after) + mode;
  run_on_ranks(from, [&](comm::ProcessGroup& group) {
    EXPECT_TRUE(train_and_record(dir, overrides, group, "before", stop_after).interrupted);
  });
  run_on_ranks(to, [&](comm::ProcessGroup& group) {
    const TrainSummary summary = train_and_record(dir, overrides, group, "after");
    EXPECT_TRUE(summary.resumed);
    EXPECT_EQ(summary.epochs_completed, 2);
    EXPECT_EQ(summary.iteration_losses.size(), static_cast<size_t>(iterations_after));
    for (const float loss : summary.iteration_losses) {
      EXPECT_TRUE(std::isfinite(loss));
    }
  });
  std::vector<int64_t> epoch0 = read_in_epoch(dir, "before", from, 0);
  const std::vector<int64_t> rest = read_in_epoch(dir, "after", to, 0);
  epoch0.insert(epoch0.end(), rest.begin(), rest.end());
  expect_each_sample_once(epoch0, name + ": the interrupted epoch");
  expect_each_sample_once(read_in_epoch(dir, "after", to, 1), name + ": the next epoch");
  const auto final_state =
      checkpoint::load_checkpoint(dir / "run" / "model_final_checkpoint_phase1.torch");
  EXPECT_TRUE(final_state.at("complete").toBool()) << name;
  EXPECT_EQ(final_state.at("world_size").toInt(), to) << name;
  // Both jobs stop halfway through epoch 0 of 2: the schedule goes on from a quarter of the
  // run by the samples read (counting the new iterations per epoch would say otherwise), and
  // epoch 1 starts at half of it.
  EXPECT_NEAR(logged_lr(dir / "run", stop_after + 1), cosine_lr(0.25), 1e-12) << name;
  const int64_t epoch1_steps = 48 / (to * 4);
  const int64_t epoch1_first = stop_after + iterations_after - epoch1_steps + 1;
  EXPECT_NEAR(logged_lr(dir / "run", epoch1_first), cosine_lr(0.5), 1e-12) << name;
}

// 2 ranks read 3 batches of their 24 each; 3 ranks read the other 24 in 2 batches each, then
// epoch 1 in 4.
TEST(TrainerResumeWorldSizeTest, DdpTwoRanksToThreeMidEpochReadsEverySampleOnce) {
  expect_epoch_continued("ddp_2_to_3", 2, 3, /*stop_after=*/3, {}, /*iterations_after=*/2 + 4);
}

// 3 ranks read 2 batches of their 16 each; 2 ranks read the other 24 in 3 batches each, then
// epoch 1 in 6.
TEST(TrainerResumeWorldSizeTest, DdpThreeRanksToTwoMidEpochReadsEverySampleOnce) {
  expect_epoch_continued("ddp_3_to_2", 3, 2, 2, {}, 3 + 6);
}

// The ZeRO-2 optimizer shards of 2 ranks resharded over 3.
TEST(TrainerResumeWorldSizeTest, ZeroStageTwoTwoRanksToThreeMidEpoch) {
  expect_epoch_continued(
      "zero2_2_to_3",
      2,
      3,
      3,
      {"MODEL.SHARDED_DDP_SETUP.USE_SDP=True", "MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=3000"},
      2 + 4);
}

// FSDP's shards of 3 ranks resharded over 2.
TEST(TrainerResumeWorldSizeTest, FsdpThreeRanksToTwoMidEpoch) {
  expect_epoch_continued("fsdp_3_to_2", 3, 2, 2, {"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}, 3 + 6);
}

// A pipeline's mid-epoch checkpoint (2 stages of one replica) does not continue in one process
// without a pipeline: refused naming the key, before anything is trained.
TEST(TrainerResumeWorldSizeTest, APipelinesMidEpochCheckpointAtAnotherLayoutIsRefusedByName) {
  const fs::path dir = test_dir_for("resume_world_size") / "pipeline";
  if (largo::testing::is_parent()) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  const Overrides pipeline = {
      "DISTRIBUTED.PIPELINE_SIZE=2",
      "MODEL.PIPELINE.NUM_MICROBATCHES=2",
      "MODEL.TRUNK.SMALL_CNN.DROPOUT=0.0"};
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    train_and_record(dir, job(2) + pipeline, group, "before", /*stop_after=*/2);
  });
  try {
    train_and_record(
        dir,
        job(2) + Overrides{"MODEL.TRUNK.SMALL_CNN.DROPOUT=0.0"},
        *comm::ProcessGroup::single_process(),
        "after");
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("DISTRIBUTED.PIPELINE_SIZE"), std::string::npos) << what;
    EXPECT_NE(what.find("2 rank(s) (1 reading data"), std::string::npos) << what;
  }
}

} // namespace
} // namespace largo::train::trainer_resume_world_size_test
