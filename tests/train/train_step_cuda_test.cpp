// TrainStep on a GPU without a sync every step (TrainStepOptions::sync_every_step = false):
// its steps queue their work without the host waiting for the device once (c10's sync debug
// mode turns any wait into an error), and equal the steps that read every loss, bit for bit;
// an inf/NaN is found at the read. Also: the check catches a host read, so it can fail.
// Skipped without a GPU (scripts/gpu_check.sh runs them).
#include <largo/train/train_step.h>

#include "parallel/parallelize_test_util.h"
#include "train/host_sync_check.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace largo::train::train_step_cuda_test {
namespace {

using largo::testing::HostSyncCheck;
using parallel::testing::groups_of;
using parallel::testing::sgd_momentum;

constexpr int64_t kInputs = 12;
constexpr int64_t kClasses = 5;
constexpr int64_t kBatch = 8;
constexpr int kSteps = 4;
constexpr int kMicroSteps = 2;

bool skip() {
  return !torch::cuda::is_available() || !HostSyncCheck::available();
}

struct NetImpl : torch::nn::Module {
  NetImpl()
      : hidden(register_module("hidden", torch::nn::Linear(kInputs, 16))),
        head(register_module("head", torch::nn::Linear(16, kClasses))) {}
  at::Tensor forward(at::Tensor x) {
    return head(torch::relu(hidden(x)));
  }
  torch::nn::Linear hidden, head;
};
TORCH_MODULE(Net);

std::unique_ptr<parallel::ParallelModel> make_model() {
  torch::manual_seed(5);
  Net net;
  net->to(torch::kCUDA);
  return parallel::parallelize(
      net,
      groups_of(*net),
      sgd_momentum(),
      comm::ProcessGroup::single_process(),
      parallel::ParallelOptions());
}

// kSteps x kMicroSteps batches, made on the device before the steps run.
std::vector<data::Batch> make_batches(float poison = 0.0f) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  std::vector<data::Batch> batches;
  for (int i = 0; i < kSteps * kMicroSteps; ++i) {
    data::Batch batch;
    batch.images = at::randn({kBatch, kInputs}, generator).to(torch::kCUDA);
    batch.labels = at::randint(0, kClasses, {kBatch}, generator).to(torch::kCUDA);
    batches.push_back(std::move(batch));
  }
  if (poison != 0.0f) {
    batches.front().images.view({-1})[0].fill_(poison);
  }
  return batches;
}

// kSteps steps; the unsynced ones under HostSyncCheck, their results read after.
std::vector<StepResult>
run_steps(parallel::ParallelModel& model, std::vector<data::Batch> batches, bool sync_every_step) {
  TrainStepOptions options;
  options.sync_every_step = sync_every_step;
  TrainStep step(model, torch::kCUDA, options);
  size_t next = 0;
  auto next_batch = [&] { return batches.at(next++); };
  std::vector<StepResult> results;
  {
    std::optional<HostSyncCheck> check;
    if (!sync_every_step) {
      check.emplace();
    }
    for (int i = 0; i < kSteps; ++i) {
      results.push_back(step.run(next_batch, kMicroSteps));
    }
  }
  read_step_results(results);
  return results;
}

TEST(TrainStepCudaTest, StepsWithoutAHostSyncEqualTheStepsThatReadEveryLoss) {
  if (skip()) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto synced_model = make_model();
  auto unsynced_model = make_model();
  const auto synced = run_steps(*synced_model, make_batches(), true);
  std::vector<StepResult> unsynced;
  ASSERT_NO_THROW(unsynced = run_steps(*unsynced_model, make_batches(), false))
      << "a step waited for the device";
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_FALSE(unsynced[i].unread.has_value());
    EXPECT_EQ(unsynced[i].loss, synced[i].loss) << "step " << i;
    EXPECT_TRUE(unsynced[i].finite);
  }
  const auto expected = synced_model->full_parameters();
  const auto actual = unsynced_model->full_parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(actual[i].second.equal(expected[i].second)) << expected[i].first;
  }
}

TEST(TrainStepCudaTest, TheCheckCatchesAHostRead) {
  if (skip()) {
    GTEST_SKIP() << "no CUDA device";
  }
  const at::Tensor value = at::ones({1}, at::TensorOptions().device(torch::kCUDA));
  HostSyncCheck check;
  EXPECT_THROW(value.item<float>(), c10::Error);
}

TEST(TrainStepCudaTest, AnInfOrNanIsFoundAtTheRead) {
  if (skip()) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto model = make_model();
  const auto results =
      run_steps(*model, make_batches(std::numeric_limits<float>::quiet_NaN()), false);
  EXPECT_FALSE(results.front().finite);
  EXPECT_TRUE(std::isnan(results.front().non_finite_loss));
}

} // namespace
} // namespace largo::train::train_step_cuda_test
