// CudaGraphStep on a GPU: 50 steps replayed from one capture (after 3 eager warm-up steps)
// equal 50 eager steps of the same TrainStep bit for bit (losses, parameters, momentum
// buffers), with a learning rate that changes every step (read from the device) and dropout
// (the CUDA generator's offsets advance with each replay); a batch of another shape is a clear
// error; an optimizer other than SGD is refused. Skipped without a GPU (scripts/gpu_check.sh
// runs them).
#include <largo/core/error.h>
#include <largo/optim/adamw.h>
#include <largo/train/cuda_graph_step.h>

#include "parallel/parallelize_test_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::train::cuda_graph_step_cuda_test {
namespace {

using parallel::testing::groups_of;
using parallel::testing::sgd_momentum;

constexpr int64_t kInputs = 12;
constexpr int64_t kClasses = 5;
constexpr int64_t kBatch = 8;
constexpr int kSteps = 50;
constexpr int kMicroSteps = 2;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : hidden(register_module("hidden", torch::nn::Linear(kInputs, 32))),
        dropout(register_module("dropout", torch::nn::Dropout(0.2))),
        head(register_module("head", torch::nn::Linear(32, kClasses))) {}
  at::Tensor forward(at::Tensor x) {
    return head(dropout(torch::relu(hidden(x))));
  }
  torch::nn::Linear hidden;
  torch::nn::Dropout dropout;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

std::unique_ptr<parallel::ParallelModel> make_model(parallel::OptimizerFactory optimizer) {
  torch::manual_seed(5);
  torch::cuda::manual_seed_all(5);
  Net net;
  net->to(torch::kCUDA);
  return parallel::parallelize(
      net,
      groups_of(*net),
      std::move(optimizer),
      comm::ProcessGroup::single_process(),
      parallel::ParallelOptions());
}

// Step `step`'s micro-batch `micro`, on the host as the loader delivers it.
data::Batch batch(int step, int micro, int64_t rows = kBatch) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + step * kMicroSteps + micro);
  data::Batch b;
  b.images = at::randn({rows, kInputs}, generator);
  b.labels = at::randint(0, kClasses, {rows}, generator);
  return b;
}

// The learning rate of step `step`: a different value every step.
double lr_at(int step) {
  return 0.05 * (1.0 + 0.5 * std::cos(0.3 * step));
}

// kSteps steps through `run`, the groups' lr set before each; the results read after.
template <typename Run>
std::vector<StepResult> train(parallel::ParallelModel& model, Run&& run) {
  std::vector<StepResult> results;
  for (int step = 0; step < kSteps; ++step) {
    for (optim::ParamGroup& group : model.optimizer().param_groups()) {
      group.lr = lr_at(step);
    }
    int micro = 0;
    results.push_back(run([&] { return batch(step, micro++); }));
  }
  read_step_results(results);
  return results;
}

TrainStepOptions unsynced() {
  TrainStepOptions options;
  options.sync_every_step = false;
  return options;
}

bool skip() {
  return !torch::cuda::is_available();
}

TEST(CudaGraphStepCudaTest, FiftyReplayedStepsEqualFiftyEagerStepsBitForBit) {
  if (skip()) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto eager_model = make_model(sgd_momentum());
  TrainStep eager_step(*eager_model, torch::kCUDA, unsynced());
  // The eager reference reads its learning rate from the device too (the same kernel).
  const auto eager = train(*eager_model, [&](const auto& next_batch) {
    for (optim::ParamGroup& group : eager_model->optimizer().param_groups()) {
      group.lr_on_device = at::full({}, group.lr, at::TensorOptions().device(torch::kCUDA));
    }
    return eager_step.run(next_batch, kMicroSteps);
  });

  auto graph_model = make_model(sgd_momentum());
  TrainStep captured_step(*graph_model, torch::kCUDA, unsynced());
  CudaGraphStep graph(captured_step, *graph_model, torch::kCUDA, /*warmup_steps=*/3);
  const auto replayed = train(
      *graph_model, [&](const auto& next_batch) { return graph.run(next_batch, kMicroSteps); });
  EXPECT_TRUE(graph.captured());

  for (int step = 0; step < kSteps; ++step) {
    EXPECT_EQ(replayed[step].loss, eager[step].loss) << "step " << step;
    EXPECT_TRUE(replayed[step].finite) << "step " << step;
  }
  const auto expected = eager_model->full_parameters();
  const auto actual = graph_model->full_parameters();
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(actual[i].second.equal(expected[i].second)) << expected[i].first;
  }
}

TEST(CudaGraphStepCudaTest, ABatchOfAnotherShapeIsAClearError) {
  if (skip()) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto model = make_model(sgd_momentum());
  TrainStep step(*model, torch::kCUDA, unsynced());
  CudaGraphStep graph(step, *model, torch::kCUDA, /*warmup_steps=*/1);
  for (int s = 0; s < 2; ++s) { // the warm-up, then the capture
    int micro = 0;
    graph.run([&] { return batch(s, micro++); }, kMicroSteps);
  }
  int micro = 0;
  try {
    graph.run([&] { return batch(2, micro++, kBatch - 3); }, kMicroSteps);
    FAIL() << "a smaller batch replayed";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("fixed shapes"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("5x12"), std::string::npos) << error.what();
  }
}

TEST(CudaGraphStepCudaTest, RefusesAnOptimizerOtherThanSgd) {
  if (skip()) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto model = make_model([](std::vector<optim::ParamGroup> groups) {
    return std::make_unique<optim::AdamW>(std::move(groups));
  });
  TrainStep step(*model, torch::kCUDA, unsynced());
  EXPECT_THROW(CudaGraphStep(step, *model, torch::kCUDA), OptionError);
}

} // namespace
} // namespace largo::train::cuda_graph_step_cuda_test
