// DistributedDataParallel on 2 ranks (Gloo over 127.0.0.1) against a single process
// trained on the same global batch, which each rank also runs locally as the reference.
#include <largo/core/channels_last.h>
#include <largo/core/error.h>
#include <largo/models/channels_last_module.h>
#include <largo/models/model_factory.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>

#include "comm/distributed_test_util.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace largo::parallel::distributed_data_parallel_test {
namespace {

using largo::testing::run_on_ranks;

constexpr int64_t kGlobalBatch = 16;
constexpr int kSteps = 20;

// A conv net without BatchNorm (per-rank batch statistics would differ from the global
// batch's) followed by an MLP: convolutions, linear layers and several buckets.
torch::nn::Sequential make_net() {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)), torch::nn::ReLU(),
      torch::nn::MaxPool2d(2), torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).padding(1)),
      torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(8 * 4 * 4, 32), torch::nn::ReLU(),
      torch::nn::Linear(32, 10));
}

// Batch `step` of the global data stream: images [16, 3, 8, 8], labels [16].
std::pair<at::Tensor, at::Tensor> global_batch(int step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor images = at::randn({kGlobalBatch, 3, 8, 8}, generator);
  at::Tensor labels = at::randint(0, 10, {kGlobalBatch}, generator);
  return {images, labels};
}

std::unique_ptr<optim::SGD> make_sgd(const torch::nn::Module& net) {
  optim::ParamGroupOptions groups;
  groups.lr = 0.05;
  groups.weight_decay = 1e-4;
  optim::SGDOptions sgd;
  sgd.momentum = 0.9;
  return std::make_unique<optim::SGD>(optim::build_param_groups(net, groups), sgd);
}

at::Tensor flat_parameters(const torch::nn::Module& net) {
  std::vector<at::Tensor> flat;
  for (const auto& p : net.parameters()) {
    flat.push_back(p.detach().reshape({-1}));
  }
  return at::cat(flat);
}

// Trains `net` for kSteps on the full global batch in this process: the reference.
at::Tensor train_single_process(torch::nn::Sequential net) {
  auto sgd = make_sgd(*net);
  for (int step = 0; step < kSteps; ++step) {
    auto [images, labels] = global_batch(step);
    sgd->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(images), labels).backward();
    sgd->step();
  }
  return flat_parameters(*net);
}

// Rank r's part of batch `step`: rows [r * B/W, (r+1) * B/W).
std::pair<at::Tensor, at::Tensor> local_batch(int step, const comm::ProcessGroup& group) {
  auto [images, labels] = global_batch(step);
  const int64_t per_rank = kGlobalBatch / group.world_size();
  return {images.narrow(0, group.rank() * per_rank, per_rank),
          labels.narrow(0, group.rank() * per_rank, per_rank)};
}

// Trains with DDP in the given mode; the same initial weights on every rank come from the
// constructor's broadcast (each rank initializes differently on purpose).
at::Tensor train_ddp(comm::ProcessGroup& group, std::shared_ptr<comm::ProcessGroup> shared_group,
                     DistributedDataParallelOptions options, torch::nn::Sequential net,
                     int accumulation_steps = 1) {
  DistributedDataParallel ddp(net.ptr(), shared_group, options);
  auto sgd = make_sgd(*net);
  for (int step = 0; step < kSteps; ++step) {
    auto [images, labels] = local_batch(step, group);
    sgd->zero_grad();
    const int64_t micro = images.size(0) / accumulation_steps;
    for (int k = 0; k < accumulation_steps; ++k) {
      auto micro_images = images.narrow(0, k * micro, micro);
      auto micro_labels = labels.narrow(0, k * micro, micro);
      auto backward = [&] {
        at::Tensor loss = torch::nn::functional::cross_entropy(ddp.forward(net, micro_images),
                                                               micro_labels);
        (loss / accumulation_steps).backward();
      };
      if (k + 1 < accumulation_steps) {
        auto guard = ddp.no_sync();
        backward();
      } else {
        backward();
      }
    }
    if (options.manual_reduction) {
      ddp.reduce_gradients();
    }
    sgd->step();
  }
  return flat_parameters(*net);
}

// Every rank runs the reference on the global batch from the same seed as rank 0's model.
torch::nn::Sequential seeded_net(uint64_t seed) {
  torch::manual_seed(seed);
  return make_net();
}

std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

TEST(DistributedDataParallelTest, TwoRanksEqualOneProcessOnTheGlobalBatch) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    at::Tensor reference = train_single_process(seeded_net(7));
    // Ranks other than 0 start from different weights; the broadcast must fix that.
    torch::nn::Sequential net = seeded_net(group.rank() == 0 ? 7 : 99);
    DistributedDataParallelOptions options;
    options.first_bucket_cap_bytes = 2048; // several buckets, so overlap and ordering are exercised
    options.bucket_cap_bytes = 4096;
    at::Tensor trained = train_ddp(group, borrow(group), options, net);
    // fp32: the 2-rank sum of half-batch mean gradients differs from the full-batch mean
    // only by rounding, which 20 steps of SGD keep within 1e-5.
    EXPECT_TRUE(at::allclose(trained, reference, /*rtol=*/0, /*atol=*/1e-5))
        << "max difference " << (trained - reference).abs().max().item<float>();
    // And the two ranks agree exactly with each other.
    at::Tensor other = trained.clone();
    group.broadcast(other, 0);
    EXPECT_TRUE(other.equal(trained));
  });
}

// A channels-last net (models/channels_last_module.h): the bucket views take each weight's
// strides, so the gradients autograd accumulates keep the layout (as PyTorch's DDP does), and
// 2 ranks still train as the one channels-last process on the global batch.
TEST(DistributedDataParallelTest, AChannelsLastNetKeepsItsGradientLayoutInTheBuckets) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::nn::Sequential single = seeded_net(7);
    models::convert_to_channels_last(*single);
    at::Tensor reference = train_single_process(single);
    torch::nn::Sequential net = seeded_net(group.rank() == 0 ? 7 : 99);
    models::convert_to_channels_last(*net);
    DistributedDataParallelOptions options;
    options.first_bucket_cap_bytes = 2048;
    options.bucket_cap_bytes = 4096;
    at::Tensor trained = train_ddp(group, borrow(group), options, net);
    for (const auto& item : net->named_parameters()) {
      const at::Tensor& weight = item.value();
      ASSERT_TRUE(weight.grad().defined()) << item.key();
      EXPECT_EQ(weight.grad().strides(), weight.strides()) << item.key();
      if (weight.dim() == 4) {
        EXPECT_TRUE(has_channels_last_strides(weight)) << item.key();
      }
    }
    // As TwoRanksEqualOneProcessOnTheGlobalBatch: the split batch changes only the rounding.
    EXPECT_TRUE(at::allclose(trained, reference, /*rtol=*/0, /*atol=*/1e-5))
        << "max difference " << (trained - reference).abs().max().item<float>();
  });
}

TEST(DistributedDataParallelTest, DelayAllreduceAndManualReductionEqualTheOverlappedPath) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    DistributedDataParallelOptions overlapped;
    overlapped.first_bucket_cap_bytes = 2048;
    overlapped.bucket_cap_bytes = 4096;
    at::Tensor expected = train_ddp(group, borrow(group), overlapped, seeded_net(3));
    DistributedDataParallelOptions delayed = overlapped;
    delayed.delay_allreduce = true;
    DistributedDataParallelOptions manual = overlapped;
    manual.manual_reduction = true;
    // Same buckets, same division, same sums: bit-identical.
    EXPECT_TRUE(train_ddp(group, borrow(group), delayed, seeded_net(3)).equal(expected));
    EXPECT_TRUE(train_ddp(group, borrow(group), manual, seeded_net(3)).equal(expected));
  });
}

TEST(DistributedDataParallelTest, GradientAccumulationEqualsTheLargerBatch) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    // 4 micro-batches of 2 per rank (no_sync for the first 3) against one batch of 8 per rank:
    // the same mean gradient, up to rounding.
    at::Tensor reference = train_single_process(seeded_net(5));
    at::Tensor accumulated = train_ddp(group, borrow(group), {}, seeded_net(5), 4);
    EXPECT_TRUE(at::allclose(accumulated, reference, 0, 1e-5))
        << "max difference " << (accumulated - reference).abs().max().item<float>();
  });
}

TEST(DistributedDataParallelTest, NoSyncCommunicatesNothing) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::nn::Sequential net = seeded_net(11);
    DistributedDataParallel ddp(net.ptr(), borrow(group));
    auto [images, labels] = local_batch(0, group);
    {
      auto guard = ddp.no_sync();
      torch::nn::functional::cross_entropy(ddp.forward(net, images), labels).backward();
    }
    // The ranks saw different data and nothing was reduced: their gradients differ.
    at::Tensor grad = net->parameters().front().grad().clone();
    at::Tensor rank0_grad = grad.clone();
    group.broadcast(rank0_grad, 0);
    if (group.rank() == 1) {
      EXPECT_FALSE(rank0_grad.equal(grad));
    }
  });
}

// A model whose second branch is used only when asked: some parameters get no gradient.
struct TwoBranchImpl : torch::nn::Module {
  TwoBranchImpl() {
    used = register_module("used", torch::nn::Linear(4, 2));
    unused = register_module("unused", torch::nn::Linear(4, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    return used->forward(x);
  }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};
TORCH_MODULE(TwoBranch);

TEST(DistributedDataParallelTest, UnusedParametersAreNamedOrHandled) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::manual_seed(0);
    TwoBranch strict_model;
    DistributedDataParallel strict(strict_model.ptr(), borrow(group));
    at::Tensor x = at::ones({3, 4});
    try {
      strict.forward(strict_model, x).sum().backward();
      ADD_FAILURE() << "expected a TrainingError for the unused parameters";
    } catch (const TrainingError& e) {
      EXPECT_NE(std::string(e.what()).find("unused.weight"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos);
    }

    TwoBranch lenient_model;
    DistributedDataParallelOptions options;
    options.find_unused_parameters = true;
    DistributedDataParallel lenient(lenient_model.ptr(), borrow(group), options);
    for (int step = 0; step < 2; ++step) { // twice: the state resets between backwards
      lenient.zero_grad();
      (lenient.forward(lenient_model, x * (group.rank() + 1))).sum().backward();
      // The used branch's gradient is the average over ranks: x * 1 and x * 2 -> 1.5 * 3 rows.
      EXPECT_TRUE(lenient_model->used->weight.grad().equal(at::full({2, 4}, 4.5f)));
      EXPECT_TRUE(lenient_model->unused->weight.grad().equal(at::zeros({2, 4})));
    }
  });
}

TEST(DistributedDataParallelTest, BroadcastsBuffersFromRankZeroBeforeEachForward) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::manual_seed(0);
    torch::nn::Sequential net(torch::nn::Linear(4, 4), torch::nn::BatchNorm1d(4));
    DistributedDataParallel ddp(net.ptr(), borrow(group));
    auto* bn = net->ptr(1)->as<torch::nn::BatchNorm1d>();
    for (int step = 0; step < 3; ++step) {
      // Each rank sees different data, so each updates its running stats differently...
      at::Tensor x = at::randn({8, 4}) + group.rank() * 10.0;
      ddp.forward(net, x).sum().backward();
    }
    // ...but each forward starts from rank 0's statistics: after one more broadcast they agree.
    ddp.before_forward();
    at::Tensor mean = bn->running_mean.clone();
    at::Tensor rank0_mean = mean.clone();
    group.broadcast(rank0_mean, 0);
    EXPECT_TRUE(rank0_mean.equal(mean));
  });
}

// Counts the post-hook firings of each parameter's gradient accumulator.
class CountingHook : public torch::autograd::FunctionPostHook {
 public:
  explicit CountingHook(int* count) : count_(count) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ++*count_;
    return outputs;
  }

 private:
  int* count_;
};

TEST(DistributedDataParallelTest, BucketsCoverEveryParameterOnce) {
  torch::manual_seed(0);
  torch::nn::Sequential net = make_net();
  int64_t param_bytes = 0;
  for (const auto& p : net->parameters()) {
    param_bytes += p.numel() * 4;
  }
  DistributedDataParallelOptions options;
  options.first_bucket_cap_bytes = 1024;
  options.bucket_cap_bytes = 2048;
  DistributedDataParallel ddp(net.ptr(), comm::ProcessGroup::single_process(), options);
  EXPECT_GT(ddp.num_buckets(), 3);
  EXPECT_EQ(ddp.gradient_bucket_bytes(), param_bytes);

  std::vector<int> counts(net->parameters().size(), 0);
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (size_t i = 0; i < counts.size(); ++i) {
    accumulators.push_back(torch::autograd::impl::grad_accumulator(net->parameters()[i]));
    accumulators.back()->add_post_hook(std::make_unique<CountingHook>(&counts[i]));
  }
  auto [images, labels] = global_batch(0);
  torch::nn::functional::cross_entropy(ddp.forward(net, images), labels).backward();
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_EQ(counts[i], 1) << "parameter " << i;
    // Gradients are views of the buckets, not copies.
    EXPECT_TRUE(net->parameters()[i].grad().defined());
  }
}

TEST(DistributedDataParallelTest, RejectsNonPositiveBucketCap) {
  torch::nn::Sequential net = make_net();
  DistributedDataParallelOptions options;
  options.bucket_cap_bytes = 0;
  EXPECT_THROW(DistributedDataParallel(net.ptr(), comm::ProcessGroup::single_process(), options),
               ConfigError);
}

} // namespace
} // namespace largo::parallel::distributed_data_parallel_test
