// FullyShardedDataParallel (ZeRO-3) on 2 ranks (Gloo over 127.0.0.1) against
// DistributedDataParallel on the same seed and data: the same model after 20 steps.
#include <largo/core/error.h>
#include <largo/models/model_factory.h>
#include <largo/optim/adamw.h>
#include <largo/optim/grad_clipping.h>
#include <largo/optim/larc.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/data_parallel/fully_sharded_data_parallel.h>
#include <largo/precision/master_weights.h>
#include <largo/precision/model_cast.h>

#include "comm/distributed_test_util.h"

namespace largo::parallel::fully_sharded_data_parallel_test {
namespace {

using largo::testing::run_on_ranks;

constexpr int64_t kGlobalBatch = 16;
constexpr int64_t kImageSize = 16;
constexpr int kSteps = 20;

enum class OptimizerKind { kSgdMomentum, kAdamW, kLarcSgd };

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

// The small CNN (3 stages of conv + BatchNorm, a linear head) or a 2-layer ViT: trunks of
// blocks with several units. Rank 1 starts from other weights on purpose: the wrappers'
// broadcast must give both ranks rank 0's model.
models::TrunkHeadModel make_model(const std::string& trunk, int rank) {
  torch::manual_seed(rank == 0 ? 7 : 99);
  models::ModelOptions options;
  options.trunk_name = trunk;
  options.image_size = kImageSize;
  options.small_cnn.channels = {4, 8, 8};
  options.small_cnn.pooled_size = 2;
  options.vit.image_size = kImageSize;
  options.vit.patch_size = 4;
  options.vit.num_layers = 2;
  options.vit.num_heads = 2;
  options.vit.hidden_dim = 16;
  options.vit.mlp_dim = 32;
  return models::build_model(options);
}

// VISSL's units for Largo's models: every trunk block with >= `threshold` trainable elements.
FullyShardedDataParallelOptions trunk_units(int64_t threshold = 0) {
  FullyShardedDataParallelOptions options;
  options.wrap_policy =
      WrapPolicy::elements_of("trunk") && WrapPolicy::min_trainable_parameters(threshold);
  return options;
}

// Rank r's rows of the global batch of step `step`.
std::pair<at::Tensor, at::Tensor> local_batch(int step, const comm::ProcessGroup& group) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor images = at::randn({kGlobalBatch, 3, kImageSize, kImageSize}, generator);
  at::Tensor labels = at::randint(0, 10, {kGlobalBatch}, generator);
  const int64_t per_rank = kGlobalBatch / group.world_size();
  return {
      images.narrow(0, group.rank() * per_rank, per_rank),
      labels.narrow(0, group.rank() * per_rank, per_rank)};
}

std::unique_ptr<optim::Optimizer>
make_optimizer(OptimizerKind kind, std::vector<optim::ParamGroup> groups) {
  switch (kind) {
  case OptimizerKind::kSgdMomentum: {
    optim::SGDOptions sgd;
    sgd.momentum = 0.9;
    return std::make_unique<optim::SGD>(std::move(groups), sgd);
  }
  case OptimizerKind::kAdamW:
    return std::make_unique<optim::AdamW>(std::move(groups));
  case OptimizerKind::kLarcSgd: {
    optim::SGDOptions sgd;
    sgd.momentum = 0.9;
    optim::LARCOptions larc;
    larc.trust_coefficient = 0.02;
    larc.clip = true;
    return std::make_unique<optim::LARC>(
        std::make_unique<optim::SGD>(std::move(groups), sgd), larc);
  }
  }
  return nullptr;
}

std::vector<optim::ParamGroup> param_groups(const torch::nn::Module& model, OptimizerKind kind) {
  optim::ParamGroupOptions options;
  options.lr = kind == OptimizerKind::kAdamW ? 0.005 : 0.05;
  options.weight_decay = 1e-4;
  return optim::build_param_groups(model, options); // BatchNorm parameters not decayed
}

// One training step of `accumulation` micro-batches: forward, loss / accumulation, backward.
template <typename Forward>
void train_step(int step, comm::ProcessGroup& group, int accumulation, const Forward& forward) {
  auto [images, labels] = local_batch(step, group);
  const int64_t micro = images.size(0) / accumulation;
  for (int k = 0; k < accumulation; ++k) {
    at::Tensor loss = torch::nn::functional::cross_entropy(
        forward(images.narrow(0, k * micro, micro), k + 1 == accumulation),
        labels.narrow(0, k * micro, micro));
    (loss / accumulation).backward();
  }
}

// The reference: DDP (no_sync for all but the last micro-batch).
// max_norm > 0: global-norm clipping before each step, the norms before clipping appended
// to *norms.
NamedTensors train_ddp(
    comm::ProcessGroup& group,
    const std::string& trunk,
    OptimizerKind kind,
    int accumulation = 1,
    double max_norm = 0.0,
    std::vector<double>* norms = nullptr) {
  models::TrunkHeadModel model = make_model(trunk, group.rank());
  DistributedDataParallel ddp(model.ptr(), borrow(group));
  auto optimizer = make_optimizer(kind, param_groups(*model, kind));
  for (int step = 0; step < kSteps; ++step) {
    optimizer->zero_grad();
    train_step(step, group, accumulation, [&](const at::Tensor& images, bool sync) {
      if (sync) {
        return ddp.forward(model, images);
      }
      auto guard = ddp.no_sync();
      return ddp.forward(model, images);
    });
    if (max_norm > 0) {
      norms->push_back(optim::clip_grad_norm(model->parameters(), max_norm));
    }
    optimizer->step();
  }
  NamedTensors named;
  for (const auto& item : model->named_parameters()) {
    named.emplace_back(item.key(), item.value().detach().clone());
  }
  return named;
}

// How train_fsdp clears the gradients before each step.
enum class GradZeroing {
  kOptimizerSetToNone, // optimizer->zero_grad(): the pieces' gradients freed
  kOptimizerInPlace,   // optimizer->zero_grad(false): zeroed in place (views of the shards)
  kFsdp,               // fsdp.zero_grad()
};

struct FsdpRun {
  NamedTensors parameters;
  int64_t peak_gathered_bytes = 0;
  int64_t gathered_after_step = 0;
  std::vector<int64_t> unit_full_bytes; // per unit, the root last
  int64_t root_full_bytes = 0;
};

FsdpRun train_fsdp(
    comm::ProcessGroup& group,
    const std::string& trunk,
    FullyShardedDataParallelOptions options,
    OptimizerKind kind,
    int accumulation = 1,
    double max_norm = 0.0,
    std::vector<double>* norms = nullptr,
    GradZeroing zeroing = GradZeroing::kOptimizerSetToNone) {
  models::TrunkHeadModel model = make_model(trunk, group.rank());
  FullyShardedDataParallel fsdp(model, borrow(group), options);
  auto optimizer = fsdp.make_optimizer(
      param_groups(*model, kind), [kind](std::vector<optim::ParamGroup> groups) {
        return make_optimizer(kind, std::move(groups));
      });
  FsdpRun run;
  for (int step = 0; step < kSteps; ++step) {
    switch (zeroing) {
    case GradZeroing::kOptimizerSetToNone:
      optimizer->zero_grad();
      break;
    case GradZeroing::kOptimizerInPlace:
      optimizer->zero_grad(/*set_to_none=*/false);
      break;
    case GradZeroing::kFsdp:
      fsdp.zero_grad();
      break;
    }
    train_step(step, group, accumulation, [&](const at::Tensor& images, bool) {
      return fsdp.forward(images);
    });
    if (max_norm > 0) {
      norms->push_back(fsdp.clip_grad_norm(max_norm));
    }
    optimizer->step();
    run.gathered_after_step = std::max(run.gathered_after_step, fsdp.gathered_bytes());
  }
  run.peak_gathered_bytes = fsdp.peak_gathered_bytes();
  for (const auto& unit : fsdp.units()) {
    const int64_t bytes = unit.layout.padded_numel() * 4;
    run.unit_full_bytes.push_back(bytes);
    if (unit.position < 0) {
      run.root_full_bytes = bytes;
    }
  }
  run.parameters = fsdp.full_parameters();
  return run;
}

// fp32: FSDP averages the same gradients as DDP (sums over 2 ranks divided by 2); only the
// flattening and the order of accumulation differ, which 20 steps keep within 1e-5.
void expect_equal_parameters(const NamedTensors& fsdp, const NamedTensors& ddp) {
  ASSERT_EQ(fsdp.size(), ddp.size());
  for (size_t i = 0; i < ddp.size(); ++i) {
    ASSERT_EQ(fsdp[i].first, ddp[i].first);
    ASSERT_EQ(fsdp[i].second.sizes(), ddp[i].second.sizes()) << ddp[i].first;
    const float difference = (fsdp[i].second - ddp[i].second).abs().max().item<float>();
    EXPECT_LE(difference, 1e-5) << ddp[i].first;
  }
}

TEST(FullyShardedDataParallelTest, EveryBlockWrappedEqualsDdpWithSgdMomentum) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const NamedTensors reference = train_ddp(group, "small_cnn", OptimizerKind::kSgdMomentum);
    FullyShardedDataParallelOptions options = trunk_units(0);
    FsdpRun run = train_fsdp(group, "small_cnn", options, OptimizerKind::kSgdMomentum);
    EXPECT_EQ(run.unit_full_bytes.size(), 4u); // 3 conv stages + the root (the head)
    expect_equal_parameters(run.parameters, reference);
    // The model really moved (20 steps from rank 0's initialization).
    models::TrunkHeadModel initial = make_model("small_cnn", 0);
    EXPECT_GT(
        (reference.front().second - initial->parameters().front()).abs().max().item<float>(), 1e-3);
  });
}

TEST(FullyShardedDataParallelTest, OnlyTheRootUnitEqualsDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const NamedTensors reference = train_ddp(group, "small_cnn", OptimizerKind::kSgdMomentum);
    // No block is large enough: one root unit.
    FullyShardedDataParallelOptions options = trunk_units(1'000'000'000);
    FsdpRun run = train_fsdp(group, "small_cnn", options, OptimizerKind::kSgdMomentum);
    EXPECT_EQ(run.unit_full_bytes.size(), 1u);
    expect_equal_parameters(run.parameters, reference);
  });
}

TEST(FullyShardedDataParallelTest, KeepingParametersAfterForwardEqualsDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const NamedTensors reference = train_ddp(group, "small_cnn", OptimizerKind::kSgdMomentum);
    FullyShardedDataParallelOptions options = trunk_units();
    options.reshard_after_forward = false;
    FsdpRun run = train_fsdp(group, "small_cnn", options, OptimizerKind::kSgdMomentum);
    expect_equal_parameters(run.parameters, reference);
  });
}

TEST(FullyShardedDataParallelTest, GradientAccumulationEqualsDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    // 2 micro-batches of 4 per rank: DDP accumulates locally and reduces once, FSDP
    // reduce-scatters each micro-batch and accumulates the shards.
    const NamedTensors reference =
        train_ddp(group, "small_cnn", OptimizerKind::kSgdMomentum, /*accumulation=*/2);
    FsdpRun run = train_fsdp(group, "small_cnn", {}, OptimizerKind::kSgdMomentum, 2);
    expect_equal_parameters(run.parameters, reference);
  });
}

TEST(FullyShardedDataParallelTest, EveryWayOfZeroingGradientsStartsTheNextStepFromZero) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    // With accumulation, a gradient shard that was not cleared would carry the previous
    // step's gradients into this one.
    const NamedTensors reference =
        train_ddp(group, "small_cnn", OptimizerKind::kSgdMomentum, /*accumulation=*/2);
    for (GradZeroing zeroing : {GradZeroing::kOptimizerInPlace, GradZeroing::kFsdp}) {
      SCOPED_TRACE(zeroing == GradZeroing::kFsdp ? "fsdp.zero_grad()" : "zero_grad(false)");
      FsdpRun run =
          train_fsdp(group, "small_cnn", {}, OptimizerKind::kSgdMomentum, 2, 0.0, nullptr, zeroing);
      expect_equal_parameters(run.parameters, reference);
    }
  });
}

TEST(FullyShardedDataParallelTest, OptimizerGroupsMustNameShardedParameters) {
  models::TrunkHeadModel model = make_model("small_cnn", 0);
  FullyShardedDataParallel fsdp(model, comm::ProcessGroup::single_process());
  std::vector<optim::ParamGroup> groups = param_groups(*model, OptimizerKind::kSgdMomentum);
  groups.front().params.push_back(at::zeros({3}));
  groups.front().names.push_back("not.a.parameter");
  try {
    fsdp.make_optimizer(groups, [](std::vector<optim::ParamGroup> shard_groups) {
      return make_optimizer(OptimizerKind::kSgdMomentum, std::move(shard_groups));
    });
    FAIL() << "expected largo::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("not.a.parameter"), std::string::npos);
  }
}

TEST(FullyShardedDataParallelTest, AdamWEqualsDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const NamedTensors reference = train_ddp(group, "small_cnn", OptimizerKind::kAdamW);
    FsdpRun run = train_fsdp(group, "small_cnn", {}, OptimizerKind::kAdamW);
    expect_equal_parameters(run.parameters, reference);
  });
}

TEST(FullyShardedDataParallelTest, LarcNormsAreCompletedAcrossRanks) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    // LARC's per-parameter trust ratios need whole-parameter norms; a parameter straddling
    // the two shards gets them from the norm reducer's all-reduce.
    const NamedTensors reference = train_ddp(group, "small_cnn", OptimizerKind::kLarcSgd);
    FsdpRun run = train_fsdp(group, "small_cnn", {}, OptimizerKind::kLarcSgd);
    expect_equal_parameters(run.parameters, reference);
  });
}

TEST(FullyShardedDataParallelTest, GlobalNormClippingOverShardsEqualsDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    constexpr double kMaxNorm = 0.5;
    std::vector<double> ddp_norms;
    std::vector<double> fsdp_norms;
    const NamedTensors reference =
        train_ddp(group, "small_cnn", OptimizerKind::kSgdMomentum, 1, kMaxNorm, &ddp_norms);
    FsdpRun run =
        train_fsdp(group, "small_cnn", {}, OptimizerKind::kSgdMomentum, 1, kMaxNorm, &fsdp_norms);
    // Clipping really happened, and the shards' norm is the whole gradient's norm (fp32
    // sums in another order: 1e-5 relative).
    ASSERT_EQ(ddp_norms.size(), fsdp_norms.size());
    EXPECT_GT(ddp_norms.front(), kMaxNorm);
    for (size_t step = 0; step < ddp_norms.size(); ++step) {
      EXPECT_NEAR(fsdp_norms[step], ddp_norms[step], 1e-5 * ddp_norms[step]) << "step " << step;
    }
    expect_equal_parameters(run.parameters, reference);
  });
}

TEST(FullyShardedDataParallelTest, VisionTransformerEqualsDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const NamedTensors reference = train_ddp(group, "vision_transformer", OptimizerKind::kAdamW);
    FsdpRun run = train_fsdp(group, "vision_transformer", {}, OptimizerKind::kAdamW);
    expect_equal_parameters(run.parameters, reference);
  });
}

TEST(FullyShardedDataParallelTest, WithoutPrefetchEqualsDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    const NamedTensors reference = train_ddp(group, "small_cnn", OptimizerKind::kSgdMomentum);
    FullyShardedDataParallelOptions options = trunk_units();
    options.prefetch = false; // every all-gather synchronous
    FsdpRun run = train_fsdp(group, "small_cnn", options, OptimizerKind::kSgdMomentum);
    expect_equal_parameters(run.parameters, reference);
  });
}

TEST(FullyShardedDataParallelTest, AtMostTheRootAndTwoUnitsAreGatheredAtOnce) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    FullyShardedDataParallelOptions no_prefetch = trunk_units();
    no_prefetch.prefetch = false;
    for (const FullyShardedDataParallelOptions& options :
         {trunk_units(), no_prefetch}) {
      FsdpRun run = train_fsdp(group, "small_cnn", options, OptimizerKind::kSgdMomentum);
      ASSERT_EQ(run.unit_full_bytes.size(), 4u);
      int64_t all_units = 0;
      int64_t largest_block_unit = 0;
      for (size_t u = 0; u + 1 < run.unit_full_bytes.size(); ++u) {
        largest_block_unit = std::max(largest_block_unit, run.unit_full_bytes[u]);
      }
      for (int64_t bytes : run.unit_full_bytes) {
        all_units += bytes;
      }
      SCOPED_TRACE(options.prefetch ? "with prefetch" : "without prefetch");
      // The root stays gathered from forward to the end of backward. Of the block units:
      // with prefetch, the one running and the next one; without, only the one running (a
      // unit's gradients are all reduced, and it is freed, before the gradient of its input
      // reaches the unit before it).
      EXPECT_GT(run.peak_gathered_bytes, 0);
      const int64_t units_at_once = options.prefetch ? 2 : 1;
      EXPECT_LE(run.peak_gathered_bytes, run.root_full_bytes + units_at_once * largest_block_unit);
      EXPECT_LT(run.peak_gathered_bytes, all_units);
      // Between steps nothing is gathered: only the shards are held.
      EXPECT_EQ(run.gathered_after_step, 0);
    }
  });
}

TEST(FullyShardedDataParallelTest, ShardsHoldHalfOfTheParametersAndFreedUnitsHoldNoMemory) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    models::TrunkHeadModel model = make_model("small_cnn", group.rank());
    int64_t model_bytes = 0;
    for (const at::Tensor& param : model->parameters()) {
      model_bytes += param.nbytes();
    }
    FullyShardedDataParallel fsdp(model, borrow(group));
    // Each unit is padded to an even length: at most one element per unit of padding.
    const int64_t num_units = static_cast<int64_t>(fsdp.units().size());
    EXPECT_GE(fsdp.shard_bytes(), model_bytes / 2);
    EXPECT_LE(fsdp.shard_bytes(), model_bytes / 2 + num_units * 4);
    for (const auto& unit : fsdp.units()) {
      EXPECT_FALSE(unit.gathered);
      EXPECT_EQ(unit.full.storage().nbytes(), 0u) << unit.name;
    }
    EXPECT_EQ(fsdp.gathered_bytes(), 0);
  });
}

TEST(FullyShardedDataParallelTest, InferenceForwardFreesEveryUnit) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    FullyShardedDataParallelOptions options = trunk_units();
    options.reshard_after_forward = false;
    models::TrunkHeadModel model = make_model("small_cnn", group.rank());
    FullyShardedDataParallel fsdp(model, borrow(group), options);
    torch::NoGradGuard no_grad;
    at::Tensor output = fsdp.forward(local_batch(0, group).first);
    EXPECT_EQ(output.size(1), 10);
    EXPECT_EQ(fsdp.gathered_bytes(), 0);
    EXPECT_GT(fsdp.peak_gathered_bytes(), 0);
  });
}

TEST(FullyShardedDataParallelTest, OneProcessTrainsLikeThePlainModel) {
  // A world of one: every collective an identity, so FSDP must train like the unwrapped
  // model (same ops on the same values, gradients divided by 1). Within 1e-5 rather than bit
  // for bit: the small CNN keeps its conv weights channels-last, FSDP's views of the flat
  // buffer are contiguous, and oneDNN may round the two layouts differently.
  torch::set_num_threads(1);
  auto group = comm::ProcessGroup::single_process();
  models::TrunkHeadModel plain = make_model("small_cnn", 0);
  models::TrunkHeadModel wrapped = make_model("small_cnn", 0);
  FullyShardedDataParallel fsdp(wrapped, group);
  auto plain_optimizer = make_optimizer(
      OptimizerKind::kSgdMomentum, param_groups(*plain, OptimizerKind::kSgdMomentum));
  auto fsdp_optimizer = fsdp.make_optimizer(
      param_groups(*wrapped, OptimizerKind::kSgdMomentum),
      [](std::vector<optim::ParamGroup> groups) {
        return make_optimizer(OptimizerKind::kSgdMomentum, std::move(groups));
      });
  for (int step = 0; step < 5; ++step) {
    plain_optimizer->zero_grad();
    fsdp_optimizer->zero_grad();
    train_step(
        step, *group, 1, [&](const at::Tensor& images, bool) { return plain->forward(images); });
    train_step(
        step, *group, 1, [&](const at::Tensor& images, bool) { return fsdp.forward(images); });
    plain_optimizer->step();
    fsdp_optimizer->step();
  }
  NamedTensors reference;
  for (const auto& item : plain->named_parameters()) {
    reference.emplace_back(item.key(), item.value().detach().clone());
  }
  expect_equal_parameters(fsdp.full_parameters(), reference);
}

// Compute copies without sharding, by hand: every rank computes with a bfloat16 copy of the
// float32 masters (BatchNorm kept float32, contiguous weights as FSDP's views of its flat
// buffers), the bfloat16 gradients are averaged over the ranks in float32, and SGD steps
// the masters, which are then cast down into the model.
NamedTensors train_bf16_masters_reference(comm::ProcessGroup& group, const std::string& trunk) {
  models::TrunkHeadModel model = make_model(trunk, group.rank());
  std::vector<at::Tensor> buffers = model->buffers();
  std::vector<at::Tensor> state = model->parameters();
  state.insert(state.end(), buffers.begin(), buffers.end());
  broadcast_coalesced(group, state, 0);
  std::unordered_map<std::string, at::Tensor> initial; // the float32 values the masters start at
  for (const auto& item : model->named_parameters()) {
    initial.emplace(item.key(), item.value().detach().clone());
  }
  precision::cast_model(*model, precision::ModelCastOptions{at::kBFloat16, true, {}});
  for (at::Tensor& param : model->parameters()) {
    param.set_data(param.detach().contiguous());
  }
  precision::MasterWeights masters(*model);
  {
    torch::NoGradGuard no_grad;
    for (const std::string& name : masters.names()) {
      masters.master(name).copy_(initial.at(name));
    }
    masters.copy_masters_to_model();
  }
  std::vector<optim::ParamGroup> groups = param_groups(*model, OptimizerKind::kSgdMomentum);
  for (auto& param_group : groups) {
    for (size_t i = 0; i < param_group.params.size(); ++i) {
      param_group.params[i] = masters.master(param_group.names[i]);
    }
  }
  auto optimizer = make_optimizer(OptimizerKind::kSgdMomentum, std::move(groups));
  for (int step = 0; step < kSteps; ++step) {
    optimizer->zero_grad();
    broadcast_coalesced(group, buffers, 0); // as FSDP's broadcast_buffers
    train_step(step, group, 1, [&](const at::Tensor& images, bool) {
      return model->forward(images.to(at::kBFloat16)).to(at::kFloat);
    });
    masters.copy_grads_to_masters();
    torch::NoGradGuard no_grad;
    for (const at::Tensor& master : masters.masters()) {
      group.all_reduce(master.grad());
      master.grad().div_(group.world_size());
    }
    optimizer->step();
    masters.copy_masters_to_model();
  }
  NamedTensors named;
  for (const std::string& name : masters.names()) {
    named.emplace_back(name, masters.master(name).detach().clone());
  }
  return named;
}

FullyShardedDataParallelOptions bf16_compute_copies() {
  FullyShardedDataParallelOptions options = trunk_units();
  options.compute_dtype = at::kBFloat16;
  options.fp32_reduce_scatter = true;
  options.keeps_fp32 = [](const torch::nn::Module& module) {
    return precision::is_batchnorm(module);
  };
  return options;
}

TEST(FullyShardedDataParallelTest, BFloat16ComputeCopiesTrainFloat32MastersLikeApexO2) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    for (const std::string trunk : {"small_cnn", "vision_transformer"}) {
      SCOPED_TRACE(trunk);
      const NamedTensors reference = train_bf16_masters_reference(group, trunk);
      models::TrunkHeadModel model = make_model(trunk, group.rank());
      FullyShardedDataParallel fsdp(model, borrow(group), bf16_compute_copies());
      // The block units and the root are gathered as bfloat16; BatchNorm's parameters (the
      // small CNN's) form a float32 unit; every shard is float32.
      bool has_float32_unit = false;
      for (const auto& unit : fsdp.units()) {
        EXPECT_EQ(unit.shard.scalar_type(), at::kFloat) << unit.name;
        EXPECT_EQ(unit.full.scalar_type(), unit.name == "float32" ? at::kFloat : at::kBFloat16)
            << unit.name;
        has_float32_unit = has_float32_unit || unit.name == "float32";
      }
      EXPECT_EQ(has_float32_unit, trunk == "small_cnn");
      auto optimizer = fsdp.make_optimizer(
          param_groups(*model, OptimizerKind::kSgdMomentum),
          [](std::vector<optim::ParamGroup> groups) {
            return make_optimizer(OptimizerKind::kSgdMomentum, std::move(groups));
          });
      for (int step = 0; step < kSteps; ++step) {
        optimizer->zero_grad();
        train_step(step, group, 1, [&](const at::Tensor& images, bool) {
          at::Tensor output = fsdp.forward(images);
          EXPECT_EQ(output.scalar_type(), at::kBFloat16);
          return output.to(at::kFloat);
        });
        optimizer->step();
      }
      const NamedTensors trained = fsdp.full_parameters();
      // The same arithmetic as the reference: the same bfloat16 values in, the same float32
      // sums of two gradients (a sum of two is exact in either order).
      expect_equal_parameters(trained, reference);
      // The masters keep float32 precision: the updates did not round them to bfloat16.
      double below_bfloat16 = 0;
      for (const auto& [name, value] : trained) {
        below_bfloat16 = std::max(
            below_bfloat16, (value - value.to(at::kBFloat16).to(at::kFloat)).abs().max().item<double>());
      }
      EXPECT_GT(below_bfloat16, 0.0);
    }
  });
}

TEST(FullyShardedDataParallelTest, BFloat16ComputeCopiesGatherHalfTheBytes) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    torch::set_num_threads(1);
    // The ViT has no BatchNorm: the same units in both runs, gathered in 2 bytes or in 4.
    FullyShardedDataParallelOptions float32_options = trunk_units();
    float32_options.prefetch = false;
    FullyShardedDataParallelOptions copies = bf16_compute_copies();
    copies.prefetch = false;
    std::vector<int64_t> peaks;
    for (const auto& options : {float32_options, copies}) {
      models::TrunkHeadModel model = make_model("vision_transformer", group.rank());
      FullyShardedDataParallel fsdp(model, borrow(group), options);
      train_step(0, group, 1, [&](const at::Tensor& images, bool) {
        return fsdp.forward(images).to(at::kFloat);
      });
      peaks.push_back(fsdp.peak_gathered_bytes());
    }
    EXPECT_EQ(peaks[1] * 2, peaks[0]);
  });
}

// With bfloat16 compute copies the gradients come out of the backward in bfloat16. Without
// fp32_reduce_scatter they are reduce-scattered in bfloat16, so every element of a gradient
// shard is a bfloat16 value; with it they are summed in float32, and sums of two ranks'
// bfloat16 gradients mostly need more than bfloat16's 8 significant bits.
TEST(FullyShardedDataParallelTest, Fp32ReduceScatterSumsTheBFloat16GradientsInFloat32) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    for (const bool fp32_reduce_scatter : {false, true}) {
      FullyShardedDataParallelOptions options = bf16_compute_copies();
      options.fp32_reduce_scatter = fp32_reduce_scatter;
      models::TrunkHeadModel model = make_model("small_cnn", group.rank());
      FullyShardedDataParallel fsdp(model, borrow(group), options);
      train_step(0, group, 1, [&](const at::Tensor& images, bool) {
        return fsdp.forward(images).to(at::kFloat);
      });
      int64_t elements = 0;
      int64_t bfloat16_values = 0;
      for (const auto& unit : fsdp.units()) {
        if (unit.full.scalar_type() != at::kBFloat16) {
          continue; // the float32 units (BatchNorm) reduce in float32 either way
        }
        const at::Tensor grads = unit.grad_shard;
        elements += grads.numel();
        bfloat16_values += grads.eq(grads.to(at::kBFloat16).to(at::kFloat)).sum().item<int64_t>();
      }
      ASSERT_GT(elements, 100) << "too few gradients in the bfloat16 units to tell";
      if (fp32_reduce_scatter) {
        EXPECT_LT(bfloat16_values, elements / 2) << bfloat16_values << " of " << elements;
      } else {
        EXPECT_EQ(bfloat16_values, elements);
      }
    }
  });
}

} // namespace
} // namespace largo::parallel::fully_sharded_data_parallel_test
