// MODEL.CHANNELS_LAST: a channels-last ResNet trains like the NCHW one (within the rounding
// of its convolutions' sums), writes checkpoints in the standard layout, resumes bit for bit,
// and a checkpoint moves between the layouts; the key is refused where it cannot apply.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/channels_last.h>
#include <largo/core/error.h>
#include <largo/train/run_plan.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "train/trainer_test_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>

namespace largo::train::trainer_channels_last_test {
namespace {

namespace fs = std::filesystem;

// ResNet-18 (cifar stem) on 16 synthetic 3x16x16 images, batch 8: 2 iterations an epoch.
Config resnet_config(
    const fs::path& dir, const std::string& channels_last, std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {
      "DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16",
      "DATA.TRAIN.SYNTHETIC.IMAGE_SHAPE=[3,16,16]",
      "DATA.TEST.SYNTHETIC.IMAGE_SHAPE=[3,16,16]",
      "DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
      "DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]",
      "MODEL.TRUNK.NAME=resnet",
      "MODEL.TRUNK.RESNETS.DEPTH=18",
      "MODEL.TRUNK.RESNETS.STEM=cifar",
      "TEST_MODEL=False",
      "OPTIMIZER.num_epochs=2",
      "OPTIMIZER.param_schedulers.lr.start_value=0.01",
      "MODEL.CHANNELS_LAST=" + channels_last};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return synthetic_job_config(dir, overrides);
}

std::map<std::string, at::Tensor> parameters_of(Trainer& trainer) {
  std::map<std::string, at::Tensor> values;
  for (const auto& item : trainer.model()->named_parameters()) {
    values.emplace(item.key(), item.value().detach().clone());
  }
  return values;
}

TEST(TrainerChannelsLastTest, TrainsLikeNchwAndWritesTheStandardLayout) {
  const fs::path dir = test_dir_for("channels_last");
  fs::remove_all(dir);
  Trainer nchw(trainer_options_from_config(resnet_config(dir / "nchw", "False")));
  const TrainSummary reference = nchw.run();
  Trainer nhwc(trainer_options_from_config(resnet_config(dir / "nhwc", "True")));
  const TrainSummary summary = nhwc.run();
  for (const auto& item : nhwc.model()->named_parameters()) {
    if (item.value().dim() == 4) {
      EXPECT_TRUE(has_channels_last_strides(item.value())) << item.key();
    }
  }
  // The first loss is a forward before any update. The layouts sum each convolution's
  // K <= 512 * 9 products in other orders: within K * u of the sum of magnitudes per layer
  // (u = 2^-24), over ResNet-18's 20 convolution layers, each normalised by BatchNorm: a
  // relative bound of 20 * 4608 * u. (Measured: 2e-7.) The later losses are not bounded so:
  // BatchNorm over layer4's 2x2 maps of 8 images divides the gradients by the deviation of 32
  // values, which turns that rounding into 1e-4 of the loss after one step; both runs train.
  const double bound = 20.0 * 4608.0 * std::numeric_limits<float>::epsilon() / 2.0;
  ASSERT_EQ(summary.iteration_losses.size(), reference.iteration_losses.size());
  const double first = reference.iteration_losses.front();
  EXPECT_LE(std::abs(summary.iteration_losses.front() - first), bound * std::abs(first))
      << summary.iteration_losses.front() << " vs " << first;
  EXPECT_LT(summary.iteration_losses.back(), 0.5 * summary.iteration_losses.front());
  EXPECT_LT(reference.iteration_losses.back(), 0.5 * first);
  // torch.load reads the checkpoint either way; its tensors are laid out contiguously.
  const auto model = checkpoint::load_checkpoint(dir / "nhwc" / "checkpoint.torch").at("model");
  int64_t weights = 0;
  for (const auto& entry : model.toGenericDict()) {
    const at::Tensor value = entry.value().toTensor();
    EXPECT_EQ(value.strides(), at::IntArrayRef(c10::contiguous_strides(value.sizes())))
        << entry.key().toStringRef();
    weights += value.dim() == 4 ? 1 : 0;
  }
  EXPECT_GT(weights, 0);
  fs::remove_all(dir);
}

TEST(TrainerChannelsLastTest, ResumesBitExactlyAndACheckpointMovesBetweenLayouts) {
  const fs::path dir = test_dir_for("channels_last");
  fs::remove_all(dir);
  Trainer uninterrupted(trainer_options_from_config(resnet_config(dir / "full", "True")));
  const TrainSummary reference = uninterrupted.run();
  ASSERT_EQ(reference.iteration_losses.size(), 4u);

  // Stopped after epoch 0's checkpoint, resumed channels-last: the same floats.
  TrainerOptions first = trainer_options_from_config(resnet_config(dir / "resumed", "True"));
  first.stop_after_iterations = 3;
  ASSERT_TRUE(Trainer(first).run().interrupted);
  Trainer second(trainer_options_from_config(resnet_config(dir / "resumed", "True")));
  const TrainSummary resumed = second.run();
  ASSERT_TRUE(resumed.resumed);
  ASSERT_EQ(resumed.iteration_losses.size(), 2u);
  EXPECT_EQ(resumed.iteration_losses[0], reference.iteration_losses[2]);
  EXPECT_EQ(resumed.iteration_losses[1], reference.iteration_losses[3]);
  const auto expected = parameters_of(uninterrupted);
  for (const auto& [name, value] : parameters_of(second)) {
    EXPECT_TRUE(torch::equal(value, expected.at(name))) << name;
  }

  // The same epoch-0 checkpoint (written again by the first part) resumed by an NCHW run
  // (CHECKPOINT.AUTO_RESUME is on by default): it resumes, trains on, and keeps its weights
  // contiguous.
  fs::remove_all(dir / "resumed");
  ASSERT_TRUE(Trainer(first).run().interrupted);
  Trainer contiguous(trainer_options_from_config(resnet_config(dir / "resumed", "False")));
  const TrainSummary moved = contiguous.run();
  ASSERT_TRUE(moved.resumed);
  ASSERT_EQ(moved.iteration_losses.size(), 2u);
  EXPECT_TRUE(std::isfinite(moved.iteration_losses[1]));
  for (const auto& item : contiguous.model()->named_parameters()) {
    EXPECT_TRUE(item.value().is_contiguous()) << item.key();
  }
  fs::remove_all(dir);
}

// Runs `refused`, which must throw a ConfigError whose message holds every one of `parts`.
void expect_config_error(
    const std::function<void()>& refused, const std::vector<std::string>& parts) {
  try {
    refused();
    ADD_FAILURE() << "accepted; expected an error naming " << parts.front();
  } catch (const ConfigError& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << part << " in " << e.what();
    }
  }
}

TEST(TrainerChannelsLastTest, TheKeyIsRefusedWhereItCannotApply) {
  const fs::path dir = test_dir_for("channels_last");
  expect_config_error(
      [&] { trainer_options_from_config(resnet_config(dir, "sometimes")); },
      {"MODEL.CHANNELS_LAST", "auto, True or False"});
  expect_config_error(
      [&] { resolve_run(resnet_config(dir, "True", {"OPTIMIZER.use_zero=True"})); },
      {"MODEL.CHANNELS_LAST", "flat parameter buffers"});
  // auto on this CPU: off (on only for a convolutional trunk on a CUDA device).
  EXPECT_FALSE(resolve_run(resnet_config(dir, "auto")).channels_last);
  EXPECT_TRUE(resolve_run(resnet_config(dir, "True")).channels_last);
  fs::remove_all(dir);
}

} // namespace
} // namespace largo::train::trainer_channels_last_test
