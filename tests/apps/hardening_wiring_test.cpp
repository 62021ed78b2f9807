// Issue 19 cases that need the trainer to call the run-directory and data-check library
// functions (train/resume_policy.h, train/data_checks.h, checkpoint/model_state.h's source
// argument): resume fallback, fresh-start protection, stale temporaries, shape and class
// mismatches, empty splits, foreign checkpoints. Through the `largo` program.
#include "apps/hardening_util.h"
#include "apps/program_runner.h"
#include "checkpoint/checkpoint_test_util.h"

#include <largo/checkpoint/checkpoint_file.h>

#include <gtest/gtest.h>

namespace largo::testing::hardening_wiring_test {
namespace {

namespace fs = std::filesystem;

void flip_a_tensor_bit(const fs::path& file) {
  flip_bits_in_entry(file, "archive/data/0", 1);
}

TEST(HardeningWiringTest, ADamagedOrMissingLinkFallsBackToTheNewestIntactCheckpoint) {
  TestDir dir;
  ASSERT_TRUE(run_program({largo_program(), "train", write_job(dir, 2).string()}).succeeded());
  const fs::path run_dir = dir / "run";
  flip_a_tensor_bit(fs::canonical(run_dir / "checkpoint.torch")); // the final checkpoint
  auto run = run_program({largo_program(), "train", write_job(dir, 3).string()});
  ASSERT_TRUE(run.succeeded()) << run.output;
  EXPECT_TRUE(output_contains(run.output, "model_final_checkpoint_phase1.torch is corrupt"))
      << run.output;
  EXPECT_TRUE(
      output_contains(run.output, "resuming from " + (run_dir / "model_phase0.torch").string()))
      << run.output;
  EXPECT_FALSE(output_contains(run.output, "epoch 1/3")) << "must not restart from epoch 0:\n"
                                                         << run.output;

  fs::remove(run_dir / "checkpoint.torch"); // what the old docs told users to do
  run = run_program({largo_program(), "train", write_job(dir, 4).string()});
  ASSERT_TRUE(run.succeeded()) << run.output;
  EXPECT_TRUE(output_contains(run.output, "checkpoint.torch is missing")) << run.output;
  EXPECT_FALSE(output_contains(run.output, "epoch 1/4")) << run.output;
}

TEST(HardeningWiringTest, AFreshStartNeverOverwritesOlderCheckpoints) {
  TestDir dir;
  ASSERT_TRUE(run_program({largo_program(), "train", write_job(dir, 1).string()}).succeeded());
  auto run = run_program(
      {largo_program(), "train", write_job(dir, 1).string(), "CHECKPOINT.AUTO_RESUME=False"});
  expect_clean_failure(run, 4, "would overwrite them");
  run = run_program(
      {largo_program(),
       "train",
       write_job(dir, 1).string(),
       "CHECKPOINT.AUTO_RESUME=False",
       "CHECKPOINT.OVERWRITE_EXISTING=True"});
  ASSERT_TRUE(run.succeeded()) << run.output;
  EXPECT_TRUE(fs::is_directory(dir / "run" / "previous_runs")) << run.output;
}

TEST(HardeningWiringTest, TemporariesOfKilledWritesAreRemovedAtStart) {
  TestDir dir;
  fs::create_directories(dir / "run");
  std::ofstream(dir / "run" / "model_phase0.torch.tmp.999999999") << "partial";
  ASSERT_TRUE(run_program({largo_program(), "train", write_job(dir, 1).string()}).succeeded());
  EXPECT_FALSE(fs::exists(dir / "run" / "model_phase0.torch.tmp.999999999"));
}

TEST(HardeningWiringTest, ShapeClassAndSampleMismatchesAreRefusedBeforeTraining) {
  TestDir dir;
  const std::string job = write_job(dir, 1).string();
  // A RandomCrop that changes the size: the model is built for the cropped images.
  auto run = run_program(
      {largo_program(),
       "train",
       job,
       "DATA.TRAIN.TRANSFORMS=[{name: RandomCrop, size: [6]}, {name: ToTensor}]",
       "DATA.TEST.TRANSFORMS=[{name: RandomCrop, size: [6]}, {name: ToTensor}]"});
  EXPECT_TRUE(run.succeeded()) << run.output;
  expect_clean_failure(
      run_program(
          {largo_program(),
           "train",
           job,
           "DATA.TRAIN.TRANSFORMS=[{name: RandomCrop, size: [6]}, {name: ToTensor}]"}),
      2,
      "DATA.TEST yields 1x8x8 images but the model is built for DATA.TRAIN's 1x6x6 images");
  expect_clean_failure(
      run_program({largo_program(), "train", job, "DATA.TEST.SYNTHETIC.IMAGE_SHAPE=[1,10,10]"}),
      2,
      "DATA.TEST yields 1x10x10 images");
  expect_clean_failure(
      run_program({largo_program(), "train", job, "DATA.TEST.SYNTHETIC.NUM_CLASSES=40"}),
      2,
      "DATA.TEST has 40 classes but the model's head has 4 outputs");
}

TEST(HardeningWiringTest, EmptySplitsAreRefusedNamingWhereTheSamplesComeFrom) {
  TestDir dir;
  fs::create_directories(dir / "empty");
  const auto big_endian = [](uint32_t v) {
    return std::string{
        static_cast<char>(v >> 24),
        static_cast<char>(v >> 16),
        static_cast<char>(v >> 8),
        static_cast<char>(v)};
  };
  for (const char* split : {"train", "t10k"}) {
    std::ofstream(dir / "empty" / fmt::format("{}-images-idx3-ubyte", split))
        << big_endian(2051) + big_endian(0) + big_endian(28) + big_endian(28);
    std::ofstream(dir / "empty" / fmt::format("{}-labels-idx1-ubyte", split))
        << big_endian(2049) + big_endian(0);
  }
  const std::string job = write_job(dir, 1).string();
  const std::string path = fmt::format("[{}]", (dir / "empty").string());
  auto run = run_program(
      {largo_program(),
       "train",
       job,
       "DATA.TEST.DATA_SOURCES=[torchvision_dataset]",
       "DATA.TEST.DATASET_NAMES=[MNIST]",
       "DATA.TEST.DATA_PATHS=" + path,
       "DATA.TRAIN.SYNTHETIC.IMAGE_SHAPE=[1,28,28]",
       "DATA.TRAIN.SYNTHETIC.NUM_CLASSES=10"});
  expect_clean_failure(run, 3, "DATA.TEST has no samples");
  run = run_program(
      {largo_program(),
       "train",
       job,
       "DATA.TRAIN.DATA_SOURCES=[torchvision_dataset]",
       "DATA.TRAIN.DATASET_NAMES=[MNIST]",
       "DATA.TRAIN.DATA_PATHS=" + path,
       "DATA.TEST.SYNTHETIC.IMAGE_SHAPE=[1,28,28]"});
  expect_clean_failure(run, 3, "DATA.TRAIN has no samples");
  EXPECT_FALSE(output_contains(run.output, "DROP_LAST")) << run.output;
}

TEST(HardeningWiringTest, ForeignCheckpointsAreRefusedNamingTheFile) {
  TestDir dir;
  fs::create_directories(dir / "run");
  // A checkpoint whose "model" entry is a tensor.
  checkpoint::StateDict state = checkpoint::make_state_dict();
  state.insert("model", torch::ones({3}));
  for (const char* key : {"optimizer"}) {
    state.insert(key, checkpoint::make_state_dict());
  }
  checkpoint::save_checkpoint(dir / "run" / "model_phase0.torch", state);
  fs::create_symlink("model_phase0.torch", dir / "run" / "checkpoint.torch");
  expect_clean_failure(
      run_program({largo_program(), "train", write_job(dir, 2).string()}),
      4,
      "model_phase0.torch is not a Largo training checkpoint: its entry 'model' "
      "is a Tensor");
  // A checkpoint of another class count.
  TestDir other;
  ASSERT_TRUE(run_program({largo_program(), "train", write_job(other, 1).string()}).succeeded());
  const auto run = run_program(
      {largo_program(),
       "train",
       write_job(other, 2).string(),
       "DATA.TRAIN.SYNTHETIC.NUM_CLASSES=7",
       "DATA.TEST.SYNTHETIC.NUM_CLASSES=7"});
  expect_clean_failure(
      run,
      4,
      "model_final_checkpoint_phase0.torch: the checkpoint's model does "
      "not match this model");
}

} // namespace
} // namespace largo::testing::hardening_wiring_test
