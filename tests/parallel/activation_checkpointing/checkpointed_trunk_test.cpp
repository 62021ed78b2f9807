// The trainer-facing side of activation checkpointing: planning the cut of a trunk by
// measured activation bytes, and the memory report (what checkpointing saves, measured).
#include <largo/core/error.h>
#include <largo/core/rng_state.h>
#include <largo/models/model_factory.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>
#include <largo/parallel/activation_checkpointing/checkpointed_trunk.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::parallel::checkpointed_trunk_test {
namespace {

using models::ModelOptions;
using models::TrunkHeadModel;

ModelOptions resnet18_options() {
  ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = 18;
  options.resnet.stem = "cifar";
  options.in_channels = 3;
  options.image_size = 16;
  return options;
}

class CheckpointedTrunkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    seed_everything(3);
    model_ = models::build_model(resnet18_options());
  }
  const std::vector<int64_t> sample_shape_{3, 16, 16};
  TrunkHeadModel model_{nullptr};
};

TEST_F(CheckpointedTrunkTest, MeasuresWhatEachBlockHolds) {
  auto bytes = measure_trunk_block_activation_bytes(model_, torch::zeros({2, 3, 16, 16}));
  ASSERT_TRUE(bytes.has_value());
  ASSERT_EQ(static_cast<int64_t>(bytes->size()), model_->num_trunk_blocks());
  // The stem (conv, BN, in-place ReLU at 16x16 with 64 channels) keeps at least its conv
  // output (BN's input) and its BN output (the ReLU's, in place): 2 x 2 x 64 x 16 x 16 floats.
  EXPECT_GE(bytes->front(), 2 * 2 * 64 * 16 * 16 * 4);
  // Activations shrink with the resolution: the first residual block holds more than the
  // last one (512 channels at 2x2).
  EXPECT_GT((*bytes)[1], (*bytes)[8]);
  for (int64_t value : *bytes) {
    EXPECT_GT(value, 0);
  }
}

TEST_F(CheckpointedTrunkTest, ProbesLeaveTheModelAndTheRngAsTheyWere) {
  model_->eval();
  std::vector<at::Tensor> parameters;
  std::vector<at::Tensor> buffers;
  for (const auto& parameter : model_->parameters()) {
    parameters.push_back(parameter.detach().clone());
  }
  for (const auto& buffer : model_->buffers()) {
    buffers.push_back(buffer.clone());
  }
  const at::Tensor rng = cpu_rng_state();

  CheckpointedTrunk trunk =
      CheckpointedTrunk::plan(model_, TrunkCheckpointingOptions(3), sample_shape_);
  ASSERT_TRUE(measure_activation_memory(trunk, sample_shape_, 8).has_value());

  EXPECT_FALSE(model_->is_training());
  EXPECT_TRUE(torch::equal(rng, cpu_rng_state()));
  size_t i = 0;
  for (const auto& parameter : model_->parameters()) {
    EXPECT_TRUE(torch::equal(parameters[i++], parameter));
    EXPECT_FALSE(parameter.grad().defined());
  }
  i = 0;
  for (const auto& buffer : model_->buffers()) {
    EXPECT_TRUE(torch::equal(buffers[i++], buffer));
  }
}

TEST_F(CheckpointedTrunkTest, PlanBalancesMeasuredActivationBytes) {
  CheckpointedTrunk trunk =
      CheckpointedTrunk::plan(model_, TrunkCheckpointingOptions(3), sample_shape_);
  const auto& bytes = trunk.block_activation_bytes();
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), model_->num_trunk_blocks());
  std::vector<double> costs(bytes.begin(), bytes.end());
  EXPECT_EQ(trunk.boundaries(), balanced_segment_boundaries(costs, 3));
  EXPECT_EQ(trunk.num_checkpointed_segments(), 2);
  // ResNet activations are front-heavy, so the balanced cut puts fewer blocks in the
  // first segment than an equal split of the 10 blocks would (0, 3, 6, 10).
  EXPECT_LT(trunk.boundaries()[1], 3);
  EXPECT_NE(trunk.describe().find("cut to balance measured activation bytes"), std::string::npos)
      << trunk.describe();

  CheckpointedTrunk by_count = CheckpointedTrunk::plan(
      model_, TrunkCheckpointingOptions(3).cost(SegmentCost::kBlockCount), sample_shape_);
  EXPECT_EQ(by_count.boundaries(), (std::vector<int64_t>{0, 3, 6, 10}));
  EXPECT_TRUE(by_count.block_activation_bytes().empty());
}

TEST_F(CheckpointedTrunkTest, TooManySplitsIsAnOptionError) {
  try {
    CheckpointedTrunk::plan(model_, TrunkCheckpointingOptions(11), sample_shape_);
    FAIL() << "expected OptionError";
  } catch (const OptionError& error) {
    // The library names its own option; the config layer names the YAML key (tested there).
    EXPECT_EQ(error.option(), "ActivationCheckpointingOptions::num_splits");
    const std::string message = error.what();
    EXPECT_NE(message.find("num_splits = 11"), std::string::npos) << message;
    EXPECT_NE(message.find("from 1 to 10"), std::string::npos) << message;
  }
  EXPECT_THROW(
      CheckpointedTrunk::plan(model_, TrunkCheckpointingOptions(0), sample_shape_), ConfigError);
  EXPECT_THROW(CheckpointedTrunk(model_, {0, 5}), Error);
}

TEST_F(CheckpointedTrunkTest, MemoryReportShowsTheSaving) {
  CheckpointedTrunk trunk =
      CheckpointedTrunk::plan(model_, TrunkCheckpointingOptions(3), sample_shape_);
  // At batch 128 the activations outweigh what does not grow with the batch (temporaries
  // of the size of the parameters: ResNet-18 has 11 M, and oneDNN reorders conv weights).
  auto report = measure_activation_memory(trunk, sample_shape_, 128);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->batch_size, 128);
  EXPECT_GT(report->peak_bytes_without, 0);
  EXPECT_LT(report->peak_bytes_with, report->peak_bytes_without);
  EXPECT_GT(report->saved_fraction(), 0.3) << report->describe();
  EXPECT_EQ(report->gradient_bytes, models::count_parameters(*model_) * 4);
  EXPECT_NE(report->how.find("projected linearly"), std::string::npos);

  // With one segment nothing is checkpointed: no saving (up to allocator noise of a few
  // small tensors).
  CheckpointedTrunk whole(model_, {0, model_->num_trunk_blocks()});
  auto none = measure_activation_memory(whole, sample_shape_, 4);
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->how, "measured on probe steps at batch 4");
  EXPECT_NEAR(none->saved_fraction(), 0.0, 0.02);
}

} // namespace
} // namespace largo::parallel::checkpointed_trunk_test
