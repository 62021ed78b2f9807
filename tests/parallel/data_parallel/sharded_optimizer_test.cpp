// ZeRO stages 1 and 2 against plain DDP on the same seed and data, in float64 (2 and 3 ranks,
// Gloo on 127.0.0.1); loss scaling over shards (one found_inf decision for all ranks); and the
// sharded optimizer state: consolidation into an unsharded state and resharding to another
// world size.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/optim/adamw.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/data_parallel/sharded_data_parallel.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>
#include <largo/precision/grad_scaler.h>

#include "comm/distributed_test_util.h"

namespace largo::parallel::sharded_optimizer_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

constexpr int64_t kGlobalBatch = 12;
constexpr int kSteps = 20;

// A conv net without BatchNorm, with a frozen first layer. It trains 168 + 330 + 970 + 99 =
// 1,567 parameters, a multiple of neither 2 nor 3, so the last shard is padded; the frozen
// layer must stay untouched and out of the flat buffers.
constexpr int64_t kTrainedParameters = 1567;
constexpr int64_t kClasses = 9;
torch::nn::Sequential make_net(uint64_t seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential net(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 3, 1)), // frozen
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 3).padding(1)), torch::nn::ReLU(),
      torch::nn::MaxPool2d(2), torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 6, 3).padding(1)),
      torch::nn::Tanh(), torch::nn::Flatten(), torch::nn::Linear(6 * 4 * 4, 10), torch::nn::ReLU(),
      torch::nn::Linear(10, kClasses));
  for (auto& p : net->ptr(0)->parameters()) {
    p.set_requires_grad(false);
  }
  net->to(torch::kDouble); // float64: see the tolerance in ZeroMatchesDdpTest
  return net;
}

std::pair<at::Tensor, at::Tensor> local_batch(int step, const comm::ProcessGroup& group) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  at::Tensor images = at::randn({kGlobalBatch, 3, 8, 8}, generator).to(at::kDouble);
  at::Tensor labels = at::randint(0, kClasses, {kGlobalBatch}, generator);
  const int64_t per_rank = kGlobalBatch / group.world_size();
  return {images.narrow(0, group.rank() * per_rank, per_rank),
          labels.narrow(0, group.rank() * per_rank, per_rank)};
}

std::vector<optim::ParamGroup> groups_of(const torch::nn::Module& net) {
  optim::ParamGroupOptions options;
  options.lr = 0.05;
  options.weight_decay = 1e-3;
  options.regularize_bias = false; // two groups: decayed weights, undecayed biases
  return optim::build_param_groups(net, options);
}

enum class Base { kSgd, kAdamW };

std::unique_ptr<optim::Optimizer> make_base(std::vector<optim::ParamGroup> groups, Base base) {
  if (base == Base::kSgd) {
    optim::SGDOptions sgd;
    sgd.momentum = 0.9;
    sgd.nesterov = true;
    return std::make_unique<optim::SGD>(std::move(groups), sgd);
  }
  return std::make_unique<optim::AdamW>(std::move(groups));
}

std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

at::Tensor flat_parameters(const torch::nn::Module& net) {
  std::vector<at::Tensor> flat;
  for (const auto& p : net.parameters()) {
    flat.push_back(p.detach().reshape({-1}));
  }
  return at::cat(flat);
}

struct TrainingRun {
  int stage = 0; // 0: DDP + base optimizer; 1: DDP + sharded optimizer; 2: SDP + sharded
  Base base = Base::kSgd;
  int accumulation_steps = 1;
  int64_t bucket_bytes = 1024; // small, so several buckets straddle shard boundaries
};

// Trains make_net(3) for kSteps and returns the final parameters (and the optimizer).
std::pair<at::Tensor, std::unique_ptr<optim::Optimizer>> train(comm::ProcessGroup& group,
                                                               const TrainingRun& run,
                                                               torch::nn::Sequential net) {
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<ShardedDataParallel> sdp;
  if (run.stage == 0) {
    optimizer = make_base(groups_of(*net), run.base);
  } else {
    ShardedOptimizerOptions options;
    options.make_base_optimizer = [&](std::vector<optim::ParamGroup> groups) {
      return make_base(std::move(groups), run.base);
    };
    optimizer = std::make_unique<ShardedOptimizer>(groups_of(*net), borrow(group), options);
  }
  if (run.stage == 2) {
    ShardedDataParallelOptions options;
    options.reduce_buffer_bytes = run.bucket_bytes;
    sdp = std::make_unique<ShardedDataParallel>(net.ptr(), static_cast<ShardedOptimizer&>(*optimizer),
                                                borrow(group), options);
  } else {
    DistributedDataParallelOptions options;
    options.first_bucket_cap_bytes = run.bucket_bytes;
    options.bucket_cap_bytes = run.bucket_bytes;
    ddp = std::make_unique<DistributedDataParallel>(net.ptr(), borrow(group), options);
  }
  for (int step = 0; step < kSteps; ++step) {
    auto [images, labels] = local_batch(step, group);
    optimizer->zero_grad();
    const int64_t micro = images.size(0) / run.accumulation_steps;
    for (int k = 0; k < run.accumulation_steps; ++k) {
      auto x = images.narrow(0, k * micro, micro);
      auto y = labels.narrow(0, k * micro, micro);
      std::optional<DistributedDataParallel::NoSyncGuard> no_sync;
      if (ddp && k + 1 < run.accumulation_steps) {
        no_sync.emplace(*ddp); // stage 2 reduces every micro-step into the shards instead
      }
      at::Tensor logits = ddp ? ddp->forward(net, x) : sdp->forward(net, x);
      (torch::nn::functional::cross_entropy(logits, y) / run.accumulation_steps).backward();
    }
    optimizer->step();
  }
  return {flat_parameters(*net), std::move(optimizer)};
}

class ZeroMatchesDdpTest : public ::testing::TestWithParam<std::tuple<int, Base, int, int>> {};

TEST_P(ZeroMatchesDdpTest, ParametersAfter20Steps) {
  const auto [stage, base, accumulation, world] = GetParam();
  run_on_ranks(world, [&](comm::ProcessGroup& group) {
    TrainingRun reference_run;
    reference_run.base = base;
    reference_run.accumulation_steps = accumulation;
    auto net = make_net(3);
    const at::Tensor frozen_before = net->ptr(0)->parameters()[0].clone();
    at::Tensor reference = train(group, reference_run, make_net(3)).first;
    TrainingRun sharded_run = reference_run;
    sharded_run.stage = stage;
    auto [sharded, optimizer] = train(group, sharded_run, net);
    // The shard-wise update is the same arithmetic as the full one; only the reduction may
    // round differently: ZeRO and DDP add the same k <= 6 partial gradients (ranks x
    // micro-batches) in another order, which changes each sum by at most 2 (k - 1) u sum|g_i|.
    // AdamW divides by sqrt(v), so an element whose partial gradients nearly cancel turns that
    // into a much larger change of its update, and 20 steps compound it. In float32
    // (u = 6e-8) that reached 1.05e-5 after 20 steps with the reference BLAS and 0.5e-5 with
    // OpenBLAS's AVX2 kernels: the size depends on which kernels round the gradients, so no
    // float32 tolerance both holds on every CPU and stays tight. Hence float64 (make_net,
    // local_batch): u = 1.1e-16, measured 2e-14, and the same amplification (1e-5 / 6e-8 =
    // ~2e2 u) stays below 1e-13; 1e-10 leaves a factor >= 1e3 on top. A sharding mistake (a
    // dropped or doubled micro-batch, a wrong shard offset) moves parameters by ~lr = 0.05.
    // (float32 ZeRO is compared with DDP in tests/train/trainer_zero_test.cpp.)
    EXPECT_TRUE(at::allclose(sharded, reference, 0, 1e-10))
        << "max difference " << (sharded - reference).abs().max().item<double>();
    EXPECT_TRUE(net->ptr(0)->parameters()[0].equal(frozen_before)) << "a frozen parameter moved";
    // Every rank holds the whole, identical model.
    at::Tensor rank0 = sharded.clone();
    group.broadcast(rank0, 0);
    EXPECT_TRUE(rank0.equal(sharded));
    // And only its share of the optimizer state.
    auto& zero = static_cast<ShardedOptimizer&>(*optimizer);
    const int64_t trained = kTrainedParameters;
    // float64 momentum; exp_avg + exp_avg_sq
    const int64_t per_element = (base == Base::kSgd ? 1 : 2) * int64_t{sizeof(double)};
    const int64_t shard = (trained + world - 1) / world;
    EXPECT_LE(zero.state_bytes(), shard * per_element + 64 * 8) << "state beyond this rank's shard";
    EXPECT_GE(zero.state_bytes(), (trained - shard * (world - 1)) * per_element);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Stages, ZeroMatchesDdpTest,
    ::testing::Values(std::make_tuple(1, Base::kSgd, 1, 2), std::make_tuple(1, Base::kAdamW, 1, 2),
                      std::make_tuple(1, Base::kSgd, 3, 2), std::make_tuple(2, Base::kSgd, 1, 2),
                      std::make_tuple(2, Base::kAdamW, 1, 2), std::make_tuple(2, Base::kSgd, 3, 2),
                      std::make_tuple(2, Base::kAdamW, 2, 3)),
    [](const auto& info) {
      return fmt::format("stage{}_{}_accumulate{}_world{}", std::get<0>(info.param),
                         std::get<1>(info.param) == Base::kSgd ? "sgd" : "adamw",
                         std::get<2>(info.param), std::get<3>(info.param));
    });

// The shards of a 2-rank run consolidate into exactly the state of the unsharded optimizer
// (stage 0, same data), and reshard into 3 ranks whose pieces hold the same values.
TEST(ShardedOptimizerStateTest, ConsolidatesToTheUnshardedStateAndReshards) {
  const fs::path dir = fs::temp_directory_path() / "largo_sharded_optimizer_state";
  if (largo::testing::is_parent()) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    TrainingRun run;
    run.stage = 1;
    run.base = Base::kAdamW;
    auto [params, optimizer] = train(group, run, make_net(3));
    auto shard = optimizer->state_dict().toGenericDict();
    checkpoint::save_checkpoint(dir / fmt::format("shard{}.torch", group.rank()), shard);
    if (group.rank() == 0) {
      TrainingRun unsharded = run;
      unsharded.stage = 0;
      auto reference = train(group, unsharded, make_net(3)).second->state_dict();
      checkpoint::save_checkpoint(dir / "reference.torch", reference.toGenericDict());
    } else {
      TrainingRun unsharded = run;
      unsharded.stage = 0;
      train(group, unsharded, make_net(3)); // the collectives of rank 0's reference run
    }
  });
  auto shard_file = [&](int rank) {
    return c10::IValue(checkpoint::load_checkpoint(dir / fmt::format("shard{}.torch", rank)));
  };
  std::map<std::string, std::vector<int64_t>> shapes;
  auto net = make_net(3);
  for (const auto& item : net->named_parameters()) {
    shapes[item.key()] = item.value().sizes().vec();
  }
  auto consolidated = consolidate_sharded_optimizer_state(2, shard_file, shapes).toGenericDict();
  auto reference = checkpoint::load_checkpoint(dir / "reference.torch");
  const auto reference_state = reference.at("state").toGenericDict();
  const auto consolidated_state = consolidated.at("state").toGenericDict();
  ASSERT_EQ(consolidated_state.size(), reference_state.size());
  for (const auto& item : reference_state) {
    const auto mine = consolidated_state.at(item.key()).toGenericDict();
    for (const auto& entry : item.value().toGenericDict()) {
      at::Tensor expected = entry.value().toTensor();
      at::Tensor actual = mine.at(entry.key()).toTensor();
      EXPECT_TRUE(at::allclose(actual, expected, 0, 1e-6))
          << item.key().toStringRef() << "." << entry.key().toStringRef();
    }
  }
  EXPECT_EQ(consolidated.at("param_groups").toList().size(),
            reference.at("param_groups").toList().size());

  // Loading the 2-rank shards into 3 ranks: each new piece equals the consolidated slice.
  run_on_ranks(3, [&](comm::ProcessGroup& group) {
    auto fresh = make_net(3);
    ShardedOptimizerOptions options;
    options.make_base_optimizer = [](std::vector<optim::ParamGroup> groups) {
      return make_base(std::move(groups), Base::kAdamW);
    };
    ShardedOptimizer optimizer(groups_of(*fresh), borrow(group), options);
    optimizer.load_resharded_state(2, shard_file);
    auto full = consolidate_sharded_optimizer_state(2, shard_file, shapes).toGenericDict();
    const auto full_state = full.at("state").toGenericDict();
    for (const auto& [name, range] : optimizer.piece_ranges()) {
      const auto* state = optimizer.base().find_state(name);
      ASSERT_NE(state, nullptr) << name;
      const auto expected = full_state.at(name).toGenericDict();
      for (const auto& [key, tensor] : *state) {
        at::Tensor slice = expected.at(key).toTensor();
        if (slice.dim() > 0) {
          slice = slice.reshape({-1}).narrow(0, range.first, range.second);
        }
        EXPECT_TRUE(tensor.equal(slice)) << name << "." << key;
      }
    }
  });
  fs::remove_all(dir);
}


// Stage 2 with dynamic loss scaling: an inf that lands in one rank's gradient shard only
// (rank 1's) must make every rank skip the step and back off, or the replicas diverge.
TEST(ShardedMixedPrecisionTest, AnInfInOneRanksShardSkipsTheStepOnEveryRank) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto net = make_net(3);
    ShardedOptimizerOptions options;
    options.make_base_optimizer = [](std::vector<optim::ParamGroup> groups) {
      return make_base(std::move(groups), Base::kSgd);
    };
    ShardedOptimizer optimizer(groups_of(*net), borrow(group), options);
    ShardedDataParallel sdp(net.ptr(), optimizer, borrow(group));
    precision::GradScalerOptions scaler_options;
    scaler_options.init_scale = 1024.0;
    scaler_options.found_inf_reducer = precision::found_inf_all_reduce(borrow(group));
    precision::GradScaler scaler(scaler_options);

    for (int step = 0; step < 2; ++step) {
      const at::Tensor before = flat_parameters(*net);
      optimizer.zero_grad();
      auto [images, labels] = local_batch(step, group);
      scaler.scale(torch::nn::functional::cross_entropy(sdp.forward(net, images), labels))
          .backward();
      std::vector<at::Tensor> grads = optimizer.shard_gradients();
      ASSERT_FALSE(grads.empty());
      const bool poison = step == 0 && group.rank() == 1;
      if (poison) {
        grads.back().view({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<float>::infinity());
      }
      scaler.unscale_(grads);
      const bool stepped = scaler.step([&] { optimizer.step(); });
      scaler.update();
      const at::Tensor after = flat_parameters(*net);
      if (step == 0) {
        EXPECT_FALSE(stepped) << "rank " << group.rank() << " stepped over rank 1's inf";
        EXPECT_TRUE(torch::equal(after, before)) << "rank " << group.rank();
        EXPECT_EQ(scaler.get_scale(), 512.0) << "rank " << group.rank();
      } else {
        EXPECT_TRUE(stepped) << "rank " << group.rank();
        EXPECT_FALSE(torch::equal(after, before)) << "rank " << group.rank();
      }
      // The replicas stay identical.
      at::Tensor rank0 = after.clone();
      group.broadcast(rank0, 0);
      EXPECT_TRUE(torch::equal(after, rank0)) << "step " << step << " rank " << group.rank();
    }
  });
}

} // namespace
} // namespace largo::parallel::sharded_optimizer_test
