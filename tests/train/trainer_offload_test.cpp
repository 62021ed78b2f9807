// The optimizer offloaded to host memory in the trainer (Gloo over 127.0.0.1):
// OPTIMIZER.offload_optimizer (ZeRO-1/2) and MODEL.FSDP_CONFIG.offload_optimizer (FSDP) train
// bit for bit like the same run without offload (on the CPU the host is the device, so the
// same updates run on the same values), resume mid-epoch bit for bit, write checkpoints that
// a run without offload resumes, and are refused by name where no sharded optimizer exists.
#include <largo/core/error.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

namespace largo::train::trainer_offload_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

const Overrides kZero1 = {"OPTIMIZER.use_zero=True"};
const Overrides kZero2 = {
    "MODEL.SHARDED_DDP_SETUP.USE_SDP=True", "MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=3000"};
const Overrides kFsdp = {"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"};
const Overrides kOffloadZero = {"OPTIMIZER.offload_optimizer=True"};
const Overrides kOffloadFsdp = {"MODEL.FSDP_CONFIG.offload_optimizer=True"};

fs::path test_dir() {
  return test_dir_for("offload");
}

TEST(TrainerOffloadTest, TrainsBitForBitLikeTheRunWithoutOffload) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    const Overrides job = {
        "OPTIMIZER.num_epochs=1",
        "CHECKPOINT.AUTO_RESUME=False",
        "CHECKPOINT.OVERWRITE_EXISTING=True"};
    // AdamW with LARC: state of two moments and per-parameter norms completed over the ranks
    // through the host optimizer's reducer; clipping measures the device's gradients.
    const Overrides adamw_larc = {
        "OPTIMIZER.name=adamw",
        "OPTIMIZER.param_schedulers.lr.start_value=0.002",
        "OPTIMIZER.use_larc=True",
        "MODEL.GRAD_CLIP.USE_GRAD_CLIP=True",
        "MODEL.GRAD_CLIP.MAX_NORM=0.5"};
    const std::vector<std::tuple<std::string, Overrides, Overrides>> variants = {
        {"ZeRO-1, sgd momentum", kZero1, kOffloadZero},
        {"ZeRO-2, adamw, larc, clipping", kZero2 + adamw_larc, kOffloadZero},
        {"FSDP, sgd momentum, accumulation 2",
         kFsdp + Overrides{"TRAINER.GRADIENT_ACCUMULATION_STEPS=2"},
         kOffloadFsdp},
        {"FSDP, adamw, larc, clipping", kFsdp + adamw_larc, kOffloadFsdp},
    };
    for (const auto& [what, mode, offload] : variants) {
      const RunResult on_device = train_run(dir / "device", job + mode, borrow(group));
      const RunResult offloaded = train_run(dir / "host", job + mode + offload, borrow(group));
      expect_same_training(offloaded, on_device, /*tolerance=*/0.0, what);
    }
  });
}

TEST(TrainerOffloadTest, ResumesMidEpochBitForBitAndItsCheckpointsResumeWithoutOffload) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    const Overrides zero2 = kZero2 + Overrides{"OPTIMIZER.name=adamw"} + kOffloadZero;
    const RunResult reference = expect_mid_epoch_resume_bit_exact(dir / "zero2", zero2, group);
    expect_mid_epoch_resume_bit_exact(dir / "fsdp", kFsdp + kOffloadFsdp, group);

    // The offloaded run's checkpoint of iteration 8, resumed without offload: the state is in
    // the format of a run without offload, so the run continues as the reference did.
    const Overrides stateful = {
        "DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER=True",
        "DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
        "CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=4"};
    const fs::path run = dir / "without_offload";
    if (group.rank() == 0) {
      fs::remove_all(run);
    }
    group.barrier();
    EXPECT_TRUE(train_run(run, stateful + zero2, borrow(group), 10).summary.interrupted);
    group.barrier();
    const Overrides without_offload = stateful + kZero2 + Overrides{"OPTIMIZER.name=adamw"};
    expect_resumed_bit_exactly(
        train_run(run, without_offload, borrow(group)),
        reference,
        8,
        "resumed without offload, rank " + std::to_string(group.rank()));
  });
}

TEST(TrainerOffloadConfigTest, KeysWithoutTheirShardedOptimizerAreRefusedByName) {
  auto error_of = [](const Overrides& overrides) -> std::string {
    try {
      trainer_options_from_config(synthetic_job_config(test_dir(), overrides));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  };
  // DDP has no sharded optimizer to offload; each key belongs to its modes.
  EXPECT_NE(error_of(kOffloadZero).find("OPTIMIZER.offload_optimizer"), std::string::npos)
      << error_of(kOffloadZero);
  EXPECT_NE(
      error_of(kFsdp + kOffloadZero).find("MODEL.FSDP_CONFIG.offload_optimizer"), std::string::npos)
      << error_of(kFsdp + kOffloadZero);
  EXPECT_NE(
      error_of(kZero1 + kOffloadFsdp).find("MODEL.FSDP_CONFIG.offload_optimizer"),
      std::string::npos)
      << error_of(kZero1 + kOffloadFsdp);
  EXPECT_NE(
      error_of(
          {"OPTIMIZER.name=zero", "OPTIMIZER.base_optimizer={name: sgd, offload_optimizer: True}"})
          .find("OPTIMIZER.base_optimizer.offload_optimizer"),
      std::string::npos);
  // Set where they belong, each reaches the library's option.
  EXPECT_TRUE(trainer_options_from_config(synthetic_job_config(test_dir(), kZero2 + kOffloadZero))
                  .parallel.offload_optimizer);
  EXPECT_TRUE(trainer_options_from_config(synthetic_job_config(test_dir(), kFsdp + kOffloadFsdp))
                  .parallel.offload_optimizer);
}

} // namespace
} // namespace largo::train::trainer_offload_test
