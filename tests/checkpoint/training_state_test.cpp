// checkpoint::TrainingState over parallelize()'s models: saving after 3 steps and resuming
// into a freshly parallelized model gives, bit for bit, the run that never stopped, in every
// mode (the optimizer state whole or in ZeRO shards, FSDP's model gathered and re-sharded),
// and the file is what the trainer and torch.load read.
#include <largo/checkpoint/run_directory.h>
#include <largo/checkpoint/training_state.h>
#include <largo/core/error.h>
#include <largo/optim/adamw.h>
#include <largo/optim/sgd.h>

#include "comm/distributed_test_util.h"

namespace largo::checkpoint::training_state_test {
namespace {

using largo::testing::run_on_ranks;
namespace fs = std::filesystem;

constexpr int64_t kGlobalBatch = 8;

// Shared by the ranks (separate processes); emptied by rank 0 first.
fs::path fresh_test_dir(comm::ProcessGroup& group) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::temp_directory_path() /
      (std::string("largo_training_state_") + info->name() + "_" + std::to_string(group.world_size()));
  if (group.rank() == 0) {
    fs::remove_all(dir);
  }
  group.barrier();
  return dir;
}

// A user's module: FSDP wraps each Linear of `layers` as a unit (the default policy).
struct NetImpl : torch::nn::Module {
  NetImpl()
      : layers(register_module("layers", torch::nn::Sequential(
                                             torch::nn::Linear(6, 10), torch::nn::ReLU(),
                                             torch::nn::Linear(10, 10), torch::nn::Tanh()))),
        head(register_module("head", torch::nn::Linear(10, 3))) {}
  at::Tensor forward(at::Tensor x) {
    return head(layers->forward(x));
  }
  torch::nn::Sequential layers;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

Net make_net(int rank) {
  torch::manual_seed(rank == 0 ? 11 : 12);
  return Net();
}

std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

std::unique_ptr<optim::Optimizer> make_adamw(std::vector<optim::ParamGroup> groups) {
  return std::make_unique<optim::AdamW>(std::move(groups));
}

std::unique_ptr<parallel::ParallelModel> parallelize(
    Net net,
    comm::ProcessGroup& group,
    parallel::DataParallelism mode,
    const parallel::OptimizerFactory& make_optimizer = make_adamw) {
  optim::ParamGroup all;
  for (const auto& item : net->named_parameters()) {
    all.params.push_back(item.value());
    all.names.push_back(item.key());
  }
  all.lr = 0.01;
  all.name = "all";
  parallel::ParallelOptions options;
  options.data_parallelism = mode;
  return parallel::parallelize(net, {all}, make_optimizer, borrow(group), options);
}

void train_steps(parallel::ParallelModel& model, TrainingProgress& progress, int steps) {
  comm::ProcessGroup& group = model.process_group();
  const int64_t per_rank = kGlobalBatch / group.world_size();
  for (int s = 0; s < steps; ++s) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(900 + progress.iteration);
    at::Tensor x = at::randn({kGlobalBatch, 6}, generator).narrow(0, group.rank() * per_rank, per_rank);
    at::Tensor y = at::randint(0, 3, {kGlobalBatch}, generator).narrow(0, group.rank() * per_rank, per_rank);
    model.zero_grad();
    model.backward(torch::nn::functional::cross_entropy(model.forward(x), y));
    ASSERT_TRUE(model.finish_backward());
    model.step();
    ++progress.iteration;
    ++progress.iteration_in_epoch;
  }
}

class TrainingStateTest : public ::testing::TestWithParam<parallel::DataParallelism> {};

TEST_P(TrainingStateTest, ResumeIsBitExact) {
  const parallel::DataParallelism mode = GetParam();
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    auto uninterrupted = parallelize(make_net(group.rank()), group, mode);
    TrainingState reference(*uninterrupted, {}, "", 0);
    reference.progress.iterations_per_epoch = 100;
    train_steps(*uninterrupted, reference.progress, 6);
    const auto expected = uninterrupted->full_parameters();

    const fs::path run_dir = fresh_test_dir(group);
    {
      auto first = parallelize(make_net(group.rank()), group, mode);
      TrainingState state(*first, {}, "config: {}", 0);
      state.progress.iterations_per_epoch = 100;
      train_steps(*first, state.progress, 3);
      state.save(run_dir, "model_iteration3.torch");
    }
    auto resumed = parallelize(make_net(group.rank() + 5), group, mode); // other weights
    TrainingState state(*resumed, {}, "", 0);
    state.progress.iterations_per_epoch = 100;
    const auto latest = latest_checkpoint(run_dir);
    ASSERT_TRUE(latest.has_value());
    ASSERT_TRUE(state.load(*latest));
    EXPECT_EQ(state.progress.iteration, 3);
    EXPECT_EQ(state.progress.iteration_in_epoch, 3);
    train_steps(*resumed, state.progress, 3);
    const auto actual = resumed->full_parameters();
    ASSERT_EQ(actual.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_TRUE(torch::equal(actual[i].second, expected[i].second)) << expected[i].first;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(EveryMode, TrainingStateTest,
                         ::testing::Values(parallel::DataParallelism::kDdp,
                                           parallel::DataParallelism::kZero2,
                                           parallel::DataParallelism::kFsdp),
                         [](const auto& info) {
                           return "zero" + std::to_string(parallel::zero_stage(info.param));
                         });

// Mid-epoch, the rest of the epoch can only be served with the saved layout.
TEST(TrainingStateTest, MidEpochResumeWithOtherIterationsPerEpochIsAClearError) {
  auto group = comm::ProcessGroup::single_process();
  const fs::path dir = fresh_test_dir(*group);
  auto model = parallelize(make_net(0), *group, parallel::DataParallelism::kDdp);
  TrainingState state(*model, {}, "", 0);
  state.progress.iterations_per_epoch = 10;
  train_steps(*model, state.progress, 2);
  state.save(dir, "model_iteration2.torch");
  TrainingState other(*model, {}, "", 0);
  other.progress.iterations_per_epoch = 20;
  try {
    other.load(dir / kLatestCheckpointName);
    FAIL() << "expected a CheckpointError";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find("10 iterations per epoch"), std::string::npos)
        << error.what();
  }
}

// A mid-epoch checkpoint of the stateful sampler read otherwise (here: another batch size, as
// another world size would) continues the epoch as a new stretch, recording what was read;
// that stretch's own checkpoint keeps it, and another training set is refused by name.
TEST(TrainingStateTest, MidEpochResumeReadingOtherwiseContinuesTheEpochAsANewStretch) {
  auto group = comm::ProcessGroup::single_process();
  const fs::path dir = fresh_test_dir(*group);
  auto model = parallelize(make_net(0), *group, parallel::DataParallelism::kDdp);
  const SamplerDescription batch4{"StatefulDistributedSampler", 4, 1, 48};
  TrainingState state(*model, batch4, "", 0);
  state.progress.iterations_per_epoch = 12;
  train_steps(*model, state.progress, 3);
  state.save(dir, "model_iteration3.torch");

  const SamplerDescription batch8{"StatefulDistributedSampler", 8, 1, 48};
  TrainingState continued(*model, batch8, "", 0);
  continued.progress.iterations_per_epoch = 6;
  ASSERT_TRUE(continued.load(dir / kLatestCheckpointName));
  ASSERT_EQ(continued.progress.earlier_stretches.size(), 1U);
  EXPECT_EQ(continued.progress.earlier_stretches[0].num_replicas, 1);
  EXPECT_EQ(continued.progress.earlier_stretches[0].samples_per_replica, 12);
  EXPECT_EQ(continued.progress.stretch_start_iteration, 3);

  // One step into the stretch, saved and loaded alike: the stretch is the saved one.
  train_steps(*model, continued.progress, 1);
  continued.save(dir, "model_iteration4.torch");
  TrainingState alike(*model, batch8, "", 0);
  alike.progress.iterations_per_epoch = 6;
  ASSERT_TRUE(alike.load(dir / kLatestCheckpointName));
  ASSERT_EQ(alike.progress.earlier_stretches.size(), 1U);
  EXPECT_EQ(alike.progress.earlier_stretches[0].samples_per_replica, 12);
  EXPECT_EQ(alike.progress.stretch_start_iteration, 3);
  EXPECT_EQ(alike.progress.iteration_in_epoch, 4);

  TrainingState other_data(
      *model, SamplerDescription{"StatefulDistributedSampler", 4, 1, 40}, "", 0);
  other_data.progress.iterations_per_epoch = 10;
  try {
    other_data.load(dir / "model_iteration3.torch");
    FAIL() << "expected a CheckpointError";
  } catch (const CheckpointError& error) {
    EXPECT_NE(
        std::string(error.what()).find("48 training samples and this one 40"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("DATA.TRAIN.DATA_SOURCES"), std::string::npos);
  }
}

// Another optimizer than the checkpoint's: the error names the file it is about.
TEST(TrainingStateTest, ResumingWithAnotherOptimizerNamesTheCheckpoint) {
  auto group = comm::ProcessGroup::single_process();
  const fs::path dir = fresh_test_dir(*group);
  auto model = parallelize(make_net(0), *group, parallel::DataParallelism::kDdp);
  TrainingState state(*model, {}, "", 0);
  train_steps(*model, state.progress, 1);
  state.save(dir, "model_iteration1.torch");
  auto make_sgd = [](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::SGD>(std::move(groups));
  };
  auto with_sgd = parallelize(make_net(0), *group, parallel::DataParallelism::kDdp, make_sgd);
  TrainingState other(*with_sgd, {}, "", 0);
  const fs::path file = dir / "model_iteration1.torch";
  try {
    other.load(file);
    FAIL() << "expected a CheckpointError";
  } catch (const CheckpointError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(file.string() + ": its optimizer state"), std::string::npos) << message;
    EXPECT_NE(message.find("'adamw' optimizer but this optimizer is 'sgd'"), std::string::npos)
        << message;
    // ...and the two ways on: the checkpoint's optimizer, or its weights in a new run.
    // (In the library's option names; the config layer says them in YAML keys, which
    // OptionKeys.AnOptimizerMismatchReadsInYamlKeys checks.)
    EXPECT_NE(
        message.find("set OptimizerSpec::name to the checkpoint's optimizer"), std::string::npos)
        << message;
    EXPECT_NE(message.find("a new run that loads only the checkpoint's weights"), std::string::npos)
        << message;
  }
}

} // namespace
} // namespace largo::checkpoint::training_state_test
