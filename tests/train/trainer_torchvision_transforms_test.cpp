// VISSL's configs for torchvision datasets with per-image transforms, as VISSL's
// benchmark/linear_image_classification/cifar10 config writes them (Resize to a larger size,
// then the batch transforms): the config loads and trains, the model sized for the resized
// images; a gray dataset needs VISSL's MNISTImgPil2RGB, and the error says so with the key.
#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "train/trainer_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace largo::train::trainer_torchvision_transforms_test {
namespace {

namespace fs = std::filesystem;

// CIFAR-10's binary files with `records` records each: label i % 10, pixel bytes varied.
void write_cifar10(const fs::path& dir, int records) {
  fs::create_directories(dir);
  std::vector<std::string> names = {"test_batch.bin"};
  for (int i = 1; i <= 5; ++i) {
    names.push_back("data_batch_" + std::to_string(i) + ".bin");
  }
  int n = 0;
  for (const std::string& name : names) {
    std::ofstream out(dir / name, std::ios::binary);
    for (int r = 0; r < records; ++r, ++n) {
      out.put(static_cast<char>(n % 10));
      for (int byte = 0; byte < 3 * 32 * 32; ++byte) {
        out.put(static_cast<char>((n * 37 + byte * 11 + byte / 97) % 256));
      }
    }
  }
}

// VISSL's cifar10 linear-evaluation DATA section, sizes scaled down for a test.
std::vector<std::string> cifar_overrides(const fs::path& data, const std::string& test_first) {
  const std::string normalize =
      "{name: Normalize, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}";
  return {
      "DATA.TRAIN.DATA_SOURCES=[torchvision_dataset]",
      "DATA.TRAIN.LABEL_SOURCES=[torchvision_dataset]",
      "DATA.TRAIN.DATASET_NAMES=[CIFAR10]",
      "DATA.TRAIN.DATA_PATHS=[" + data.string() + "]",
      "DATA.TRAIN.TRANSFORMS=[{name: Resize, size: 40}, {name: RandomHorizontalFlip}, "
      "{name: ToTensor}, " +
          normalize + "]",
      "DATA.TEST.DATA_SOURCES=[torchvision_dataset]",
      "DATA.TEST.LABEL_SOURCES=[torchvision_dataset]",
      "DATA.TEST.DATASET_NAMES=[" + test_first + "]",
      "DATA.TEST.DATA_PATHS=[" + data.string() + "]",
      "DATA.TEST.TRANSFORMS=[{name: Resize, size: 40}, {name: ToTensor}, " + normalize + "]",
      "DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
      "DATA.TEST.BATCHSIZE_PER_REPLICA=8",
      "OPTIMIZER.num_epochs=1"};
}

// Trains the synthetic job's model with `overrides` into dir/run; every loss is finite.
TrainSummary train(const fs::path& dir, const std::vector<std::string>& overrides) {
  const Config config = synthetic_job_config(dir / "run", overrides);
  TrainSummary summary = Trainer(trainer_options_from_config(config), config.to_yaml()).run();
  for (const float loss : summary.iteration_losses) {
    EXPECT_TRUE(std::isfinite(loss));
  }
  return summary;
}

// Each test's data and run under one directory, removed before and after.
class TrainerTorchvisionTransforms : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test_dir_for("torchvision_transforms");
    fs::remove_all(dir_);
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }

  fs::path dir_;
};

TEST_F(TrainerTorchvisionTransforms, VisslsCifarConfigWithResizeTrains) {
  write_cifar10(dir_ / "cifar", 4); // 20 training images, 4 test images
  const TrainSummary summary = train(dir_, cifar_overrides(dir_ / "cifar", "CIFAR10"));
  EXPECT_EQ(summary.iterations, 3); // ceil(20 / 8)
  EXPECT_TRUE(summary.final_top1.has_value());
}

// SimCLR on CIFAR-10: two views of each stored image (VISSL's SimCLR list), in small.
TEST_F(TrainerTorchvisionTransforms, SimclrOnCifarTrainsOnTwoViewsOfEachImage) {
  write_cifar10(dir_ / "cifar", 4);
  std::vector<std::string> overrides = cifar_overrides(dir_ / "cifar", "CIFAR10");
  for (const std::string& override :
       {std::string("DATA.TRAIN.TRANSFORMS=[{name: ImgReplicatePil, num_times: 2}, {name: "
                    "RandomResizedCrop, size: 24}, {name: RandomHorizontalFlip}, {name: "
                    "ImgPilColorDistortion, strength: 1.0}, {name: ToTensor}]"),
        std::string("DATA.TRAIN.COLLATE_FUNCTION=simclr_collator"),
        std::string("LOSS.name=simclr_info_nce_loss"),
        std::string("LOSS.simclr_info_nce_loss.buffer_params.embedding_dim=16"),
        std::string("MODEL.TRUNK.NAME=resnet"),
        std::string("MODEL.TRUNK.RESNETS.DEPTH=18"),
        std::string("MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 64], use_relu: True, "
                    "skip_last_layer_relu_bn: False}], [mlp, {dims: [64, 16]}]]"),
        std::string("TEST_MODEL=False")}) {
    overrides.push_back(override);
  }
  EXPECT_EQ(train(dir_, overrides).iterations, 3); // ceil(20 / 8)
}

TEST_F(TrainerTorchvisionTransforms, GrayDatasetWithoutMnistImgPil2RgbNamesTheKey) {
  write_cifar10(dir_ / "cifar", 1);
  std::vector<std::string> overrides = cifar_overrides(dir_ / "cifar", "MNIST");
  const Config config = synthetic_job_config(dir_ / "run", overrides);
  try {
    Trainer(trainer_options_from_config(config), config.to_yaml()).run();
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("DATA.TEST.TRANSFORMS"), std::string::npos) << message;
    EXPECT_NE(message.find("MNISTImgPil2RGB"), std::string::npos) << message;
  }
}

} // namespace
} // namespace largo::train::trainer_torchvision_transforms_test
