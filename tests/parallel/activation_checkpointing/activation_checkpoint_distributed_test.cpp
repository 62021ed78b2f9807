// Activation checkpointing composed with data parallelism on 2 ranks (Gloo on 127.0.0.1):
// DDP (overlapped buckets, delay_allreduce, MANUAL_GRADIENT_REDUCTION, gradient accumulation
// with no_sync) and ZeRO stages 1 and 2, each trained with the trunk checkpointed and without,
// from the same seeds on the same data: the small CNN (BatchNorm in every block) and a small
// ViT (dropout and attention dropout in every block, so the checkpointed segments must
// replay each rank's dropout masks in the recompute). Checkpointing changes no number, so the reduced
// gradients of every step and the parameters and BatchNorm statistics after training must be
// bit for bit the same. Every parameter's grad-accumulator post-hook (what DDP's buckets and
// ZeRO-2's reduce-to-owner are driven by) must fire exactly once per backward; an extra
// counting hook checks that directly (DDP and ZeRO-2 would also throw on a second firing).
#include <largo/core/rng_state.h>
#include <largo/models/model_factory.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>
#include <largo/parallel/activation_checkpointing/checkpointed_trunk.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/data_parallel/grad_ready_hooks.h>
#include <largo/parallel/data_parallel/sharded_data_parallel.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>

#include <fmt/ranges.h>

#include "comm/distributed_test_util.h"

namespace largo::parallel::activation_checkpoint_distributed_test {
namespace {

using largo::testing::run_on_ranks;

constexpr int64_t kGlobalBatch = 16;
constexpr int kSteps = 4;

enum class Mode { kDdp, kDdpDelayed, kDdpManual, kZero1, kZero2 };
enum class Model { kSmallCnn, kVit };

std::string name_of(Mode mode) {
  switch (mode) {
    case Mode::kDdp:
      return "ddp";
    case Mode::kDdpDelayed:
      return "ddp_delay_allreduce";
    case Mode::kDdpManual:
      return "ddp_manual_gradient_reduction";
    case Mode::kZero1:
      return "zero1";
    case Mode::kZero2:
      return "zero2";
  }
  return "?";
}

// The small CNN with BatchNorm in every block and dropout in the last: 4 trunk blocks. The
// ViT: patch embedding, 3 layers with dropout and attention dropout, final norm: 5 blocks.
models::TrunkHeadModel make_model(Model which) {
  models::ModelOptions options;
  options.in_channels = 3;
  options.image_size = 16;
  if (which == Model::kSmallCnn) {
    options.trunk_name = "small_cnn";
    options.small_cnn.channels = {8, 16, 16, 32};
    options.small_cnn.dropout = 0.5;
  } else {
    options.trunk_name = "vision_transformer";
    options.vit.patch_size = 4;
    options.vit.num_layers = 3;
    options.vit.num_heads = 4;
    options.vit.hidden_dim = 32;
    options.vit.mlp_dim = 64;
    options.vit.dropout = 0.2;
    options.vit.attention_dropout = 0.2;
  }
  seed_everything(7);
  return models::build_model(options);
}

// Segments 1 and 2 checkpointed; for the ViT both hold dropout layers.
std::vector<int64_t> boundaries_of(Model which) {
  return which == Model::kSmallCnn ? std::vector<int64_t>{0, 1, 3, 4}
                                   : std::vector<int64_t>{0, 2, 4, 5};
}

std::string name_of(Model which) {
  return which == Model::kSmallCnn ? "small_cnn" : "vit";
}

enum class Checkpointing { kOff, kOn, kOnWithoutRngReplay };

// Rank r's rows of batch `step`.
std::pair<at::Tensor, at::Tensor> local_batch(int step, const comm::ProcessGroup& group) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(300 + step);
  at::Tensor images = at::randn({kGlobalBatch, 3, 16, 16}, generator);
  at::Tensor labels = at::randint(0, 10, {kGlobalBatch}, generator);
  const int64_t per_rank = kGlobalBatch / group.world_size();
  return {images.narrow(0, group.rank() * per_rank, per_rank),
          labels.narrow(0, group.rank() * per_rank, per_rank)};
}

std::vector<optim::ParamGroup> groups_of(const torch::nn::Module& model) {
  optim::ParamGroupOptions options;
  options.lr = 0.05;
  options.weight_decay = 1e-4;
  return optim::build_param_groups(model, options);
}

std::unique_ptr<optim::Optimizer> make_sgd(std::vector<optim::ParamGroup> groups) {
  optim::SGDOptions sgd;
  sgd.momentum = 0.9;
  return std::make_unique<optim::SGD>(std::move(groups), sgd);
}

std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

struct TrainResult {
  at::Tensor gradients; // every step's reduced gradients (what the optimizer reads), flattened
  at::Tensor state;     // every parameter and buffer after the last step, flattened
  // One message per parameter and backward in which its grad-accumulator post-hook did not
  // fire exactly once (none expected).
  std::vector<std::string> hook_count_errors;
  int num_backwards = 0;
};

at::Tensor flat_double(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const auto& tensor : tensors) {
    flat.push_back(tensor.detach().reshape({-1}).to(at::kDouble));
  }
  return at::cat(flat);
}

// Trains for kSteps.
TrainResult train(comm::ProcessGroup& group, Model which, Mode mode, Checkpointing checkpointing,
                  int accumulation) {
  models::TrunkHeadModel model = make_model(which);
  std::unique_ptr<optim::Optimizer> optimizer;
  if (mode == Mode::kZero1 || mode == Mode::kZero2) {
    ShardedOptimizerOptions options;
    options.make_base_optimizer = [](std::vector<optim::ParamGroup> groups) {
      return make_sgd(std::move(groups));
    };
    optimizer = std::make_unique<ShardedOptimizer>(groups_of(*model), borrow(group), options);
  } else {
    optimizer = make_sgd(groups_of(*model));
  }
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ShardedDataParallel> sdp;
  if (mode == Mode::kZero2) {
    ShardedDataParallelOptions options;
    options.reduce_buffer_bytes = 4096; // several buckets
    sdp = std::make_unique<ShardedDataParallel>(
        model.ptr(), static_cast<ShardedOptimizer&>(*optimizer), borrow(group), options);
  } else {
    DistributedDataParallelOptions options;
    options.first_bucket_cap_bytes = 2048; // several buckets, launched as gradients get ready
    options.bucket_cap_bytes = 8192;
    options.delay_allreduce = mode == Mode::kDdpDelayed;
    options.manual_reduction = mode == Mode::kDdpManual;
    ddp = std::make_unique<DistributedDataParallel>(model.ptr(), borrow(group), options);
  }
  // Counts each parameter's gradient arrivals with hooks of our own, registered after the
  // reducer's on the same grad accumulators.
  const std::vector<at::Tensor> parameters = model->parameters();
  std::vector<int> arrivals(parameters.size(), 0);
  GradReadyHooks counting_hooks(
      parameters, [&arrivals](size_t index) { ++arrivals[index]; }, [] {});
  TrainResult result;
  std::vector<at::Tensor> step_gradients;
  std::optional<CheckpointedTrunk> trunk;
  if (checkpointing != Checkpointing::kOff) {
    trunk.emplace(model, boundaries_of(which),
                  /*preserve_rng_state=*/checkpointing == Checkpointing::kOn);
  }
  seed_everything(100 + static_cast<uint64_t>(group.rank())); // per-rank dropout streams
  model->train();
  for (int step = 0; step < kSteps; ++step) {
    auto [images, labels] = local_batch(step, group);
    optimizer->zero_grad();
    const int64_t micro = images.size(0) / accumulation;
    for (int k = 0; k < accumulation; ++k) {
      at::Tensor x = images.narrow(0, k * micro, micro);
      at::Tensor y = labels.narrow(0, k * micro, micro);
      std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
      if (ddp && k + 1 < accumulation) {
        no_sync.emplace(*ddp);
      }
      if (ddp) {
        ddp->before_forward();
      } else {
        sdp->before_forward();
      }
      at::Tensor logits = trunk ? trunk->forward(x) : model->forward(x);
      (torch::nn::functional::cross_entropy(logits, y) / accumulation).backward();
      ++result.num_backwards;
      for (size_t i = 0; i < arrivals.size(); ++i) {
        if (arrivals[i] != 1) {
          result.hook_count_errors.push_back(fmt::format(
              "step {} micro-batch {}: parameter {} got its gradient {} times", step, k, i,
              arrivals[i]));
        }
        arrivals[i] = 0;
      }
    }
    if (mode == Mode::kDdpManual) {
      ddp->reduce_gradients();
    }
    if (mode == Mode::kZero2) {
      // Stage 2 keeps only this rank's reduced shard of the gradients.
      step_gradients.push_back(
          flat_double(static_cast<ShardedOptimizer&>(*optimizer).shard_gradients()));
    } else {
      std::vector<at::Tensor> grads;
      for (const auto& parameter : parameters) {
        grads.push_back(parameter.grad());
      }
      step_gradients.push_back(flat_double(grads));
    }
    optimizer->step();
  }
  result.gradients = at::cat(step_gradients);
  std::vector<at::Tensor> state = model->parameters();
  for (const auto& buffer : model->buffers()) {
    state.push_back(buffer);
  }
  result.state = flat_double(state);
  return result;
}

class CheckpointingUnderDataParallelTest
    : public ::testing::TestWithParam<std::tuple<Model, Mode, int>> {};

TEST_P(CheckpointingUnderDataParallelTest, EqualsTheSameRunWithoutCheckpointing) {
  const auto [which, mode, accumulation] = GetParam();
  run_on_ranks(2, [which = which, mode = mode,
                   accumulation = accumulation](comm::ProcessGroup& group) {
    const TrainResult plain = train(group, which, mode, Checkpointing::kOff, accumulation);
    const TrainResult checkpointed = train(group, which, mode, Checkpointing::kOn, accumulation);
    EXPECT_EQ(checkpointed.num_backwards, kSteps * accumulation);
    EXPECT_TRUE(plain.hook_count_errors.empty()) << fmt::format(
        "{} without checkpointing: {}", name_of(mode), fmt::join(plain.hook_count_errors, "; "));
    EXPECT_TRUE(checkpointed.hook_count_errors.empty())
        << fmt::format("{} with checkpointing: {}", name_of(mode),
                       fmt::join(checkpointed.hook_count_errors, "; "));
    // The gradients are not all zero (the comparison below would be vacuous otherwise).
    EXPECT_GT(plain.gradients.abs().sum().item<double>(), 0.0);
    ASSERT_EQ(checkpointed.gradients.numel(), plain.gradients.numel());
    EXPECT_TRUE(checkpointed.gradients.equal(plain.gradients))
        << name_of(mode) << " gradients on rank " << group.rank() << ": max difference "
        << (checkpointed.gradients - plain.gradients).abs().max().item<double>();
    EXPECT_TRUE(checkpointed.state.equal(plain.state))
        << name_of(mode) << " parameters/buffers on rank " << group.rank()
        << ": max difference " << (checkpointed.state - plain.state).abs().max().item<double>();
    if (which == Model::kVit) {
      // The control: without replaying the forward's RNG state the recompute draws other
      // dropout masks, and the gradients differ, so the equality above is not vacuous.
      const TrainResult unreplayed =
          train(group, which, mode, Checkpointing::kOnWithoutRngReplay, accumulation);
      EXPECT_FALSE(unreplayed.gradients.equal(plain.gradients)) << name_of(mode);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Modes,
    CheckpointingUnderDataParallelTest,
    ::testing::Values(
        std::make_tuple(Model::kSmallCnn, Mode::kDdp, 1),
        std::make_tuple(Model::kSmallCnn, Mode::kDdp, 2),
        std::make_tuple(Model::kSmallCnn, Mode::kDdpDelayed, 1),
        std::make_tuple(Model::kSmallCnn, Mode::kDdpManual, 1),
        std::make_tuple(Model::kSmallCnn, Mode::kZero1, 1),
        std::make_tuple(Model::kSmallCnn, Mode::kZero2, 1),
        std::make_tuple(Model::kSmallCnn, Mode::kZero2, 2),
        std::make_tuple(Model::kVit, Mode::kDdp, 2),
        std::make_tuple(Model::kVit, Mode::kZero2, 1)),
    [](const auto& info) {
      return fmt::format("{}_{}_accumulate{}", name_of(std::get<0>(info.param)),
                         name_of(std::get<1>(info.param)), std::get<2>(info.param));
    });

} // namespace
} // namespace largo::parallel::activation_checkpoint_distributed_test
