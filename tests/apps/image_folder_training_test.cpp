// `largo train` on an ImageNet-layout folder of JPEGs: configs/examples/imagenet_resnet50.yaml
// (ResNet-50, RandomResizedCrop 224 / Resize 256 + CenterCrop 224, SGD with the scaled
// warm-up) runs as written for a few iterations, with only the data's place and the run's
// size overridden.
#include "apps/program_runner.h"
#include "data/image_test_util.h"
#include "test_paths.h"

#include <gtest/gtest.h>

namespace largo::testing::image_folder_training_test {
namespace {

namespace fs = std::filesystem;

// 2 classes of 4 photographs-like JPEGs of ImageNet-like aspect ratios.
void write_image_folder(const fs::path& root) {
  int seed = 0;
  for (const std::string label : {"n01440764", "n01443537"}) {
    fs::create_directories(root / label);
    for (int i = 0; i < 4; ++i, ++seed) {
      const auto image = data::testing::pattern_image(300 + 10 * seed, 240 + 5 * seed, seed);
      data::testing::write_bytes(
          root / label / fmt::format("img{}.JPEG", i), data::testing::encode_jpeg(image));
    }
  }
}

TEST(ImageFolderTrainingTest, TheImageNetRecipeRunsAsWritten) {
  TestDir dir;
  write_image_folder(dir / "images");
  const std::string images = "[" + (dir / "images").string() + "]";
  const ProgramResult run = run_program(
      {largo_program(),
       "train",
       std::string(largo::test_paths::data_dir()) + "/../configs/examples/imagenet_resnet50.yaml",
       "DATA.TRAIN.DATA_PATHS=" + images,
       "DATA.TEST.DATA_PATHS=" + images,
       "DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
       "DATA.TEST.BATCHSIZE_PER_REPLICA=4",
       "DATA.NUM_DATALOADER_WORKERS=2",
       "OPTIMIZER.num_epochs=1",
       "LOG_FREQUENCY=1",
       // The step schedule's milestones (epochs 30, 60, 80 of 90) cannot fall inside one
       // epoch: the warm-up stays, a constant stands in for the steps.
       "OPTIMIZER.param_schedulers.lr.schedulers=[{name: linear, start_value: 0.0, end_value: "
       "0.1}, {name: constant, value: 0.1}]",
       "MACHINE.DEVICE=cpu",
       "CHECKPOINT.DIR=" + (dir / "run").string()},
      {},
      std::chrono::seconds(600));
  ASSERT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  // 8 images in batches of 2: 4 steps, then the test split, then the final checkpoint.
  EXPECT_NE(run.output.find("iter 4/4"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("final test accuracy"), std::string::npos) << run.output;
  EXPECT_TRUE(fs::exists(dir / "run" / "model_final_checkpoint_phase0.torch"));
}

} // namespace
} // namespace largo::testing::image_folder_training_test
