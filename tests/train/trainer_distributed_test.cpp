// The trainer on 2 ranks (Gloo over 127.0.0.1): rank 0 alone writes the run directory;
// a mid-epoch resume with VISSL's stateful sampler equals the uninterrupted run bit for bit;
// and gradient accumulation equals the larger batch.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/error.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_test_util.h"

namespace largo::train::trainer_distributed_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

fs::path test_dir() {
  return test_dir_for("ddp");
}

std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

// Rank 0 empties the directory before anyone uses it.
fs::path fresh_dir(comm::ProcessGroup& group) {
  const fs::path dir = test_dir();
  if (group.rank() == 0) {
    fs::remove_all(dir);
  }
  group.barrier();
  return dir;
}

TEST(TrainerDistributedTest, RankZeroAloneWritesAndEvaluationCoversTheWholeTestSet) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh_dir(group);
    Config config = synthetic_job_config(dir);
    Trainer trainer(trainer_options_from_config(config), config.to_yaml(), borrow(group));
    TrainSummary summary = trainer.run();
    // 96 samples over 2 ranks in batches of 16: 3 iterations per epoch on each rank.
    EXPECT_EQ(summary.iteration_losses.size(), 9u);
    group.barrier(); // rank 0 may still be writing the final checkpoint
    auto events = read_metrics(dir / "metrics.jsonl");
    int test_events = 0;
    for (const auto& event : events) {
      test_events += event["phase"] == "test" ? 1 : 0;
    }
    EXPECT_EQ(test_events, 3) << "one line per evaluation, written by rank 0 only";
    auto latest = checkpoint::load_checkpoint(dir / "checkpoint.torch");
    EXPECT_EQ(latest.at("world_size").toInt(), 2);
    EXPECT_EQ(latest.at("rng_states").toTensor().size(0), 2);
    // Both ranks report the same, all-reduced accuracy.
    ASSERT_TRUE(summary.final_top1.has_value());
    at::Tensor top1 = at::tensor({*summary.final_top1}, at::kDouble);
    at::Tensor rank0_top1 = top1.clone();
    group.broadcast(rank0_top1, 0);
    EXPECT_TRUE(top1.equal(rank0_top1));
  });
}

TEST(TrainerDistributedTest, MidEpochResumeWithStatefulSamplerIsBitExact) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh_dir(group);
    // 96 samples, 2 ranks, batch 8: 6 iterations per epoch, 3 epochs. The small CNN's dropout
    // makes every rank's RNG stream matter.
    const std::vector<std::string> job = {"DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER=True",
                                          "DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"};
    Config full = synthetic_job_config(dir / "full", job);
    Trainer uninterrupted(trainer_options_from_config(full), "", borrow(group));
    TrainSummary reference = uninterrupted.run();
    ASSERT_EQ(reference.iteration_losses.size(), 18u);

    // Stopped after 10 iterations (mid-epoch 2) with checkpoints every 4: the resumed run
    // starts from iteration 8 and must serve exactly the rest of epoch 2 and all of epoch 3.
    std::vector<std::string> interrupted_job = job;
    interrupted_job.push_back("CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=4");
    Config partial = synthetic_job_config(dir / "resumed", interrupted_job);
    auto first_options = trainer_options_from_config(partial);
    first_options.stop_after_iterations = 10;
    TrainSummary first = Trainer(first_options, "", borrow(group)).run();
    ASSERT_TRUE(first.interrupted);
    group.barrier();
    Trainer second(trainer_options_from_config(partial), "", borrow(group));
    TrainSummary resumed = second.run();
    ASSERT_TRUE(resumed.resumed);
    ASSERT_EQ(resumed.iteration_losses.size(), 10u);
    for (size_t i = 0; i < resumed.iteration_losses.size(); ++i) {
      EXPECT_EQ(resumed.iteration_losses[i], reference.iteration_losses[8 + i])
          << "iteration " << 8 + i << " on rank " << group.rank();
    }
    auto reference_params = uninterrupted.model()->named_parameters();
    for (const auto& item : second.model()->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), reference_params[item.key()])) << item.key();
    }
  });
}

// Activation checkpointing under DDP, with the overlapped bucket reduction and with
// DISTRIBUTED.MANUAL_GRADIENT_REDUCTION: every rank's losses and final weights equal those
// of the same run without checkpointing, bit for bit.
TEST(TrainerDistributedTest, ActivationCheckpointingLeavesDdpRunsUnchanged) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh_dir(group);
    for (const char* manual : {"False", "True"}) {
      std::vector<std::string> job = {"OPTIMIZER.num_epochs=1",
                                      std::string("DISTRIBUTED.MANUAL_GRADIENT_REDUCTION=") + manual};
      Config plain_config = synthetic_job_config(dir / fmt::format("plain_{}", manual), job);
      Trainer plain(trainer_options_from_config(plain_config), "", borrow(group));
      TrainSummary expected = plain.run();
      job.push_back("MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True");
      job.push_back("MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=3");
      Config config = synthetic_job_config(dir / fmt::format("checkpointed_{}", manual), job);
      Trainer checkpointed(trainer_options_from_config(config), "", borrow(group));
      TrainSummary actual = checkpointed.run();
      ASSERT_EQ(expected.iteration_losses.size(), 3u);
      EXPECT_EQ(actual.iteration_losses, expected.iteration_losses)
          << "MANUAL_GRADIENT_REDUCTION=" << manual << ", rank " << group.rank();
      auto expected_params = plain.model()->named_parameters();
      for (const auto& item : checkpointed.model()->named_parameters()) {
        EXPECT_TRUE(torch::equal(item.value(), expected_params[item.key()]))
            << item.key() << ", MANUAL_GRADIENT_REDUCTION=" << manual;
      }
    }
  });
}

TEST(TrainerDistributedTest, ResumingMidEpochWithAnotherWorldSizeIsAClearError) {
  const fs::path dir = test_dir();
  Config config = synthetic_job_config(dir, {"CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2"});
  if (largo::testing::is_parent()) {
    // Written by one process, mid-epoch...
    fs::remove_all(dir);
    auto options = trainer_options_from_config(config);
    options.stop_after_iterations = 3;
    Trainer(options, "", comm::ProcessGroup::single_process()).run();
  }
  // ...resumed by two.
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    try {
      Trainer(trainer_options_from_config(config), "", borrow(group)).run();
      ADD_FAILURE() << "expected a CheckpointError";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("1 rank(s)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("this run has 2 rank(s)"), std::string::npos);
    }
  });
}

// An MLP without dropout, no random transforms: two runs differ only in how the batches
// are grouped into optimizer steps.
std::vector<std::string> deterministic_mlp_job() {
  return {"MODEL.TRUNK.NAME=mlp", "MODEL.TRUNK.MLP.HIDDEN_DIMS=[32]",
          "DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]", "TEST_MODEL=False"};
}

TEST(TrainerDistributedTest, GradientAccumulationEqualsTheLargerBatchInOneProcess) {
  const fs::path dir = test_dir();
  fs::remove_all(dir);
  auto job = deterministic_mlp_job();
  job.push_back("DATA.TRAIN.BATCHSIZE_PER_REPLICA=16");
  Config large = synthetic_job_config(dir / "large", job);
  auto accumulated_job = deterministic_mlp_job();
  accumulated_job.push_back("DATA.TRAIN.BATCHSIZE_PER_REPLICA=4");
  accumulated_job.push_back("TRAINER.GRADIENT_ACCUMULATION_STEPS=4");
  Config accumulated = synthetic_job_config(dir / "accumulated", accumulated_job);
  auto single = comm::ProcessGroup::single_process();
  Trainer large_trainer(trainer_options_from_config(large), "", single);
  Trainer accumulated_trainer(trainer_options_from_config(accumulated), "", single);
  TrainSummary large_summary = large_trainer.run();
  TrainSummary accumulated_summary = accumulated_trainer.run();
  ASSERT_EQ(large_summary.iteration_losses.size(), accumulated_summary.iteration_losses.size());
  auto large_params = large_trainer.model()->named_parameters();
  for (const auto& item : accumulated_trainer.model()->named_parameters()) {
    // fp32: a sum of 4 quarter-batch means vs one mean differs by rounding only.
    EXPECT_TRUE(at::allclose(item.value(), large_params[item.key()], 0, 1e-5)) << item.key();
  }
  fs::remove_all(dir);
}

// The equality of 2-rank DDP with one process on the global batch is tested on the
// library (tests/parallel); here: accumulation under DDP keeps the ranks' weights identical
// (only the last micro-batch of each step communicates, so a missed reduction would show).
TEST(TrainerDistributedTest, AccumulationUnderDdpKeepsRanksIdentical) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = fresh_dir(group);
    auto job = deterministic_mlp_job();
    job.push_back("DATA.TRAIN.BATCHSIZE_PER_REPLICA=4");
    job.push_back("TRAINER.GRADIENT_ACCUMULATION_STEPS=2");
    Config config = synthetic_job_config(dir, job);
    Trainer trainer(trainer_options_from_config(config), "", borrow(group));
    TrainSummary summary = trainer.run();
    // 48 samples per rank, 8 per step: 6 steps per epoch, 3 epochs.
    EXPECT_EQ(summary.iteration_losses.size(), 18u);
    for (const auto& item : trainer.model()->named_parameters()) {
      at::Tensor mine = item.value().detach().clone();
      at::Tensor rank0 = mine.clone();
      group.broadcast(rank0, 0);
      EXPECT_TRUE(mine.equal(rank0)) << item.key();
    }
  });
}

// VISSL scales the learning rate by the global batch and starts a warm-up at one node's:
// 2 nodes of 1 process, 16 per rank: lr* = 0.1 x 32 / 256 = 0.0125 and the warm-up starts at
// 0.1 x 16 / 256 = 0.00625 (taking the global batch for the node's would drop the warm-up
// and start at lr*).
TEST(TrainerDistributedTest, AutoLrScalingWarmsUpFromOneNodesBatchOnTwoNodes) {
  largo::testing::RankRunOptions two_nodes;
  two_nodes.extra_env = [](int rank) {
    return std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                              {"WORLD_SIZE", "2"},
                                              {"LOCAL_RANK", "0"},
                                              {"LOCAL_WORLD_SIZE", "1"}};
  };
  run_on_ranks(
      2,
      [](comm::ProcessGroup& group) {
        const fs::path dir = fresh_dir(group);
        const std::string lr = "OPTIMIZER.param_schedulers.lr.";
        Config config = synthetic_job_config(
            dir, {"OPTIMIZER.num_epochs=1", "LOG_FREQUENCY=1", lr + "name=composite",
                  lr + "schedulers=[{name: linear, start_value: 0.05, end_value: 0.1}, "
                       "{name: cosine, start_value: 0.1, end_value: 0.0}]",
                  lr + "lengths=[0.5, 0.5]", lr + "auto_lr_scaling.auto_scale=True",
                  "TEST_MODEL=False"});
        Trainer trainer(trainer_options_from_config(config), "", borrow(group));
        trainer.run();
        group.barrier();
        const auto events = read_metrics(dir / "metrics.jsonl");
        ASSERT_GE(events.size(), 3u);
        EXPECT_NEAR(events.front()["lr"].get<double>(), 0.00625, 1e-12);
        EXPECT_GT(events[1]["lr"].get<double>(), 0.00625); // warming up towards 0.0125
        EXPECT_LT(events[1]["lr"].get<double>(), 0.0125);
      },
      two_nodes);
}

} // namespace
} // namespace largo::train::trainer_distributed_test
