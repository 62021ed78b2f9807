// DINO, MoCo and DeepCluster v2 under the sharded data-parallel modes (Gloo over 127.0.0.1, 2
// ranks): under ZeRO-1, ZeRO-2 and FSDP (AUTO_SETUP_FSDP, or VISSL's FSDP task) they train as under
// DDP (the losses of every step, the student, and the teacher / momentum encoder with DINO's center
// or MoCo's queue, which stay whole on every rank; DeepCluster's memory, centroids and
// assignments); under FSDP, where the module holds shards and the copies are built and updated from
// the gathered whole values, a run stopped mid-epoch resumes bit for bit; DeepCluster v2 under
// bfloat16 autocast (O1) keeps a float32 memory and shards as DDP.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/config.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "comm/distributed_test_util.h"
#include "data/image_test_util.h"
#include "train/trainer_run_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace largo::train::trainer_self_supervised_sharded_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

// fp32, as trainer_zero_test.cpp and trainer_fsdp_test.cpp argue: the sharded modes apply the
// same element-wise updates as DDP, only the order of the gradient sums (reduce-scatter or
// reduce to the owner vs all-reduce) moves the last bits. The teacher / momentum encoder is a
// convex combination of its previous values and the student's (p_t m + p_s (1 - m)), so it
// differs by no more than the student does, plus one rounding.
constexpr double kTolerance = 1e-5;

const std::vector<std::pair<std::string, Overrides>> kShardedModes = {
    {"ZeRO-1", {"OPTIMIZER.use_zero=True"}},
    // A small reduce buffer, so that buckets straddle the two ranks' shards.
    {"ZeRO-2",
     {"MODEL.SHARDED_DDP_SETUP.USE_SDP=True", "MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=3000"}},
    // VISSL's FSDP configs (SEER's, DINO's) name the task instead of AUTO_SETUP_FSDP.
    {"VISSL's FSDP task",
     {"TRAINER.TASK_NAME=self_supervision_fsdp_task",
      "MODEL.FSDP_CONFIG.flatten_parameters=False"}},
    // Every trunk block a unit of its own: the trunk is sharded outside its forward.
    {"FSDP", {"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True", "MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD=0"}},
};
const Overrides kFsdp = kShardedModes.back().second;

fs::path image_folder() {
  return pattern_image_folder("largo_trainer_ssl_sharded_images");
}

// 16 images, 4 per rank: 2 iterations per epoch, 2 epochs, a small MLP trunk.
Overrides common_job() {
  return {
      "DATA.TRAIN.DATA_SOURCES=[disk_folder]",
      "DATA.TRAIN.DATA_PATHS=[" + image_folder().string() + "]",
      "DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
      "DATA.NUM_DATALOADER_WORKERS=1",
      "TEST_MODEL=False",
      "MODEL.TRUNK.NAME=mlp",
      "MODEL.TRUNK.MLP.HIDDEN_DIMS=[64]",
      "OPTIMIZER.num_epochs=2",
      "OPTIMIZER.momentum=0.9",
      "OPTIMIZER.param_schedulers.lr={name: constant, value: 0.01}",
      "MACHINE.DEVICE=cpu",
      "MACHINE.NUM_THREADS=1"};
}

const std::string kNormalize = "{name: Normalize, mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}";

// 2 + 2 crops of 32 x 32 (the MLP trunk takes one size), collated by multicrop_collator.
Overrides four_crops() {
  return {
      "DATA.TRAIN.TRANSFORMS=[{name: ImgPilToMultiCrop, total_num_crops: 4, size_crops: [32, "
      "32], num_crops: [2, 2], crop_scales: [[0.3, 1], [0.1, 0.3]]}, {name: "
      "RandomHorizontalFlip}, {name: ToTensor}, " +
          kNormalize + "]",
      "DATA.TRAIN.COLLATE_FUNCTION=multicrop_collator"};
}

// trainer_self_supervised_test.cpp's DINO recipe, smaller: four_crops(), a
// dino_head, a fast teacher momentum (0.5) and the last layer frozen for 2 iterations
// (drop_gradients: the FSDP and ZeRO pieces too).
Overrides dino_job() {
  return common_job() + four_crops() +
         Overrides{
             "LOSS.name=dino_loss",
             "LOSS.dino_loss.momentum=0.5",
             "LOSS.dino_loss.teacher_temp_warmup_iters=2",
             "MODEL.HEAD.PARAMS=[[dino_head, {in_dim: 64, num_clusters: [16], hidden_dim: 32, "
             "bottleneck_dim: 8, normalize_last_layer: False}]]",
             "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0.prototypes0.weight_v', 2], "
             "['module.heads.0.prototypes0.weight_g', 2]]"};
}

// trainer_self_supervised_test.cpp's MoCo recipe, smaller: two 24 x 24 views, two mlp heads
// (the first with BatchNorm, so the keys' batch shuffle across the ranks matters), a queue of
// 2 global batches, momentum 0.5.
Overrides moco_job() {
  return common_job() +
         Overrides{
             "DATA.TRAIN.TRANSFORMS=[{name: ImgReplicatePil, num_times: 2}, {name: "
             "RandomResizedCrop, size: 24}, {name: RandomHorizontalFlip}, {name: ToTensor}, " +
                 kNormalize + "]",
             "DATA.TRAIN.COLLATE_FUNCTION=moco_collator",
             "LOSS.name=moco_loss",
             "LOSS.moco_loss.embedding_dim=16",
             "LOSS.moco_loss.queue_size=16",
             "LOSS.moco_loss.momentum=0.5",
             "MODEL.HEAD.PARAMS=[[mlp, {dims: [64, 32], use_relu: True, use_bn: True, "
             "skip_last_layer_relu_bn: False}], [mlp, {dims: [32, 16]}]]"};
}

// trainer_self_supervised_test.cpp's DeepCluster v2 recipe, smaller: four_crops(), two mlp
// heads without BatchNorm, crops 0 and 1 in the memory, two k-means heads of 4 and 3 clusters
// over each rank's 8 images.
Overrides deepclusterv2_job() {
  return common_job() + four_crops() +
         Overrides{
             "DATA.TRAIN.LABEL_TYPE=sample_index",
             "LOSS.name=deepclusterv2_loss",
             "MODEL.HEAD.PARAMS=[[mlp, {dims: [64, 32], use_relu: True, "
             "skip_last_layer_relu_bn: False}], [mlp, {dims: [32, 16]}]]",
             "LOSS.deepclusterv2_loss.num_clusters=[4, 3]",
             "LOSS.deepclusterv2_loss.kmeans_iters=3",
             "LOSS.deepclusterv2_loss.memory_params.crops_for_mb=[0, 1]",
             "LOSS.deepclusterv2_loss.memory_params.embedding_dim=16"};
}

fs::path fresh(const fs::path& dir, comm::ProcessGroup& group) {
  if (group.rank() == 0) {
    fs::remove_all(dir);
  }
  group.barrier();
  return dir;
}

struct SslRun {
  RunResult run;
  std::map<std::string, at::Tensor> loss_states; // the last checkpoint's, [world, ...] each
};

// Trains `job` into a fresh `dir` on `group` (collective), interrupted after `stop_after`
// iterations when >= 0, with the loss states of the last checkpoint it wrote.
SslRun ssl_run(
    const fs::path& dir, const Overrides& job, comm::ProcessGroup& group, int64_t stop_after = -1) {
  auto options = trainer_options_from_config(
      Config::load({}, job + Overrides{"CHECKPOINT.DIR=" + dir.string()}));
  options.stop_after_iterations = stop_after;
  SslRun result;
  {
    Trainer trainer(options, "", borrow(group));
    TrainSummary summary = trainer.run();
    result.run = RunResult{std::move(summary), trainer.full_parameters()};
  }
  group.barrier();
  const auto saved = checkpoint::load_checkpoint(dir / "checkpoint.torch");
  for (const auto& item : saved.at("loss_states").toGenericDict()) {
    result.loss_states.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  return result;
}

// The teacher / momentum encoder (the entries named `prefix`) and the floating loss state
// (center, queue) within `tolerance`; counters equal.
void expect_same_loss_states(
    const SslRun& actual,
    const SslRun& expected,
    const std::string& prefix,
    double tolerance,
    const std::string& what) {
  ASSERT_EQ(actual.loss_states.size(), expected.loss_states.size()) << what;
  int copy_entries = 0;
  for (const auto& [name, value] : expected.loss_states) {
    const at::Tensor& other = actual.loss_states.at(name);
    copy_entries += name.rfind(prefix, 0) == 0 ? 1 : 0;
    if (value.is_floating_point()) {
      EXPECT_TRUE(torch::allclose(other, value, tolerance, tolerance))
          << what << ": " << name << " differs by " << (other - value).abs().max().item<double>();
    } else {
      EXPECT_TRUE(torch::equal(other, value)) << what << ": " << name;
    }
  }
  EXPECT_GT(copy_entries, 0) << what << ": no " << prefix << " entries";
}

void expect_modes_train_as_ddp(
    const Overrides& job, const std::string& prefix, const std::string& what) {
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl_sharded"), group);
    const SslRun ddp = ssl_run(dir / "ddp", job, group);
    ASSERT_EQ(ddp.run.summary.iteration_losses.size(), 4u);
    for (const auto& [mode, overrides] : kShardedModes) {
      const SslRun sharded = ssl_run(dir / mode, job + overrides, group);
      const std::string label = what + " under " + mode;
      expect_same_training(sharded.run, ddp.run, kTolerance, label);
      expect_same_loss_states(sharded, ddp, prefix, kTolerance, label);
    }
  });
}

// A checkpoint every iteration, stopped after 3 of 4: the resumed run ends where the
// uninterrupted one does, bit for bit, with its teacher / momentum encoder.
void expect_fsdp_resumes_bit_exactly(const Overrides& job, const std::string& prefix) {
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl_sharded"), group);
    const Overrides checkpointed =
        job + kFsdp + Overrides{"CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"};
    const SslRun reference = ssl_run(dir / "full", checkpointed, group);
    ASSERT_EQ(reference.run.summary.iteration_losses.size(), 4u);
    EXPECT_TRUE(ssl_run(dir / "resumed", checkpointed, group, 3).run.summary.interrupted);
    const SslRun resumed = ssl_run(dir / "resumed", checkpointed, group);
    const std::string what = "rank " + std::to_string(group.rank());
    expect_resumed_bit_exactly(resumed.run, reference.run, 3, what);
    expect_same_loss_states(resumed, reference, prefix, /*bit for bit*/ 0.0, what);
  });
}

TEST(TrainerSelfSupervisedShardedTest, DinoUnderZeroAndFsdpTrainsAsUnderDdp) {
  expect_modes_train_as_ddp(dino_job(), "teacher.", "DINO");
}

TEST(TrainerSelfSupervisedShardedTest, MocoUnderZeroAndFsdpTrainsAsUnderDdp) {
  expect_modes_train_as_ddp(moco_job(), "moco_encoder.", "MoCo");
}

// The memory (each rank's rows of its own images), the centroids (k-means over every rank's
// memory, at the start of epoch 2 from the memory epoch 1 wrote) and the assignments: the
// sharded modes hand the loss the same embeddings as DDP up to float32 rounding.
TEST(TrainerSelfSupervisedShardedTest, DeepClusterV2UnderZeroAndFsdpTrainsAsUnderDdp) {
  expect_modes_train_as_ddp(deepclusterv2_job(), "centroids", "DeepCluster v2");
}

// bfloat16 autocast (MODEL.AMP_PARAMS with PyTorch's AMP: O1): the head's bfloat16 output
// enters the loss and the memory, which keeps float32 rows. One step (8 images): the initial
// pass, the k-means and the first step's forward see the same weights in every mode, so they
// are bit for bit DDP's; only the gradients' float32 sums differ (kTolerance). A second step
// would turn last-bit weight differences into bfloat16 roundings
// (TrainerFsdpTest.AutocastWithTheShardedLossScalerTrainsLikeDdp compares at 2^-8 for that).
TEST(TrainerSelfSupervisedShardedTest, DeepClusterV2UnderAutocastKeepsAFloat32MemoryAndShards) {
  const Overrides job = deepclusterv2_job() + Overrides{
                                                  "DATA.TRAIN.DATA_LIMIT=8",
                                                  "OPTIMIZER.num_epochs=1",
                                                  "MODEL.AMP_PARAMS.USE_AMP=True",
                                                  "MODEL.AMP_PARAMS.AMP_TYPE=pytorch",
                                                  "MODEL.AMP_PARAMS.DTYPE=bfloat16"};
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl_sharded"), group);
    const SslRun ddp = ssl_run(dir / "ddp", job, group);
    ASSERT_EQ(ddp.run.summary.iteration_losses.size(), 1u);
    EXPECT_TRUE(std::isfinite(ddp.run.summary.iteration_losses[0]));
    // Autocast is on: the float32 run's loss differs (bfloat16 rounds to 2^-8 relative).
    const Overrides float32 = {"MODEL.AMP_PARAMS.USE_AMP=False"};
    const SslRun reference = ssl_run(dir / "float32", job + float32, group);
    EXPECT_NE(ddp.run.summary.iteration_losses[0], reference.run.summary.iteration_losses[0]);
    const at::Tensor memory = ddp.loss_states.at("local_memory_embeddings");
    EXPECT_EQ(memory.scalar_type(), at::kFloat);
    // Rows 0-3 of each bank: this step's 4 images, unit rows normalised in float32.
    const at::Tensor written = memory.narrow(2, 0, 4);
    EXPECT_TRUE(at::allclose(written.norm(2, -1), at::ones({2, 2, 4}), 1e-6, 1e-6));
    for (const auto& [mode, overrides] : kShardedModes) {
      const SslRun sharded = ssl_run(dir / mode, job + overrides, group);
      const std::string label = "DeepCluster v2 under autocast and " + mode;
      expect_same_training(sharded.run, ddp.run, kTolerance, label);
      expect_same_loss_states(sharded, ddp, "centroids", kTolerance, label);
    }
  });
}

TEST(TrainerSelfSupervisedShardedTest, DinoUnderFsdpResumesMidEpochBitExactly) {
  expect_fsdp_resumes_bit_exactly(dino_job(), "teacher.");
}

TEST(TrainerSelfSupervisedShardedTest, MocoUnderFsdpResumesMidEpochBitExactly) {
  expect_fsdp_resumes_bit_exactly(moco_job(), "moco_encoder.");
}

} // namespace
} // namespace largo::train::trainer_self_supervised_sharded_test
