// SyncBatchNorm: N ranks with SyncBatchNorm (under DistributedDataParallel, and under FSDP)
// train like one process with plain BatchNorm2d on the global batch: outputs, gradients,
// running statistics.
#include <largo/comm/process_group.h>
#include <largo/core/error.h>
#include <largo/models/model_factory.h>
#include <largo/models/swav_head.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/data_parallel/sync_batch_norm.h>
#include <largo/parallel/parallelize.h>
#include <largo/precision/autocast.h>

#include "comm/distributed_test_util.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::parallel::sync_batch_norm_test {
namespace {

using largo::testing::run_on_ranks;

constexpr int64_t kGlobalBatch = 12; // divisible by 2 and 3 ranks
constexpr int kSteps = 3;
constexpr double kLearningRate = 0.1;

std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

// A small CNN with two BatchNorm2d layers, one of them with a non-default momentum.
torch::nn::Sequential make_cnn() {
  torch::manual_seed(3);
  namespace nn = torch::nn;
  return nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1).bias(false)),
      nn::BatchNorm2d(4),
      nn::ReLU(),
      nn::Conv2d(nn::Conv2dOptions(4, 6, 3).stride(2).padding(1).bias(false)),
      nn::BatchNorm2d(nn::BatchNormOptions(6).momentum(0.3)),
      nn::ReLU(),
      nn::AdaptiveAvgPool2d(1),
      nn::Flatten(),
      nn::Linear(6, 5));
}

// Batch `step` of the global batch; rank r of `world` gets rows [r * B/W, (r+1) * B/W).
std::pair<at::Tensor, at::Tensor> batch(int step, int rank = 0, int world = 1) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + step);
  // A mean far from 0 and a spread of scales: statistics that cancel badly if computed
  // carelessly.
  at::Tensor images = at::randn({kGlobalBatch, 3, 8, 8}, generator) * 2.0 + 3.0;
  at::Tensor labels = at::randint(0, 5, {kGlobalBatch}, generator);
  const int64_t per_rank = kGlobalBatch / world;
  return {images.narrow(0, rank * per_rank, per_rank), labels.narrow(0, rank * per_rank, per_rank)};
}

void sgd_step(torch::nn::Module& net) {
  torch::NoGradGuard no_grad;
  for (auto& parameter : net.parameters()) {
    parameter.sub_(parameter.grad() * kLearningRate);
    parameter.mutable_grad().zero_();
  }
}

// The module's parameters, gradients and buffers after `kSteps` steps, by name.
struct Trained {
  std::map<std::string, at::Tensor> tensors;
};

Trained snapshot(const torch::nn::Module& net, const std::map<std::string, at::Tensor>& grads) {
  Trained trained;
  for (const auto& item : net.named_parameters()) {
    trained.tensors[item.key()] = item.value().detach().clone();
  }
  for (const auto& item : net.named_buffers()) {
    trained.tensors[item.key()] = item.value().clone();
  }
  for (const auto& [name, grad] : grads) {
    trained.tensors[name + ".grad"] = grad;
  }
  return trained;
}

std::map<std::string, at::Tensor> gradients(const torch::nn::Module& net) {
  std::map<std::string, at::Tensor> grads;
  for (const auto& item : net.named_parameters()) {
    grads[item.key()] = item.value().grad().clone();
  }
  return grads;
}

// One process, plain BatchNorm2d, the global batch.
Trained train_reference() {
  torch::nn::Sequential net = make_cnn();
  std::map<std::string, at::Tensor> grads;
  for (int step = 0; step < kSteps; ++step) {
    auto [images, labels] = batch(step);
    torch::nn::functional::cross_entropy(net->forward(images), labels).backward();
    grads = gradients(*net);
    sgd_step(*net);
  }
  return snapshot(*net, grads);
}

// float32: the synchronized and the single-process computations are the same sums in a
// different order. Each value here comes from reductions over at most 12 * 8 * 8 = 768
// terms of magnitude <~ 10, chained through ~6 layers and 3 SGD steps with lr 0.1; float32
// rounding (2^-24 = 6e-8 per operation) accumulated as a random walk over those reductions
// stays around 768^0.5 * 6e-8 * 10 = 1.7e-5 in the worst channel of the worst tensor only if
// every error lined up, and ~1e-6 in practice; 1e-5 relative to max(1, |value|) is the bound
// the issue asks for.
void expect_close(const Trained& actual, const Trained& expected) {
  ASSERT_EQ(actual.tensors.size(), expected.tensors.size());
  for (const auto& [name, want] : expected.tensors) {
    const at::Tensor& got = actual.tensors.at(name);
    ASSERT_EQ(got.sizes(), want.sizes()) << name;
    if (!want.is_floating_point()) {
      EXPECT_TRUE(got.equal(want)) << name; // num_batches_tracked
      continue;
    }
    const double scale = std::max(1.0, want.abs().max().item<double>());
    const double diff = (got - want).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * scale) << name << ": max difference " << diff;
  }
}

void train_synchronized(comm::ProcessGroup& group) {
  auto converted = convert_sync_batchnorm(make_cnn().ptr(), borrow(group));
  auto net = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(converted);
  ASSERT_TRUE(net);
  ASSERT_TRUE(net->ptr(1)->as<SyncBatchNormImpl>() != nullptr);
  DistributedDataParallel ddp(net, borrow(group));
  std::map<std::string, at::Tensor> grads;
  for (int step = 0; step < kSteps; ++step) {
    auto [images, labels] = batch(step, group.rank(), group.world_size());
    ddp.before_forward();
    torch::nn::functional::cross_entropy(net->forward(images), labels).backward();
    grads = gradients(*net);
    sgd_step(*net);
  }
  expect_close(snapshot(*net, grads), train_reference());
}

TEST(SyncBatchNormTest, TwoRanksTrainLikeOneProcessWithBatchNormOnTheGlobalBatch) {
  run_on_ranks(2, [](comm::ProcessGroup& group) { train_synchronized(group); });
}

// The CNN as a module with a tensor forward (a Sequential cannot be an AnyModule); its names
// gain the prefix "body.".
struct WrappedImpl : torch::nn::Module {
  explicit WrappedImpl(std::shared_ptr<torch::nn::SequentialImpl> cnn)
      : body(register_module("body", torch::nn::Sequential(std::move(cnn)))) {}
  at::Tensor forward(at::Tensor x) {
    return body->forward(x);
  }
  torch::nn::Sequential body;
};
TORCH_MODULE(Wrapped);

// Under FSDP (ZeRO-3, through parallelize()): the parameters and running statistics after
// kSteps SGD steps equal one process's with plain BatchNorm2d on the global batch, within the
// bound above (the gradients are reduce-scattered instead of all-reduced: another order of the
// same sums). FSDP's gradients are sharded, so only parameters and buffers are compared.
TEST(SyncBatchNormTest, UnderFsdpTwoRanksTrainLikeOneProcess) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto net = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
        convert_sync_batchnorm(make_cnn().ptr(), borrow(group)));
    ASSERT_TRUE(net);
    Wrapped wrapped(net);
    optim::ParamGroup all;
    for (const auto& item : wrapped->named_parameters()) {
      all.params.push_back(item.value());
      all.names.push_back(item.key());
    }
    all.lr = kLearningRate;
    all.name = "all";
    ParallelOptions options;
    options.data_parallelism = DataParallelism::kFsdp;
    auto model = parallelize(
        torch::nn::AnyModule(wrapped),
        {all},
        [](std::vector<optim::ParamGroup> groups) {
          return std::make_unique<optim::SGD>(std::move(groups), optim::SGDOptions{});
        },
        borrow(group),
        options);
    for (int step = 0; step < kSteps; ++step) {
      auto [images, labels] = batch(step, group.rank(), group.world_size());
      model->zero_grad();
      model->backward(torch::nn::functional::cross_entropy(model->forward(images), labels));
      ASSERT_TRUE(model->finish_backward());
      ASSERT_TRUE(model->step());
    }
    Trained trained;
    for (auto& [name, value] : model->full_parameters()) {
      trained.tensors[name.substr(std::string("body.").size())] = value;
    }
    for (const auto& item : net->named_buffers()) {
      trained.tensors[item.key()] = item.value().clone();
    }
    Trained expected = train_reference();
    for (auto it = expected.tensors.begin(); it != expected.tensors.end();) {
      const bool gradient =
          it->first.size() > 5 && it->first.substr(it->first.size() - 5) == ".grad";
      it = gradient ? expected.tensors.erase(it) : std::next(it);
    }
    expect_close(trained, expected);
  });
}

TEST(SyncBatchNormTest, ThreeRanksTrainLikeOneProcessWithBatchNormOnTheGlobalBatch) {
  run_on_ranks(3, [](comm::ProcessGroup& group) { train_synchronized(group); });
}

// Groups smaller than the world: with group_size 2 of 3 ranks, ranks {0, 1} normalize their
// batches together and rank 2 alone. Each rank's output and input gradient equal those of
// plain BatchNorm2d on its group's batches together, with the loss summed over the group.
TEST(SyncBatchNormTest, GroupsOfConsecutiveRanksSynchronizeWithinTheGroup) {
  run_on_ranks(3, [](comm::ProcessGroup& group) {
    const int rank = group.rank();
    const int first = rank < 2 ? 0 : 2;
    const int size = rank < 2 ? 2 : 1;
    auto options = torch::nn::BatchNormOptions(4).momentum(0.2);
    SyncBatchNorm sync(options, borrow(group), /*group_size=*/2);
    EXPECT_EQ(sync->group_first_rank(), first);
    EXPECT_EQ(sync->group_num_ranks(), size);

    auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
    at::Tensor all = at::randn({6, 4, 3, 3}, generator) + 1.5; // 2 samples per rank
    at::Tensor weights = at::randn({6, 4, 3, 3}, generator);   // the loss: sum(y * weights)
    at::Tensor x = all.narrow(0, 2 * rank, 2).clone().requires_grad_();
    at::Tensor y = sync->forward(x);
    (y * weights.narrow(0, 2 * rank, 2)).sum().backward();

    torch::nn::BatchNorm2d reference(options);
    at::Tensor group_x = all.narrow(0, 2 * first, 2 * size).clone().requires_grad_();
    at::Tensor group_y = reference->forward(group_x);
    (group_y * weights.narrow(0, 2 * first, 2 * size)).sum().backward();
    const int64_t offset = 2 * (rank - first);
    EXPECT_TRUE(at::allclose(y, group_y.narrow(0, offset, 2), 0, 1e-5));
    EXPECT_TRUE(at::allclose(x.grad(), group_x.grad().narrow(0, offset, 2), 0, 1e-5));
    EXPECT_TRUE(at::allclose(sync->running_mean, reference->running_mean, 0, 1e-6));
    EXPECT_TRUE(at::allclose(sync->running_var, reference->running_var, 0, 1e-6));
  });
}

// Activation checkpointing recomputes the segment in the backward: the SyncBatchNorm there
// all-reduces again (in the same order on every rank, between DDP's bucket reductions) and
// must reproduce the forward exactly; the running statistics are updated once.
TEST(SyncBatchNormTest, ActivationCheckpointingUnderDdpGivesTheSameStepBitForBit) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto train = [&](bool checkpointed) {
      auto net = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
          convert_sync_batchnorm(make_cnn().ptr(), borrow(group)));
      torch::nn::Sequential holder(net);
      DistributedDataParallel ddp(net, borrow(group));
      for (int step = 0; step < 2; ++step) {
        auto [images, labels] = batch(step, group.rank(), group.world_size());
        ddp.before_forward();
        at::Tensor logits = checkpointed ? checkpoint_sequential(holder, {0, 3, 6, 9}, images)
                                         : net->forward(images);
        torch::nn::functional::cross_entropy(logits, labels).backward();
        if (step == 0) {
          sgd_step(*net);
        }
      }
      return snapshot(*net, gradients(*net));
    };
    Trained plain = train(false);
    Trained checkpointed = train(true);
    for (const auto& [name, tensor] : plain.tensors) {
      EXPECT_TRUE(checkpointed.tensors.at(name).equal(tensor)) << name;
    }
    EXPECT_EQ(plain.tensors.at("1.num_batches_tracked").item<int64_t>(), 2);
  });
}

// Under CPU autocast the convolution's output is bfloat16: SyncBatchNorm normalizes it in
// float32 and returns bfloat16, like BatchNorm2d in float32 on the same values, rounded.
TEST(SyncBatchNormTest, NormalizesReducedPrecisionInputsInFloat32) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
    at::Tensor all = (at::randn({4, 3, 5, 5}, generator) * 3 + 2).to(at::kBFloat16);
    at::Tensor x = all.narrow(0, 2 * group.rank(), 2).clone().requires_grad_();
    SyncBatchNorm sync(torch::nn::BatchNormOptions(3), borrow(group));
    at::Tensor y;
    {
      precision::AutocastGuard autocast(c10::kCPU, at::kBFloat16);
      y = sync->forward(x);
    }
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    y.to(at::kFloat).sum().backward();
    EXPECT_EQ(sync->weight.grad().scalar_type(), at::kFloat);
    EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);

    torch::nn::BatchNorm2d reference(torch::nn::BatchNormOptions(3));
    at::Tensor expected = reference->forward(all.to(at::kFloat)).narrow(0, 2 * group.rank(), 2);
    // One rounding to bfloat16 (8 bits of mantissa): |error| <= 2^-8 |value|.
    at::Tensor error = (y.to(at::kFloat) - expected).abs();
    EXPECT_TRUE((error <= expected.abs() * (1.0 / 256) + 1e-6).all().item<bool>())
        << "max error " << error.max().item<float>();
    EXPECT_TRUE(at::allclose(sync->running_var, reference->running_var, 1e-5, 1e-6));
  });
}

TEST(SyncBatchNormTest, OneProcessIsBatchNorm2dExactly) {
  torch::manual_seed(0);
  torch::nn::BatchNorm2d plain(torch::nn::BatchNormOptions(3));
  SyncBatchNorm sync(torch::nn::BatchNormOptions(3), comm::ProcessGroup::single_process());
  at::Tensor x = at::randn({4, 3, 5, 5});
  EXPECT_TRUE(sync->forward(x).equal(plain->forward(x)));
  EXPECT_TRUE(sync->running_var.equal(plain->running_var));
  sync->eval();
  plain->eval();
  EXPECT_TRUE(sync->forward(x).equal(plain->forward(x)));
}

TEST(SyncBatchNormTest, ConvertSwapsEveryBatchNorm2dOfAResNetKeepingNamesAndState) {
  models::ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = 18;
  options.resnet.stem = "cifar";
  options.image_size = 8;
  torch::manual_seed(0);
  models::TrunkHeadModel model = models::build_model(options);
  model->eval();
  at::Tensor images = at::randn({2, 3, 8, 8});
  at::Tensor before = model->forward(images);
  std::map<std::string, const void*> storage;
  for (const auto& item : model->named_parameters()) {
    storage[item.key()] = item.value().data_ptr();
  }
  const size_t num_tensors = model->named_parameters().size() + model->named_buffers().size();

  auto root = convert_sync_batchnorm(model.ptr(), comm::ProcessGroup::single_process());
  EXPECT_EQ(root.get(), model.ptr().get()); // converted in place
  int64_t synced = 0;
  for (const auto& module : model->modules()) {
    EXPECT_FALSE(
        module->as<torch::nn::BatchNorm2dImpl>() != nullptr &&
        module->as<SyncBatchNormImpl>() == nullptr);
    synced += module->as<SyncBatchNormImpl>() != nullptr ? 1 : 0;
  }
  EXPECT_EQ(synced, 1 + 8 * 2 + 3); // stem, two per block, three projection shortcuts
  EXPECT_EQ(model->named_parameters().size() + model->named_buffers().size(), num_tensors);
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.value().data_ptr(), storage.at(item.key())) << item.key();
  }
  EXPECT_TRUE(model->forward(images).equal(before));
}

// A head's BatchNorm1d is converted too (VISSL's conversion covers every BatchNorm), inside a
// Sequential and inside a swav_head, keeping the function (one process: plain BatchNorm).
TEST(SyncBatchNormTest, ConvertSwapsTheBatchNorm1dOfHeads) {
  models::SwavHeadOptions options;
  options.dims = {8, 6, 4};
  options.use_bn = true;
  options.num_clusters = {5};
  torch::manual_seed(0);
  torch::nn::Sequential net(
      torch::nn::Linear(8, 8), torch::nn::BatchNorm1d(8), models::SwavHead(options));
  const at::Tensor features = at::randn({6, 8});
  auto outputs = [&] { return net->forward<std::vector<at::Tensor>>(features); };
  const std::vector<at::Tensor> before = outputs();
  const size_t num_tensors = net->named_parameters().size() + net->named_buffers().size();
  // A Sequential whose children change is rebuilt: the root returned is the one to run.
  net = torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(
      convert_sync_batchnorm(net.ptr(), comm::ProcessGroup::single_process())));
  ASSERT_TRUE(net);
  int64_t synced = 0;
  for (const auto& module : net->modules()) {
    EXPECT_EQ(module->as<torch::nn::BatchNorm1dImpl>(), nullptr) << "a BatchNorm1d is left";
    synced += module->as<SyncBatchNormImpl>() != nullptr ? 1 : 0;
  }
  EXPECT_EQ(synced, 2); // the Sequential's and the projection's
  EXPECT_EQ(net->named_parameters().size() + net->named_buffers().size(), num_tensors);
  const std::vector<at::Tensor> after = outputs();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_TRUE(at::allclose(after[i], before[i], 1e-6, 1e-6)) << "output " << i;
  }
}

// A module that calls its BatchNorm2d through a typed member cannot have it swapped: the
// error names the path instead of leaving the old layer running.
struct TypedMemberImpl : torch::nn::Module {
  TypedMemberImpl() : norm(register_module("norm", torch::nn::BatchNorm2d(2))) {}
  at::Tensor forward(at::Tensor x) {
    return norm(x);
  }
  torch::nn::BatchNorm2d norm;
};
TORCH_MODULE(TypedMember);

TEST(SyncBatchNormTest, ConvertNamesABatchNormItCannotSwap) {
  torch::nn::Sequential net(torch::nn::Conv2d(3, 2, 1), TypedMember());
  try {
    convert_sync_batchnorm(net.ptr(), comm::ProcessGroup::single_process());
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("1.norm"), std::string::npos) << error.what();
  }
}

TEST(SyncBatchNormTest, GroupSizeFollowsVissl) {
  EXPECT_EQ(sync_bn_group_size(-1, 4, 8), 4); // one machine
  EXPECT_EQ(sync_bn_group_size(0, 4, 8), 0);  // all ranks
  EXPECT_EQ(sync_bn_group_size(16, 4, 8), 8); // capped at the world
  EXPECT_EQ(sync_bn_group_size(2, 4, 8), 2);
  EXPECT_THROW(sync_bn_group_size(-2, 4, 8), ConfigError);
}

} // namespace
} // namespace largo::parallel::sync_batch_norm_test
