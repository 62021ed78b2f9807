// Self-supervised pretraining through the Trainer, as VISSL's SwAV, SimCLR, Barlow Twins and
// MoCo configs set it up (multi-view TRANSFORMS, collator, swav_head or chained mlp heads,
// LOSS.swav_loss / simclr_info_nce_loss / barlow_twins_loss / moco_loss) on a small folder of
// PNG images:
//   - 2 ranks train as one process on the same global batch: the losses are collective
//     (gathered negatives, Sinkhorn's all-reduced sums) and DDP averages the gradients, so
//     losses and parameters agree within float32 rounding of reordered sums: measured 3e-8
//     over 4 steps of an MLP trunk, 2e-7 over one step of ResNet-18 with SyncBatchNorm; the
//     bound is 1e-5 (a wrong crop, view order or grouping moves the first loss by 0.1 and
//     more). Over more ResNet steps the rounding grows (SimCLR 7e-5 after 4 steps, SwAV 6e-4
//     after 2, Sinkhorn's exp(score / 0.05) amplifying it), so those are not compared;
//   - Barlow Twins at 2 ranks steps with half of one process's gradient, as VISSL's does;
//   - SwAV with its queue resumes mid-epoch bit for bit at 2 ranks (each rank's queue in the
//     checkpoint), the prototypes stay normalised and the frozen prototypes do not move;
//   - MoCo at 2 ranks (keys gathered into one queue, their batch shuffled across the ranks)
//     trains as one process on the global batch, and resumes mid-epoch bit for bit with its
//     momentum encoder and queue from the checkpoint;
//   - DINO at 2 ranks (the center all-reduced, the teacher updated after each step) trains as
//     one process, and resumes mid-epoch bit for bit with its teacher and center; on a ViT
//     with global and local crops of two sizes (VISSL's DINO recipe) it trains and resumes
//     bit for bit too;
//   - DINO and MoCo resume a 2-rank checkpoint at one process with rank 0's teacher and
//     center, momentum encoder and queue (the same on every rank), training on as the
//     2-rank run does;
//   - VISSL's checkpoints of the recipes initialize every head through MODEL.WEIGHTS_INIT;
//   - what does not compose is refused naming the key.
// A queue cannot make 2 ranks equal one process: each rank keeps its own newest images (the
// oldest fall off per rank), as VISSL's do.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "comm/distributed_test_util.h"
#include "data/image_test_util.h"
#include "test_paths.h"
#include "train/trainer_run_util.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstdlib>

namespace largo::train::trainer_self_supervised_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

constexpr double kTolerance = 1e-5;

fs::path image_folder() {
  return pattern_image_folder("largo_trainer_ssl_images");
}

// 16 images, batch 8 over the world (4 per rank at 2 ranks): 2 iterations per epoch, 2
// epochs; ResNet-18 with SyncBatchNorm.
Overrides common_job(int world_size) {
  return {
      "DATA.TRAIN.DATA_SOURCES=[disk_folder]",
      "DATA.TRAIN.DATA_PATHS=[" + image_folder().string() + "]",
      "DATA.TRAIN.BATCHSIZE_PER_REPLICA=" + std::to_string(8 / world_size),
      "DATA.NUM_DATALOADER_WORKERS=1",
      "TEST_MODEL=False",
      "MODEL.TRUNK.NAME=resnet",
      "MODEL.TRUNK.RESNETS.DEPTH=18",
      "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=True",
      "MODEL.SYNC_BN_CONFIG.GROUP_SIZE=0",
      "OPTIMIZER.num_epochs=2",
      "OPTIMIZER.momentum=0.9",
      "OPTIMIZER.param_schedulers.lr={name: constant, value: 0.01}",
      "MACHINE.DEVICE=cpu",
      "MACHINE.NUM_THREADS=1"};
}

Config ssl_config(const fs::path& dir, const Overrides& job) {
  return Config::load({}, job + Overrides{"CHECKPOINT.DIR=" + dir.string()});
}

// Trains `job` into `dir` on `group` (collective), interrupted after `stop_after` iterations
// when >= 0.
RunResult ssl_run(
    const fs::path& dir, const Overrides& job, comm::ProcessGroup& group, int64_t stop_after = -1) {
  auto options = trainer_options_from_config(ssl_config(dir, job));
  options.stop_after_iterations = stop_after;
  Trainer trainer(options, "", borrow(group));
  TrainSummary summary = trainer.run();
  return RunResult{std::move(summary), trainer.full_parameters()};
}

const std::string kNormalize = "{name: Normalize, mean: [0.5, 0.5, 0.5], std: [0.25, 0.25, 0.25]}";

// VISSL's SimCLR recipe, small: two 24x24 views through a projection of two mlp heads.
Overrides simclr_job(int world_size) {
  return common_job(world_size) +
         Overrides{
             "DATA.TRAIN.TRANSFORMS=[{name: ImgReplicatePil, num_times: 2}, {name: "
             "RandomResizedCrop, size: 24}, {name: RandomHorizontalFlip}, {name: "
             "ImgPilColorDistortion, strength: 1.0}, {name: ToTensor}, " +
                 kNormalize + "]",
             "DATA.TRAIN.COLLATE_FUNCTION=simclr_collator",
             "LOSS.name=simclr_info_nce_loss",
             "LOSS.simclr_info_nce_loss.buffer_params.embedding_dim=16",
             "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 64], use_relu: True, "
             "skip_last_layer_relu_bn: False}], [mlp, {dims: [64, 16]}]]"};
}

// VISSL's Barlow Twins recipe, small: SimCLR's views and projection (VISSL's has BatchNorm in
// its mlp heads; here the trunk's is synchronised) with barlow_twins_loss, plain SGD at a
// learning rate that grows with the world size (see the test below) and no weight decay.
Overrides barlow_twins_job(int world_size, double lr_per_rank = 0.05) {
  return simclr_job(world_size) + Overrides{
                                      "LOSS.name=barlow_twins_loss",
                                      "LOSS.barlow_twins_loss.embedding_dim=16",
                                      "OPTIMIZER.weight_decay=0",
                                      "OPTIMIZER.param_schedulers.lr={name: constant, value: " +
                                          std::to_string(lr_per_rank * world_size) + "}"};
}

// VISSL's MoCo v2 recipe, small: SimCLR's views and two mlp heads, moco_loss with a queue of
// 2 global batches and a fast momentum (0.5) so that 4 steps move the momentum encoder.
Overrides moco_job(int world_size) {
  return simclr_job(world_size) + Overrides{
                                      "DATA.TRAIN.COLLATE_FUNCTION=moco_collator",
                                      "LOSS.name=moco_loss",
                                      "LOSS.moco_loss.embedding_dim=16",
                                      "LOSS.moco_loss.queue_size=16",
                                      "LOSS.moco_loss.momentum=0.5",
                                      "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False"};
}

// VISSL's SwAV recipe, small: 2 x 32 + 2 x 16 crops (by default), a swav_head with
// BatchNorm1d (converted to SyncBatchNorm with the trunk's BatchNorm2d, so 2 ranks normalise
// like 1 process) and 2 prototype sets.
Overrides swav_job(int world_size, int small_crop = 16, int large_crop = 32) {
  return common_job(world_size) +
         Overrides{
             "DATA.TRAIN.TRANSFORMS=[{name: ImgPilToMultiCrop, total_num_crops: 4, size_crops: "
             "[" +
                 std::to_string(large_crop) + ", " + std::to_string(small_crop) +
                 "], num_crops: [2, 2], crop_scales: [[0.3, 1], [0.1, 0.3]]}, {name: "
                 "RandomHorizontalFlip}, {name: ImgPilColorDistortion, strength: 1.0}, {name: "
                 "ImgPilGaussianBlur, p: 0.5, radius_min: 0.1, radius_max: 2.0}, {name: "
                 "ToTensor}, " +
                 kNormalize + "]",
             "DATA.TRAIN.COLLATE_FUNCTION=multicrop_collator",
             "LOSS.name=swav_loss",
             "MODEL.HEAD.PARAMS=[[swav_head, {dims: [512, 64, 16], use_bn: True, "
             "num_clusters: [10, 6]}]]"};
}

fs::path fresh(const fs::path& dir, comm::ProcessGroup& group) {
  if (group.rank() == 0) {
    fs::remove_all(dir);
  }
  group.barrier();
  return dir;
}

// The mean of every rank's loss at each iteration: one process's loss on the whole batch.
RunResult with_global_losses(RunResult run, comm::ProcessGroup& group) {
  for (float& loss : run.summary.iteration_losses) {
    at::Tensor value = at::tensor({loss}, at::kFloat);
    group.all_reduce(value);
    loss = value.item<float>() / static_cast<float>(group.world_size());
  }
  return run;
}

// Writes `run`'s losses and parameters to `path`, for the test's own process to read back.
void save_result(const fs::path& path, const RunResult& run) {
  checkpoint::StateDict result = checkpoint::make_state_dict();
  checkpoint::StateDict parameters(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, value] : run.parameters) {
    parameters.insert(name, value);
  }
  result.insert("parameters", parameters);
  result.insert("losses", at::tensor(run.summary.iteration_losses, at::kFloat));
  checkpoint::save_checkpoint(path, result);
}

RunResult load_result(const fs::path& path) {
  const checkpoint::StateDict saved = checkpoint::load_checkpoint(path);
  RunResult result;
  const at::Tensor losses = saved.at("losses").toTensor();
  for (int64_t i = 0; i < losses.numel(); ++i) {
    result.summary.iteration_losses.push_back(losses[i].item<float>());
  }
  for (const auto& item : saved.at("parameters").toGenericDict()) {
    result.parameters.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  return result;
}

// Runs `job` at `world_size` ranks (child processes); rank 0 writes its global losses and
// the final parameters to dir/result.torch, which this process reads back.
RunResult run_at(int world_size, const std::function<Overrides(int)>& job, const fs::path& dir) {
  run_on_ranks(world_size, [&](comm::ProcessGroup& group) {
    RunResult run = with_global_losses(ssl_run(fresh(dir, group), job(world_size), group), group);
    if (group.rank() == 0) {
      save_result(dir / "result.torch", run);
    }
  });
  return load_result(dir / "result.torch");
}

// One step of ResNet-18 with SyncBatchNorm (8 images), and 4 steps of an MLP trunk.
const Overrides kOneStep = {"DATA.TRAIN.DATA_LIMIT=8", "OPTIMIZER.num_epochs=1"};
const Overrides kMlpTrunk = {"MODEL.TRUNK.NAME=mlp", "MODEL.TRUNK.MLP.HIDDEN_DIMS=[512]"};

// VISSL's DINO recipe, small: SwAV's 2 + 2 crops (all 32 x 32 for the MLP trunk), a dino_head
// without BatchNorm, a teacher temperature warm-up of 2 iterations, a fast teacher momentum
// (0.5) so that 4 steps move it, and the last layer frozen for the first 2 iterations through
// MODEL.TEMP_FROZEN_PARAMS_ITER_MAP as VISSL's recipe does.
Overrides dino_job(int world_size) {
  return swav_job(world_size, 32) + kMlpTrunk +
         Overrides{
             "LOSS.name=dino_loss",
             "LOSS.dino_loss.momentum=0.5",
             "LOSS.dino_loss.teacher_temp_warmup_iters=2",
             "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False",
             "MODEL.HEAD.PARAMS=[[dino_head, {in_dim: 512, num_clusters: [16], hidden_dim: 32, "
             "bottleneck_dim: 8, normalize_last_layer: False}]]",
             "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0.prototypes0.weight_v', 2], "
             "['module.heads.0.prototypes0.weight_g', 2]]"};
}

// Each test runs one pair: run_on_ranks re-runs the test's body in its rank processes, which
// take the first run of their world size.
RunResult expect_two_ranks_equal_one_process(
    const std::function<Overrides(int)>& job, size_t iterations, const std::string& what) {
  const fs::path dir = test_dir_for("ssl");
  const RunResult one = run_at(1, job, dir / "one");
  const RunResult two = run_at(2, job, dir / "two");
  EXPECT_EQ(one.summary.iteration_losses.size(), iterations) << what;
  expect_same_training(two, one, kTolerance, what + ", 2 ranks against 1 process");
  return one;
}

TEST(TrainerSelfSupervisedTest, SimclrOnResNetAtTwoRanksEqualsOneProcess) {
  expect_two_ranks_equal_one_process(
      [](int world_size) { return simclr_job(world_size) + kOneStep; }, 1, "SimCLR, ResNet");
}

TEST(TrainerSelfSupervisedTest, SimclrOnMlpAtTwoRanksEqualsOneProcessOverFourSteps) {
  expect_two_ranks_equal_one_process(
      [](int world_size) { return simclr_job(world_size) + kMlpTrunk; }, 4, "SimCLR, MLP");
}

// VISSL's Barlow Twins loss is the same value on every rank, but each rank's backward reaches
// only its own embeddings (models/barlow_twins_loss.h), so DDP's average steps with half of
// one process's gradient: 2 ranks at twice the learning rate train as one process (without
// weight decay, which the learning rate would scale too). A gradient summed over the ranks
// (SimCLR's) would instead make them diverge by a factor 2 in every update.
TEST(TrainerSelfSupervisedTest, BarlowTwinsAtTwoRanksStepsWithHalfTheGradientOfOneProcess) {
  expect_two_ranks_equal_one_process(
      [](int world_size) { return barlow_twins_job(world_size) + kMlpTrunk; },
      4,
      "Barlow Twins, MLP");
}

// The converse: at one process's learning rate, 2 ranks end elsewhere (the factor is real).
TEST(TrainerSelfSupervisedTest, BarlowTwinsAtTwoRanksAndTheSameLearningRateDoesNotTrainAsOne) {
  const fs::path dir = test_dir_for("ssl");
  auto same_lr = [](int world_size) {
    return barlow_twins_job(world_size, 0.05 / world_size) + kMlpTrunk;
  };
  const RunResult one = run_at(1, same_lr, dir / "one");
  const RunResult two = run_at(2, same_lr, dir / "two");
  double largest = 0.0;
  for (const auto& [name, value] : one.parameters) {
    largest = std::max(largest, (two.parameters.at(name) - value).abs().max().item<double>());
  }
  EXPECT_GT(largest, 100 * kTolerance);
}

TEST(TrainerSelfSupervisedTest, SwavOnResNetAtTwoRanksEqualsOneProcess) {
  const RunResult one = expect_two_ranks_equal_one_process(
      [](int world_size) { return swav_job(world_size) + kOneStep; }, 1, "SwAV, ResNet");
  // normalize_last_layer: every prototype has unit norm after the step.
  const at::Tensor prototypes = one.parameters.at("head.0.prototypes0.weight");
  EXPECT_TRUE(at::allclose(prototypes.norm(2, 1), at::ones({prototypes.size(0)}), 1e-6, 1e-6));
}

// VISSL's padded crops (DATA.TRAIN.COLLATE_FUNCTION_PARAMS {create_multidimensional_tensor:
// True}, as SEER's regnet10B.yaml sets it): the 2 x 32 + 2 x 16 crops padded to 32 and run
// through ResNet-18 in one pass, SyncBatchNorm over the padded batch of every rank: 2 ranks
// train as one process (tests/models/padded_crops_test.cpp checks the forward itself).
TEST(TrainerSelfSupervisedTest, PaddedCropsOnResNetAtTwoRanksEqualOneProcess) {
  expect_two_ranks_equal_one_process(
      [](int world_size) {
        return swav_job(world_size) + kOneStep +
               Overrides{
                   "DATA.TRAIN.COLLATE_FUNCTION_PARAMS={create_multidimensional_tensor: True}"};
      },
      1,
      "SwAV, ResNet, padded crops");
}

TEST(TrainerSelfSupervisedTest, SwavOnMlpAtTwoRanksEqualsOneProcessOverFourSteps) {
  // The MLP takes one image size: all four crops 32 x 32.
  expect_two_ranks_equal_one_process(
      [](int world_size) { return swav_job(world_size, 32) + kMlpTrunk; }, 4, "SwAV, MLP");
}

// MoCo's queue is the same on every rank (drawn from SEED_VALUE, then written with the keys of
// every rank in rank order) and its loss is each rank's mean over its queries, so DDP's
// average is one process's loss on the global batch; the MLP trunk has no BatchNorm, so the
// keys' batch shuffle changes no value but its gather, permutation and unshuffle all run (a
// key put back at the wrong image changes the loss by 0.1 and more). 4 steps: the queue wraps
// around and the momentum encoder follows the trained one.
TEST(TrainerSelfSupervisedTest, MocoOnMlpAtTwoRanksEqualsOneProcessOverFourSteps) {
  expect_two_ranks_equal_one_process(
      [](int world_size) { return moco_job(world_size) + kMlpTrunk; }, 4, "MoCo, MLP");
}

// A checkpoint every iteration, stopped after 3 of 4: the resumed run ends bit for bit where
// the uninterrupted one does, which needs the momentum encoder (its parameters, its BatchNorm
// statistics, its forward count) and the queue with its pointer; the first mlp head has
// BatchNorm, so the keys' batch shuffle changes the keys.
TEST(TrainerSelfSupervisedTest, MocoResumesMidEpochBitExactly) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const Overrides job =
        moco_job(2) + kMlpTrunk +
        Overrides{
            "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 64], use_relu: True, use_bn: True, "
            "skip_last_layer_relu_bn: False}], [mlp, {dims: [64, 16]}]]",
            "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"};
    const RunResult reference = ssl_run(dir / "full", job, group);
    ASSERT_EQ(reference.summary.iteration_losses.size(), 4u);
    EXPECT_TRUE(ssl_run(dir / "resumed", job, group, 3).summary.interrupted);
    group.barrier();
    const auto saved = checkpoint::load_checkpoint(dir / "resumed" / "checkpoint.torch");
    const auto states = saved.at("loss_states").toGenericDict();
    EXPECT_EQ(states.at("queue").toTensor().sizes(), at::IntArrayRef({2, 16, 16}));
    EXPECT_TRUE(torch::equal(states.at("queue").toTensor()[0], states.at("queue").toTensor()[1]))
        << "every rank holds the same queue";
    EXPECT_EQ(states.at("queue_ptr").toTensor()[0].item<int64_t>(), 8); // 3 steps of 8 keys
    EXPECT_EQ(states.at("moco_num_forwards").toTensor()[0].item<int64_t>(), 3);
    EXPECT_TRUE(
        states.contains("moco_encoder.head.0.weight") ||
        states.contains("moco_encoder.head.0.0.weight"));
    const RunResult resumed = ssl_run(dir / "resumed", job, group);
    expect_resumed_bit_exactly(resumed, reference, 3, "rank " + std::to_string(group.rank()));
  });
}

// DINO's loss is each rank's mean over its images and its center is all-reduced (the mean of
// the teacher's scores over the global batch), the teacher is the same EMA on every rank, and
// the MLP trunk and the dino_head have no BatchNorm: 2 ranks train as one process within the
// float32 rounding of the reordered sums (kTolerance, as above). 4 steps: the temperature
// warm-up ends, the teacher follows the student and the last layer starts training.
TEST(TrainerSelfSupervisedTest, DinoOnMlpAtTwoRanksEqualsOneProcessOverFourSteps) {
  const RunResult one = expect_two_ranks_equal_one_process(dino_job, 4, "DINO, MLP");
  for (const float loss : one.summary.iteration_losses) {
    EXPECT_GT(loss, 0.0f);
  }
}

// A checkpoint every iteration, stopped after 3 of 4: the resumed run ends bit for bit where
// the uninterrupted one does, which needs the teacher (built on the first forward, moved after
// every step) and the center from the checkpoint's loss state.
TEST(TrainerSelfSupervisedTest, DinoResumesMidEpochBitExactly) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const Overrides job = dino_job(2) + Overrides{"CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"};
    const RunResult reference = ssl_run(dir / "full", job, group);
    ASSERT_EQ(reference.summary.iteration_losses.size(), 4u);
    EXPECT_TRUE(ssl_run(dir / "resumed", job, group, 3).summary.interrupted);
    group.barrier();
    const auto saved = checkpoint::load_checkpoint(dir / "resumed" / "checkpoint.torch");
    const auto states = saved.at("loss_states").toGenericDict();
    EXPECT_EQ(states.at("center").toTensor().sizes(), at::IntArrayRef({2, 1, 16}));
    EXPECT_TRUE(torch::equal(states.at("center").toTensor()[0], states.at("center").toTensor()[1]))
        << "every rank holds the same center";
    EXPECT_EQ(states.at("teacher_built").toTensor()[0].item<int64_t>(), 1);
    EXPECT_TRUE(states.contains("teacher.head.0.prototypes0.weight_v"));
    const RunResult resumed = ssl_run(dir / "resumed", job, group);
    expect_resumed_bit_exactly(resumed, reference, 3, "rank " + std::to_string(group.rank()));
  });
}

// DINO's teacher and center and MoCo's momentum encoder and queue are the same on every rank,
// so an end-of-epoch checkpoint of a 2-rank run (killed in epoch 2) resumes at one process
// with rank 0's: the resumed iterations train as the uninterrupted 2-rank run's, within the
// rounding of 2 ranks against 1 process (kTolerance, as above). Afresh (the teacher copied
// from the student, the center zero; an empty queue) the next loss moves by far more.
void expect_resumes_at_one_process_as_two_ranks(
    const std::function<Overrides(int)>& job, const std::string& what) {
  const fs::path dir = test_dir_for("ssl");
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    fresh(dir, group);
    const RunResult full = with_global_losses(ssl_run(dir / "full", job(2), group), group);
    if (group.rank() == 0) {
      save_result(dir / "full.torch", full);
    }
    EXPECT_TRUE(ssl_run(dir / "resumed", job(2), group, 3).summary.interrupted);
  });
  run_on_ranks(1, [&](comm::ProcessGroup& group) {
    const RunResult full = load_result(dir / "full.torch");
    ASSERT_EQ(full.summary.iteration_losses.size(), 4u) << what;
    RunResult resumed = ssl_run(dir / "resumed", job(1), group);
    EXPECT_TRUE(resumed.summary.resumed) << what;
    // The iterations of epoch 2 only: the reference's from its third on.
    RunResult reference = full;
    reference.summary.iteration_losses.erase(
        reference.summary.iteration_losses.begin(), reference.summary.iteration_losses.begin() + 2);
    expect_same_training(resumed, reference, kTolerance, what + ", resumed at 1 process");
  });
}

TEST(TrainerSelfSupervisedTest, DinoResumesAtAnotherWorldSizeWithItsTeacherAndCenter) {
  expect_resumes_at_one_process_as_two_ranks(dino_job, "DINO, MLP");
}

TEST(TrainerSelfSupervisedTest, MocoResumesAtAnotherWorldSizeWithItsEncoderAndQueue) {
  expect_resumes_at_one_process_as_two_ranks(
      [](int world_size) { return moco_job(world_size) + kMlpTrunk; }, "MoCo, MLP");
}

// VISSL's DeepCluster v2 recipe, small: DINO's 4 crops of 32 x 32 through the MLP trunk and
// two mlp heads (VISSL's), the memory of crops 0 and 1, two k-means heads of 4 and 3 clusters
// (the rank's 8 images per epoch at 2 ranks), images named by their index.
Overrides deepclusterv2_job(int world_size) {
  return swav_job(world_size, 32) + kMlpTrunk +
         Overrides{
             "LOSS.name=deepclusterv2_loss",
             "DATA.TRAIN.LABEL_TYPE=sample_index",
             "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False",
             "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 64], use_relu: True, "
             "skip_last_layer_relu_bn: False}], [mlp, {dims: [64, 16]}]]",
             "LOSS.deepclusterv2_loss.num_clusters=[4, 3]",
             "LOSS.deepclusterv2_loss.kmeans_iters=3",
             "LOSS.deepclusterv2_loss.memory_params.crops_for_mb=[0, 1]",
             "LOSS.deepclusterv2_loss.memory_params.embedding_dim=16"};
}

// The loss state after `iterations` of the 2-rank run in `dir` (its checkpoint).
c10::Dict<c10::IValue, c10::IValue> deepclusterv2_state(const fs::path& dir) {
  return checkpoint::load_checkpoint(dir / "checkpoint.torch").at("loss_states").toGenericDict();
}

// Stopped mid-epoch (a checkpoint every iteration, killed after 3 of 4: 2 per epoch, 2 epochs)
// and at an epoch's end (the epoch's checkpoint alone, killed in epoch 2): the resumed runs end
// bit for bit where the uninterrupted one does, which needs each rank's memory, its write
// position, the assignments and centroids (mid-epoch: no second k-means) or the memory the
// next epoch's k-means clusters (at the epoch's end). The checkpoint holds what VISSL's
// buffers hold: each rank's 8 images in its memory (at the epoch's end each of the 16 images
// once), every image assigned in both heads, the same assignments and centroids on both ranks.
TEST(TrainerSelfSupervisedTest, DeepClusterV2ResumesMidEpochAndAtAnEpochsEndBitExactly) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const Overrides every_iteration = {"CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"};
    const RunResult reference =
        ssl_run(dir / "full", deepclusterv2_job(2) + every_iteration, group);
    ASSERT_EQ(reference.summary.iteration_losses.size(), 4u);
    for (const float loss : reference.summary.iteration_losses) {
      EXPECT_GT(loss, 0.0f);
      EXPECT_TRUE(std::isfinite(loss));
    }
    for (const bool mid_epoch : {true, false}) {
      const std::string what = mid_epoch ? "mid-epoch" : "at the epoch's end";
      const fs::path resumed_dir = dir / (mid_epoch ? "mid_epoch" : "epoch_end");
      const Overrides job = deepclusterv2_job(2) + (mid_epoch ? every_iteration : Overrides{});
      EXPECT_TRUE(ssl_run(resumed_dir, job, group, 3).summary.interrupted);
      group.barrier();
      const auto states = deepclusterv2_state(resumed_dir);
      const at::Tensor memory = states.at("local_memory_embeddings").toTensor();
      EXPECT_EQ(memory.sizes(), at::IntArrayRef({2, 2, 8, 16})); // ranks, banks, rows, width
      const at::Tensor assignments = states.at("assignments").toTensor();
      EXPECT_EQ(assignments.sizes(), at::IntArrayRef({2, 2, 16}));
      EXPECT_TRUE(torch::equal(assignments[0], assignments[1])) << what;
      EXPECT_TRUE(assignments.ge(0).all().item<bool>()) << "every image in a memory, " << what;
      EXPECT_TRUE(assignments[0][0].lt(4).all().item<bool>());
      EXPECT_TRUE(assignments[0][1].lt(3).all().item<bool>());
      EXPECT_TRUE(torch::equal(
          states.at("centroids0").toTensor()[0], states.at("centroids0").toTensor()[1]));
      EXPECT_EQ(states.at("start_idx").toTensor()[0].item<int64_t>(), mid_epoch ? 4 : 8) << what;
      EXPECT_EQ(states.at("clustered_epoch").toTensor()[0].item<int64_t>(), mid_epoch ? 1 : 0)
          << what;
      if (!mid_epoch) { // mid-epoch, half of the rows are the next epoch's images
        const at::Tensor index = states.at("local_memory_index").toTensor();
        EXPECT_TRUE(torch::equal(std::get<0>(at::sort(index.flatten())), at::arange(16)))
            << "the ranks' memories hold each image once";
      }
      const RunResult resumed = ssl_run(resumed_dir, job, group);
      expect_resumed_bit_exactly(
          resumed, reference, mid_epoch ? 3 : 2, fmt::format("rank {}, {}", group.rank(), what));
    }
  });
}

// Gradient accumulation (TRAINER.GRADIENT_ACCUMULATION_STEPS 2, 2 images per micro-batch):
// each micro-batch is one loss call and one memory write at the next rows, so the two write
// the memory rows a batch of 4 writes, and the average of their gradients is the batch's
// gradient (the head has no BatchNorm). The run trains as the batch of 4 within float32
// rounding (the embeddings come from products over 2 rows instead of 4), and its memory and
// assignments are the batch's.
TEST(TrainerSelfSupervisedTest, DeepClusterV2WithGradientAccumulationTrainsAsTheLargerBatch) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const RunResult batch = ssl_run(dir / "batch", deepclusterv2_job(2), group);
    ASSERT_EQ(batch.summary.iteration_losses.size(), 4u);
    const Overrides micro_batches = {
        "DATA.TRAIN.BATCHSIZE_PER_REPLICA=2", "TRAINER.GRADIENT_ACCUMULATION_STEPS=2"};
    const RunResult accumulated =
        ssl_run(dir / "accumulated", deepclusterv2_job(2) + micro_batches, group);
    expect_same_training(
        accumulated, batch, kTolerance, "DeepCluster v2, 2 micro-batches against one batch");
    group.barrier();
    const auto expected = deepclusterv2_state(dir / "batch");
    const auto actual = deepclusterv2_state(dir / "accumulated");
    const at::Tensor memory = actual.at("local_memory_embeddings").toTensor();
    const at::Tensor expected_memory = expected.at("local_memory_embeddings").toTensor();
    EXPECT_TRUE(at::allclose(memory, expected_memory, kTolerance, kTolerance))
        << "the memory differs by " << (memory - expected_memory).abs().max().item<double>();
    for (const char* name : {"local_memory_index", "assignments", "start_idx"}) {
      EXPECT_TRUE(torch::equal(actual.at(name).toTensor(), expected.at(name).toTensor())) << name;
    }
  });
}

// VISSL's DINO on a ViT, small: 2 global crops of 32 px and 2 local ones of 16 px (VISSL's
// 224 and 96), patch 8: the trunk is built for the global crops' 4x4 patches and takes the
// local crops' 2x2 through its interpolated positional embedding (class token on).
Overrides dino_vit_job() {
  return swav_job(1) +
         Overrides{
             "LOSS.name=dino_loss",
             "LOSS.dino_loss.momentum=0.5",
             "LOSS.dino_loss.teacher_temp_warmup_iters=2",
             "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False",
             "MODEL.TRUNK.NAME=vision_transformer",
             "MODEL.TRUNK.VISION_TRANSFORMERS.IMAGE_SIZE=32",
             "MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE=8",
             "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=2",
             "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=2",
             "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=16",
             "MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=32",
             "MODEL.HEAD.PARAMS=[[dino_head, {in_dim: 16, num_clusters: [16], hidden_dim: 32, "
             "bottleneck_dim: 8, normalize_last_layer: False}]]",
             "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"};
}

// 4 steps (16 images, batch 8, 2 epochs) with finite losses that move, then resumed after 3
// of them bit for bit (the positional embedding's gradient now also flows through the
// interpolation of the local crops).
TEST(TrainerSelfSupervisedTest, DinoOnVitWithCropsOfTwoSizesTrainsAndResumesBitExactly) {
  run_on_ranks(1, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl_vit"), group);
    const RunResult reference = ssl_run(dir / "full", dino_vit_job(), group);
    const std::vector<float>& losses = reference.summary.iteration_losses;
    ASSERT_EQ(losses.size(), 4u);
    for (const float loss : losses) {
      EXPECT_TRUE(std::isfinite(loss) && loss > 0.0f) << loss;
    }
    EXPECT_NE(losses.front(), losses.back());
    EXPECT_TRUE(ssl_run(dir / "resumed", dino_vit_job(), group, 3).summary.interrupted);
    const RunResult resumed = ssl_run(dir / "resumed", dino_vit_job(), group);
    expect_resumed_bit_exactly(resumed, reference, 3, "DINO, ViT, crops of 32 and 16 px");
  });
}

// On a GPU, SimCLR and SwAV with its queue (kept on the GPU, rescored and pushed there) train
// as on the CPU: one process, the MLP trunk (no cuDNN: its TF32 default would change the
// numbers), 4 steps. The difference is summation order (cuBLAS and MKL split the dot products
// differently), the same kind of float32 rounding as 2 ranks against 1 process, so the same
// bound.
TEST(TrainerSelfSupervisedTest, CudaSimclrAndSwavWithQueueTrainAsOnTheCpu) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto on_cpu = [](RunResult run) {
    for (auto& [name, value] : run.parameters) {
      value = value.cpu();
    }
    return run;
  };
  const Overrides swav_queue = {
      "LOSS.swav_loss.queue.queue_length=16", "LOSS.swav_loss.queue.start_iter=1"};
  const std::vector<std::pair<std::string, Overrides>> jobs = {
      {"SimCLR", simclr_job(1) + kMlpTrunk},
      {"SwAV with a queue", swav_job(1, 32) + kMlpTrunk + swav_queue}};
  auto group = comm::ProcessGroup::single_process();
  const fs::path root = test_dir_for("ssl_cuda");
  fs::remove_all(root); // no checkpoint of an earlier run to resume from
  for (const auto& [what, job] : jobs) {
    const fs::path dir = root / (what == "SimCLR" ? "simclr" : "swav");
    const RunResult cpu = ssl_run(dir / "cpu", job, *group);
    const RunResult gpu =
        on_cpu(ssl_run(dir / "gpu", job + Overrides{"MACHINE.DEVICE=gpu"}, *group));
    EXPECT_EQ(cpu.summary.iteration_losses.size(), 4u) << what;
    expect_same_training(gpu, cpu, kTolerance, what + " on the GPU against the CPU");
  }
}

// SwAV with LARC and SyncBatchNorm under ZeRO-2 (optimizer state and gradients sharded)
// trains as under DDP, one ResNet step at 2 ranks, the prototypes normalised in the sharded
// parameters alike. In float32: with bfloat16 autocast (O1) on the CPU, libtorch's backward
// of layer4's first convolution on the 16-pixel crops' 1x1 map often returns NaN slices, in
// any mode (PyTorch alone too; docs/self_supervised.md).
TEST(TrainerSelfSupervisedTest, SwavWithLarcUnderZeroTwoTrainsAsDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const Overrides job = swav_job(2) + kOneStep + Overrides{"OPTIMIZER.use_larc=True"};
    const RunResult ddp = ssl_run(dir / "ddp", job, group);
    const RunResult zero2 = ssl_run(
        dir / "zero2",
        job +
            Overrides{
                "MODEL.SHARDED_DDP_SETUP.USE_SDP=True",
                "MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=3000"},
        group);
    expect_same_training(zero2, ddp, kTolerance, "SwAV, ZeRO-2 against DDP");
  });
}

// VISSL's self-supervised configs set LABEL_TYPE: sample_index; the losses ignore labels, so
// the run is the standard-label run bit for bit. A classification loss refuses it.
TEST(TrainerSelfSupervisedTest, SampleIndexLabelsTrainAsStandardOnes) {
  run_on_ranks(1, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const Overrides job = swav_job(1) + kOneStep;
    const RunResult standard = ssl_run(dir / "standard", job, group);
    const RunResult indices =
        ssl_run(dir / "indices", job + Overrides{"DATA.TRAIN.LABEL_TYPE=sample_index"}, group);
    expect_same_training(indices, standard, 0.0, "LABEL_TYPE sample_index");
  });
}

// VISSL's SEER recipe, small: a RegNetY trunk with SyncBatchNorm under FSDP (a unit per trunk
// block), SwAV multi-crop (2 x 32 + 2 x 16: the trunk runs twice per step, its units gathered
// for each pass and their gradients reduced once), bfloat16 autocast, LARC and activation
// checkpointing, at 2 ranks: one step as the same recipe under DDP, the prototypes normalised
// through the shards. One step: both runs compute the same bfloat16 forward and backward
// from the same weights, and differ only in how float32 gradients and LARC's norms are summed
// across ranks (float32 rounding, kTolerance); a second step's bfloat16 forward would turn a
// last-bit weight difference into bfloat16 rounding differences.
TEST(TrainerSelfSupervisedTest, SeerRecipeUnderFsdpTrainsAsDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    // 2 x 48 + 2 x 32 crops: with 16-pixel crops the last stage's stride-2 convolution runs
    // on a 1 x 1 map, where libtorch's bfloat16 convolution backward gives NaN gradients with
    // oneDNN's AMX kernels (every try on a Xeon with AMX; self_supervised.md's known problem).
    const Overrides job =
        swav_job(2, /*small_crop=*/32, /*large_crop=*/48) + kOneStep +
        Overrides{
            "MODEL.TRUNK.NAME=regnet",
            "MODEL.TRUNK.REGNET={name: regnet_y_400mf}",
            "MODEL.HEAD.PARAMS=[[swav_head, {dims: [440, 64, 16], use_bn: True, "
            "num_clusters: [10, 6]}]]",
            "MODEL.AMP_PARAMS.USE_AMP=True",
            "MODEL.AMP_PARAMS.DTYPE=bfloat16",
            "MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
            "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=2",
            "OPTIMIZER.use_larc=True"};
    const RunResult ddp = ssl_run(dir / "ddp", job, group);
    const RunResult fsdp =
        ssl_run(dir / "fsdp", job + Overrides{"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}, group);
    expect_same_training(fsdp, ddp, kTolerance, "SEER recipe, FSDP against DDP");
    for (const char* name : {"head.0.prototypes0.weight", "head.0.prototypes1.weight"}) {
      const at::Tensor prototypes = fsdp.parameters.at(name);
      EXPECT_TRUE(at::allclose(prototypes.norm(2, 1), at::ones({prototypes.size(0)}), 1e-6, 1e-6))
          << name << " normalised through the shards";
    }
  });
}

// A queue of 8 images per rank from loss call 1, prototypes frozen for 2 iterations; a mid-
// epoch checkpoint (every iteration, stopped after 3 of 4) resumes bit for bit.
TEST(TrainerSelfSupervisedTest, SwavWithQueueResumesMidEpochBitExactly) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const Overrides job = swav_job(2) + Overrides{
                                            "LOSS.swav_loss.queue.queue_length=16",
                                            "LOSS.swav_loss.queue.start_iter=1",
                                            "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0."
                                            "prototypes1.weight', 2]]",
                                            "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"};
    const RunResult reference = ssl_run(dir / "full", job, group);
    ASSERT_EQ(reference.summary.iteration_losses.size(), 4u);
    EXPECT_TRUE(ssl_run(dir / "resumed", job, group, 3).summary.interrupted);
    group.barrier();
    const auto saved = checkpoint::load_checkpoint(dir / "resumed" / "checkpoint.torch");
    const auto queues = saved.at("loss_states").toGenericDict();
    EXPECT_EQ(queues.at("local_emb_queue").toTensor().sizes(), at::IntArrayRef({2, 2, 8, 16}));
    EXPECT_FALSE(torch::equal(
        queues.at("local_emb_queue").toTensor()[0], queues.at("local_emb_queue").toTensor()[1]))
        << "each rank keeps its own queue";
    const RunResult resumed = ssl_run(dir / "resumed", job, group);
    expect_resumed_bit_exactly(resumed, reference, 3, "rank " + std::to_string(group.rank()));
  });
}

// The queue is rescored with the prototypes in the loss, between the forward and the
// backward, where FSDP holds the root unit (the head's) gathered: under FSDP the queue trains
// as under DDP. 4 steps of the MLP trunk, the queue in use from the second: its scores are
// rescored with moved prototypes twice. Both runs sum the same gradients of 2 ranks (FSDP
// reduce-scatters what DDP all-reduces), so they agree within float32 rounding (kTolerance);
// prototypes read from freed storage would score the queue with garbage.
TEST(TrainerSelfSupervisedTest, SwavWithQueueUnderFsdpTrainsAsUnderDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const Overrides job =
        swav_job(2, 32) + kMlpTrunk +
        Overrides{"LOSS.swav_loss.queue.queue_length=16", "LOSS.swav_loss.queue.start_iter=1"};
    const RunResult ddp = ssl_run(dir / "ddp", job, group);
    ASSERT_EQ(ddp.summary.iteration_losses.size(), 4u);
    const RunResult fsdp =
        ssl_run(dir / "fsdp", job + Overrides{"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}, group);
    expect_same_training(fsdp, ddp, kTolerance, "SwAV with a queue, FSDP against DDP");
    // With bfloat16 compute copies the prototypes score the float32 queue in bfloat16.
    const RunResult copies = ssl_run(
        dir / "fsdp_o2",
        job +
            Overrides{
                "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True",
                "MODEL.FSDP_CONFIG.AMP_TYPE=O2",
                "MODEL.AMP_PARAMS.USE_AMP=True",
                "MODEL.AMP_PARAMS.DTYPE=bfloat16"},
        group);
    ASSERT_EQ(copies.summary.iteration_losses.size(), 4u);
    for (const float loss : copies.summary.iteration_losses) {
      EXPECT_TRUE(std::isfinite(loss));
    }
  });
}

// An end-of-epoch checkpoint of a 2-rank run with a queue resumes at one process: the queue,
// sized per rank by the world, starts afresh (a warning) and the run goes on.
TEST(TrainerSelfSupervisedTest, SwavWithQueueResumesAtAnotherWorldSizeWithAFreshQueue) {
  const fs::path dir = test_dir_for("ssl");
  auto job = [](int world_size) {
    return swav_job(world_size) + Overrides{"LOSS.swav_loss.queue.queue_length=16"};
  };
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    auto options = trainer_options_from_config(ssl_config(fresh(dir, group), job(2)));
    options.stop_after_iterations = 3; // killed in epoch 2: the latest is the end of epoch 1
    Trainer(options, "", borrow(group)).run();
  });
  run_on_ranks(1, [&](comm::ProcessGroup& group) {
    const RunResult resumed = ssl_run(dir, job(1), group);
    EXPECT_TRUE(resumed.summary.resumed);
    EXPECT_EQ(resumed.summary.iterations, 4);
    EXPECT_EQ(resumed.summary.iteration_losses.size(), 2u);
  });
}

// Activation checkpointing cuts the trunk the views run through (twice per step, once per
// resolution) and recomputes it in the backward: the same losses and weights, bit for bit.
// Its cut is planned on probe steps of the packed views (2 x 3x32x32 + 2 x 3x16x16).
TEST(TrainerSelfSupervisedTest, ActivationCheckpointingChangesNothing) {
  const Overrides checkpointing = {
      "MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
      "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=3"};
  const RunPlan plan = resolve_run(ssl_config(test_dir_for("ssl"), swav_job(1) + checkpointing));
  EXPECT_EQ(plan.parallel.activation_checkpointing.num_splits, 3);
  EXPECT_EQ(
      plan.parallel.activation_checkpointing.probe_input_shape,
      (std::vector<int64_t>{2 * 3 * 32 * 32 + 2 * 3 * 16 * 16}));
  run_on_ranks(1, [&](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const RunResult plain = ssl_run(dir / "plain", swav_job(1) + kOneStep, group);
    const RunResult checkpointed =
        ssl_run(dir / "checkpointed", swav_job(1) + kOneStep + checkpointing, group);
    expect_same_training(checkpointed, plain, 0.0, "SwAV, activation checkpointing");
  });
}

TEST(TrainerSelfSupervisedTest, FrozenPrototypesDoNotMoveUntilTheirIteration) {
  run_on_ranks(1, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    auto options = trainer_options_from_config(ssl_config(
        dir,
        swav_job(1) + Overrides{
                          "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0."
                          "prototypes0.weight', 2]]",
                          "LOSS.swav_loss.normalize_last_layer=False"}));
    options.stop_after_iterations = 2;
    Trainer trainer(options, "", borrow(group));
    const auto before = trainer.full_parameters();
    trainer.run();
    const auto after = trainer.full_parameters();
    EXPECT_TRUE(torch::equal(
        after.at("head.0.prototypes0.weight"), before.at("head.0.prototypes0.weight")));
    EXPECT_FALSE(torch::equal(
        after.at("head.0.prototypes1.weight"), before.at("head.0.prototypes1.weight")));
  });
}

// The frozen map under the sharded modes, whose optimizers step pieces of flat shards: the
// dropped gradients are the pieces' (ParallelModel::drop_gradients), so each mode trains as
// DDP does and the frozen prototypes keep their first value, bit for bit, until their
// iteration; LARC's per-parameter norms leave them out alike.
TEST(TrainerSelfSupervisedTest, FrozenPrototypesUnderZeroAndFsdpTrainAsUnderDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh(test_dir_for("ssl"), group);
    const Overrides job = swav_job(2) +
                          Overrides{
                              "MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[['module.heads.0."
                              "prototypes0.weight', 2]]",
                              "LOSS.swav_loss.normalize_last_layer=False",
                              "OPTIMIZER.use_larc=True"};
    auto options = trainer_options_from_config(ssl_config(dir / "ddp", job));
    options.stop_after_iterations = 2;
    Trainer trainer(options, "", borrow(group));
    const at::Tensor first = trainer.full_parameters().at("head.0.prototypes0.weight");
    RunResult ddp{trainer.run(), trainer.full_parameters()};
    ASSERT_TRUE(torch::equal(ddp.parameters.at("head.0.prototypes0.weight"), first));
    const std::vector<std::pair<std::string, std::string>> modes = {
        {"zero1", "OPTIMIZER.use_zero=True"},
        {"zero2", "MODEL.SHARDED_DDP_SETUP.USE_SDP=True"},
        {"fsdp", "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}};
    for (const auto& [name, mode] : modes) {
      const RunResult sharded = ssl_run(dir / name, job + Overrides{mode}, group, 2);
      expect_same_training(sharded, ddp, kTolerance, "frozen prototypes under " + name);
      EXPECT_TRUE(torch::equal(sharded.parameters.at("head.0.prototypes0.weight"), first)) << name;
    }
  });
}

void expect_refused(const Overrides& overrides, const std::string& expected) {
  try {
    resolve_run(ssl_config(test_dir_for("ssl"), overrides));
    ADD_FAILURE() << "accepted; expected an error containing: " << expected;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

// Without a class token a ViT takes only its build size (VISSL asserts so); other trunks but
// resnet and regnet take one size too.
TEST(TrainerSelfSupervisedTest, CropsOfTwoSizesNeedATrunkThatTakesThem) {
  expect_refused(
      dino_vit_job() + Overrides{"MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN=False"},
      "MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN True");
  expect_refused(
      dino_vit_job() + Overrides{"MODEL.TRUNK.VISION_TRANSFORMERS.CLASSIFIER=gap"},
      "views of several sizes and MODEL.TRUNK.NAME = vision_transformer");
  expect_refused(
      swav_job(1) + kMlpTrunk,
      "only the resnet, regnet and vision_transformer (with a class token)");
}

// VISSL's checkpoint of each recipe (tests/reference/gen_vissl_head_checkpoints.py: VISSL's
// layout, its ResNet trunk names and its head modules, random values) initializes the run
// through MODEL.WEIGHTS_INIT as a user would give it: every head tensor lands in the parameter
// or buffer PyTorch itself names when the same modules form Largo's flat head (swav_head's
// heads.0.projection_head.0.weight -> head.0.projection_head.0.weight; the second mlp of a
// chain after the first one's layers, BatchNorm and ReLU counted). A file whose head is not
// the model's is refused naming its tensors.
TEST(TrainerSelfSupervisedTest, VisslCheckpointsInitializeEveryHeadThroughWeightsInit) {
  if (!fs::exists(LARGO_PYTHON)) {
    GTEST_SKIP() << "no Python with torch (LARGO_PYTHON)";
  }
  const fs::path files = test_dir_for("vissl_heads_files");
  fs::remove_all(files);
  fs::create_directories(files);
  const std::string command = fmt::format(
      LARGO_PYTHON " {}/reference/gen_vissl_head_checkpoints.py {}",
      largo::test_paths::data_dir(),
      files.string());
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const std::string barlow_twins_heads =
      "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 32], use_bn: True, use_relu: True, use_bias: "
      "False, skip_last_layer_relu_bn: False}], [mlp, {dims: [32, 32], use_bn: True, use_relu: "
      "True, use_bias: False, skip_last_layer_relu_bn: False}], [mlp, {dims: [32, 16], use_bias: "
      "False}]]";
  const std::vector<std::pair<std::string, Overrides>> recipes = {
      {"swav", swav_job(1)},
      {"simclr", simclr_job(1)},
      {"barlow_twins", barlow_twins_job(1) + Overrides{barlow_twins_heads}},
      {"dino",
       swav_job(1, 16, 32) +
           Overrides{
               "LOSS.name=dino_loss",
               "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False",
               "MODEL.HEAD.PARAMS=[[dino_head, {in_dim: 512, num_clusters: [16], hidden_dim: "
               "32, bottleneck_dim: 8, use_bn: True, normalize_last_layer: False}]]"}}};
  auto weights_init = [&](const std::string& file) {
    return Overrides{"MODEL.WEIGHTS_INIT.PARAMS_FILE=" + (files / (file + ".torch")).string()};
  };
  for (const auto& [name, job] : recipes) {
    SCOPED_TRACE(name);
    const fs::path dir = test_dir_for("vissl_heads_" + name);
    fs::remove_all(dir);
    Trainer trainer(trainer_options_from_config(ssl_config(dir, job + weights_init(name))));
    std::map<std::string, at::Tensor> tensors = trainer.full_parameters();
    for (const auto& item : trainer.model()->named_buffers()) {
      tensors.emplace(item.key(), item.value());
    }
    const auto expected = checkpoint::load_checkpoint(files / (name + "_expected.torch"));
    int64_t compared = 0;
    for (const auto& item : expected) {
      const std::string& largo_name = item.key().toStringRef();
      if (largo_name.find("num_batches_tracked") != std::string::npos) {
        continue; // SKIP_LAYERS' default
      }
      ASSERT_EQ(tensors.count(largo_name), 1U) << largo_name;
      EXPECT_TRUE(tensors.at(largo_name).equal(item.value().toTensor())) << largo_name;
      ++compared;
    }
    const std::map<std::string, int64_t> tensors_of_head = {
        {"swav", 10}, {"simclr", 4}, {"barlow_twins", 11}, {"dino", 16}};
    EXPECT_EQ(compared, tensors_of_head.at(name));
  }
  // SimCLR's run from SwAV's checkpoint: the file's swav_head matches nothing of the model.
  try {
    Trainer(trainer_options_from_config(
        ssl_config(test_dir_for("vissl_heads_mismatch"), simclr_job(1) + weights_init("swav"))));
    ADD_FAILURE() << "SwAV's head loaded into SimCLR's";
  } catch (const CheckpointError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("not in the model"), std::string::npos) << message;
    EXPECT_NE(message.find("heads.0.prototypes0.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("heads.0.projection_head.0.weight"), std::string::npos) << message;
  }
  fs::remove_all(files);
}

// FSDP computing in bfloat16 copies of its float32 shards.
const Overrides kFsdpComputeCopies = {
    "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True",
    "MODEL.AMP_PARAMS.USE_AMP=True",
    "MODEL.FSDP_CONFIG.compute_dtype=bfloat16"};

TEST(TrainerSelfSupervisedTest, WhatDoesNotComposeIsRefusedNamingTheKey) {
  expect_refused(swav_job(1) + Overrides{"TEST_MODEL=True"}, "set TEST_MODEL False");
  expect_refused(
      swav_job(1) +
          Overrides{
              "LOSS.name=simclr_info_nce_loss",
              "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 16]}]]",
              "LOSS.simclr_info_nce_loss.buffer_params.embedding_dim=16"},
      "simclr_info_nce_loss compares 2 views of one size");
  expect_refused(
      swav_job(1) + Overrides{"LOSS.swav_loss.crops_for_assign=[0, 4]"},
      "LOSS.swav_loss.crops_for_assign");
  expect_refused(
      swav_job(1) + Overrides{"LOSS.swav_loss.num_crops=8"}, "inferred from DATA.TRAIN.TRANSFORMS");
  // The values VISSL would copy in (SEER's regnet10B.yaml writes them) change nothing: accepted.
  EXPECT_NO_THROW(resolve_run(ssl_config(
      test_dir_for("ssl"),
      swav_job(1) +
          Overrides{"LOSS.swav_loss.num_crops=4", "LOSS.swav_loss.num_prototypes=[10, 6]"})));
  expect_refused(
      swav_job(1) + Overrides{"LOSS.swav_loss.num_prototypes=[10]"},
      "LOSS.swav_loss.num_prototypes = [10]");
  expect_refused(
      swav_job(1) + Overrides{"LOSS.swav_loss.output_dir=null"}, "LOSS.swav_loss.output_dir");
  // Padded crops: multicrop_collator's one parameter, a trunk with a global pool, not DINO.
  const std::string padded = "DATA.TRAIN.COLLATE_FUNCTION_PARAMS";
  expect_refused(
      swav_job(1) + Overrides{padded + "={create_multidimensional_tensor: True, pad: 1}"},
      padded + " = {create_multidimensional_tensor: True, pad: 1}: expected {}");
  expect_refused(
      dino_job(1) + Overrides{padded + "={create_multidimensional_tensor: True}"},
      padded + ".create_multidimensional_tensor = True: expected False with MODEL.TRUNK.NAME mlp "
               "and LOSS.name dino_loss");
  expect_refused(
      swav_job(1) + Overrides{"LOSS.name=CrossEntropyLoss"},
      "which only a self-supervised loss trains");
  const Overrides one_view = {
      "DATA.TRAIN.TRANSFORMS=[{name: RandomResizedCrop, size: 24}, {name: ToTensor}]",
      "DATA.TRAIN.COLLATE_FUNCTION=default_collate"};
  expect_refused(simclr_job(1) + one_view, "trains on several views of each image");
  expect_refused(
      simclr_job(1) + one_view +
          Overrides{
              "LOSS.name=CrossEntropyLoss",
              "MODEL.HEAD.PARAMS=[[mlp, {dims: [512, 2]}]]",
              "DATA.TRAIN.LABEL_TYPE=sample_index"},
      "a classification loss needs standard labels");
  expect_refused(
      simclr_job(1) + Overrides{"LOSS.simclr_info_nce_loss.buffer_params."
                                "embedding_dim=128"},
      "the projection head ends in 16 outputs");
  expect_refused(
      barlow_twins_job(1) + Overrides{"LOSS.barlow_twins_loss.embedding_dim=8192"},
      "LOSS.barlow_twins_loss.embedding_dim = 8192");
  expect_refused(
      swav_job(1) + Overrides{"LOSS.name=barlow_twins_loss"},
      "LOSS.barlow_twins_loss.embedding_dim = 8192: the loss needs a projection head");
  expect_refused(
      swav_job(1) +
          Overrides{"MODEL.AMP_PARAMS.USE_AMP=True", "MODEL.AMP_PARAMS.AMP_ARGS={opt_level: O2}"},
      "use O1");
  // MoCo: FSDP's compute copies, a shuffle VISSL would not do, keys that do not fit.
  expect_refused(
      moco_job(1) + kFsdpComputeCopies,
      "LOSS.name = moco_loss with FSDP's compute copies (MODEL.FSDP_CONFIG.AMP_TYPE O2 or "
      "compute_dtype float16 / bfloat16) is not available in this version of Largo");
  expect_refused(
      moco_job(1) + Overrides{"MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=True"},
      "LOSS.moco_loss.shuffle_batch");
  expect_refused(moco_job(1) + Overrides{"LOSS.moco_loss.momentum=1.5"}, "LOSS.moco_loss.momentum");
  expect_refused(
      moco_job(1) + Overrides{"LOSS.moco_loss.queue_size=12"}, "LOSS.moco_loss.queue_size = 12");
  expect_refused(
      moco_job(1) + Overrides{"LOSS.moco_loss.embedding_dim=32"},
      "LOSS.moco_loss.embedding_dim = 32");
  expect_refused(
      moco_job(1) +
          Overrides{"MODEL.AMP_PARAMS.USE_AMP=True", "MODEL.AMP_PARAMS.AMP_ARGS={opt_level: O2}"},
      "use O1 (autocast) or O0");
  // DINO: FSDP's compute copies, a pipeline, O2, a head or crops that do not fit.
  expect_refused(
      dino_job(1) + kFsdpComputeCopies,
      "LOSS.name = dino_loss with FSDP's compute copies (MODEL.FSDP_CONFIG.AMP_TYPE O2 or "
      "compute_dtype float16 / bfloat16) is not available in this version of Largo");
  expect_refused(
      dino_job(1) + Overrides{"DISTRIBUTED.PIPELINE_SIZE=2"},
      "LOSS.name = dino_loss with DISTRIBUTED.PIPELINE_SIZE > 1: not available in this version");
  expect_refused(
      dino_job(1) +
          Overrides{"MODEL.AMP_PARAMS.USE_AMP=True", "MODEL.AMP_PARAMS.AMP_ARGS={opt_level: O2}"},
      "LOSS.name = dino_loss with Apex O2/O3 (MODEL.AMP_PARAMS) is not available");
  expect_refused(
      dino_job(1) + Overrides{"LOSS.dino_loss.crops_for_teacher=[0, 4]"},
      "LOSS.dino_loss.crops_for_teacher");
  expect_refused(
      dino_job(1) + Overrides{"LOSS.dino_loss.output_dim=16"}, "dino_head's num_clusters");
  expect_refused(dino_job(1) + Overrides{"LOSS.dino_loss.momentum=1.5"}, "LOSS.dino_loss.momentum");
  expect_refused(
      swav_job(1) + Overrides{"LOSS.name=dino_loss"}, "MODEL.HEAD.PARAMS without a dino_head");
  expect_refused(dino_job(1) + Overrides{"LOSS.name=swav_loss"}, "without a swav_head");
  expect_refused(
      dino_job(1) + Overrides{"MODEL.HEAD.PARAMS=[[dino_head, {in_dim: 512, num_clusters: [16], "
                              "num_layerz: 2}]]"},
      "MODEL.HEAD.PARAMS[0].num_layerz");
  // DeepCluster v2: its targets need the images' indexes, crops and a head that fit, and k-means
  // heads no larger than a rank's memory (8 images at 2 ranks, 16 at one).
  expect_refused(
      deepclusterv2_job(1) + Overrides{"DATA.TRAIN.LABEL_TYPE=standard"},
      "DATA.TRAIN.LABEL_TYPE = standard");
  expect_refused(
      deepclusterv2_job(1) + Overrides{"LOSS.deepclusterv2_loss.memory_params.crops_for_mb=[4]"},
      "LOSS.deepclusterv2_loss.memory_params.crops_for_mb");
  expect_refused(
      deepclusterv2_job(1) + Overrides{"LOSS.deepclusterv2_loss.memory_params.embedding_dim=128"},
      "LOSS.deepclusterv2_loss.memory_params.embedding_dim = 128");
  expect_refused(
      deepclusterv2_job(1) +
          Overrides{"MODEL.HEAD.PARAMS=[[swav_head, {dims: [512, 16], num_clusters: [4]}]]"},
      "LOSS.deepclusterv2_loss.memory_params.embedding_dim = 16");
  expect_refused(
      deepclusterv2_job(1) + Overrides{"DISTRIBUTED.PIPELINE_SIZE=2"},
      "LOSS.name = deepclusterv2_loss with DISTRIBUTED.PIPELINE_SIZE > 1");
}

// More clusters than a rank reads images per epoch: refused when the run starts (the memory's
// size is the data's), naming the key.
TEST(TrainerSelfSupervisedTest, DeepClusterV2RefusesMoreClustersThanARanksImages) {
  const fs::path dir = test_dir_for("ssl");
  fs::remove_all(dir);
  const auto options = trainer_options_from_config(ssl_config(
      dir, deepclusterv2_job(1) + Overrides{"LOSS.deepclusterv2_loss.num_clusters=[17]"}));
  try {
    Trainer trainer(options, "", comm::ProcessGroup::single_process());
    ADD_FAILURE() << "accepted 17 clusters for 16 images";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("LOSS.deepclusterv2_loss.num_clusters"), std::string::npos)
        << e.what();
  }
}

} // namespace
} // namespace largo::train::trainer_self_supervised_test
