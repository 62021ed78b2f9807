// MACHINE.CUDA_GRAPH (TrainerOptions::cuda_graph): off by default; on, it is refused at start
// naming the first thing that keeps the run from being captured as one CUDA graph (several
// ranks, a host read every step, another optimizer or LARC, a weight-decay schedule, gradient
// clipping, activation checkpointing, a self-supervised loss, SyncBatchNorm, an incomplete
// last batch, and last MACHINE.DEVICE cpu); without any of them it is on where a GPU is
// visible, and falls back to the CPU with the run (warned) where MACHINE.DEVICE gpu finds none.
// The capture itself is tested on a GPU (CudaGraphStepCudaTest).
#include <largo/core/error.h>
#include <largo/train/run_plan.h>
#include <largo/train/trainer_config.h>

#include "train/trainer_test_util.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

namespace largo::train::trainer_cuda_graph_test {
namespace {

std::string refusal_of(const std::vector<std::string>& overrides) {
  try {
    resolve_run(synthetic_job_config(test_dir_for("cuda_graph"), overrides));
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(TrainerCudaGraphTest, IsOffByDefault) {
  EXPECT_FALSE(resolve_run(synthetic_job_config(test_dir_for("cuda_graph"))).cuda_graph);
}

TEST(TrainerCudaGraphTest, IsRefusedNamingWhatStandsInItsWay) {
  // Everything a capture needs but the device (this test runs on the CPU).
  const std::vector<std::string> capturable = {
      "MACHINE.CUDA_GRAPH=True", "MACHINE.SYNC_EVERY_STEP=False", "DATA.TRAIN.DROP_LAST=True"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), capturable.begin(), capturable.end());
    return extra;
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {with({"MACHINE.SYNC_EVERY_STEP=True"}), "no host read in the step"},
      {with({"OPTIMIZER.name=adamw"}), "OPTIMIZER.name sgd without LARC"},
      {with({"OPTIMIZER.use_larc=True"}), "OPTIMIZER.name sgd without LARC"},
      {with({"MODEL.GRAD_CLIP.USE_GRAD_CLIP=True"}), "no MODEL.GRAD_CLIP"},
      {with({"DATA.TRAIN.DROP_LAST=False"}), "DATA.TRAIN.DROP_LAST True"},
      {capturable, "MACHINE.DEVICE gpu"}, // the synthetic job's MACHINE.DEVICE is cpu
  };
  for (const auto& [overrides, obstacle] : cases) {
    const std::string error = refusal_of(overrides);
    EXPECT_NE(error.find("MACHINE.CUDA_GRAPH"), std::string::npos) << error;
    EXPECT_NE(error.find(obstacle), std::string::npos) << obstacle << " in: " << error;
  }
  // MACHINE.DEVICE gpu: captured on a GPU; without one the run falls back to the CPU
  // (warned), and the graph with it.
  std::vector<std::string> on_gpu = capturable;
  on_gpu.push_back("MACHINE.DEVICE=gpu");
  EXPECT_EQ(
      resolve_run(synthetic_job_config(test_dir_for("cuda_graph"), on_gpu)).cuda_graph,
      torch::cuda::is_available());
}

} // namespace
} // namespace largo::train::trainer_cuda_graph_test
