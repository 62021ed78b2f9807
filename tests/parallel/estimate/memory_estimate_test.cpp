// The memory estimator: closed-form cases (Largo's layout and the ZeRO paper's own example),
// and the estimate against what 2 ranks actually hold after one step of stages 0 (DDP),
// 1 (ShardedOptimizer) and 2 (ShardedDataParallel), with SGD-momentum and AdamW.
#include <largo/core/error.h>
#include <largo/optim/adamw.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/data_parallel/sharded_data_parallel.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>
#include <largo/parallel/estimate/memory_estimate.h>

#include "comm/distributed_test_util.h"

namespace largo::parallel::memory_estimate_test {
namespace {

using largo::testing::run_on_ranks;

optim::OptimizerSpec adamw_spec(bool amsgrad = false) {
  optim::OptimizerSpec spec;
  spec.name = "adamw";
  spec.adamw.amsgrad = amsgrad;
  return spec;
}

optim::OptimizerSpec sgd_spec(double momentum) {
  optim::OptimizerSpec spec;
  spec.name = "sgd";
  spec.sgd.momentum = momentum;
  return spec;
}

// Three fp32 tensors of 5, 3 and 5 elements (13) and a frozen one of 7: on 2 ranks the flat
// buffer is padded to 14, rank 0 owns a[0:5) b[0:2) (7 elements, 2 pieces) and rank 1
// b[2:3) c[0:5) (6 elements, 2 pieces) -- the picture of flat_layout.h.
std::vector<ParameterSize> small_parameters() {
  return {{"a", 5, at::kFloat, true},
          {"b", 3, at::kFloat, true},
          {"frozen", 7, at::kFloat, false},
          {"c", 5, at::kFloat, true}};
}

void expect_bytes(const ModelStateBytes& bytes, int64_t parameters, int64_t gradients,
                  int64_t optimizer_state) {
  EXPECT_EQ(bytes.parameters, parameters);
  EXPECT_EQ(bytes.gradients, gradients);
  EXPECT_EQ(bytes.optimizer_state, optimizer_state);
}

TEST(MemoryEstimateTest, AdamWFp32ClosedForm) {
  MemoryEstimateOptions options;
  options.optimizer = adamw_spec();
  options.world_size = 2;
  const auto params = small_parameters();
  const int64_t frozen = 7 * 4;
  // Stage 0: everything full; 2 moments of 4 bytes per element + a 4-byte step per tensor.
  options.stage = 0;
  expect_bytes(estimate_model_state_bytes(params, options), frozen + 13 * 4, 13 * 4,
               13 * 8 + 3 * 4);
  // Stage 1: the padded flat buffer (14), full gradients, rank 0's 7 elements in 2 pieces.
  options.stage = 1;
  expect_bytes(estimate_model_state_bytes(params, options), frozen + 14 * 4, 13 * 4, 7 * 8 + 2 * 4);
  options.rank = 1;
  expect_bytes(estimate_model_state_bytes(params, options), frozen + 14 * 4, 13 * 4, 6 * 8 + 2 * 4);
  // Stage 2: gradient shards of 7 elements (the padding included).
  options.stage = 2;
  options.rank = 0;
  expect_bytes(estimate_model_state_bytes(params, options), frozen + 14 * 4, 7 * 4, 7 * 8 + 2 * 4);
  // Stage 3: parameter shards too.
  options.stage = 3;
  expect_bytes(estimate_model_state_bytes(params, options), frozen + 7 * 4, 7 * 4, 7 * 8 + 2 * 4);
  // The paper's formula: exact division, no padding, no step scalars.
  options.stage = 1;
  expect_bytes(zero_formula_bytes(params, options), frozen + 13 * 4, 13 * 4, 13 * 8 / 2);
}

TEST(MemoryEstimateTest, OffloadMovesTheStateAndCopiesOfThePiecesToTheHost) {
  MemoryEstimateOptions options;
  options.optimizer = adamw_spec();
  options.world_size = 2;
  options.offload_optimizer = true;
  const auto params = small_parameters();
  const int64_t frozen = 7 * 4;
  // Rank 0's 7 elements in 2 pieces: their state (2 moments, 2 steps) and a copy of the
  // pieces and of their gradients on the host; the device keeps parameters and gradients.
  for (int stage = 1; stage <= 3; ++stage) {
    options.stage = stage;
    const ModelStateBytes bytes = estimate_model_state_bytes(params, options);
    EXPECT_EQ(bytes.optimizer_state, 0) << "stage " << stage;
    EXPECT_EQ(bytes.host, 7 * 8 + 2 * 4 + 2 * 7 * 4) << "stage " << stage;
    MemoryEstimateOptions on_device = options;
    on_device.offload_optimizer = false;
    const ModelStateBytes without = estimate_model_state_bytes(params, on_device);
    EXPECT_EQ(bytes.parameters, without.parameters);
    EXPECT_EQ(bytes.gradients, without.gradients);
    EXPECT_EQ(without.host, 0);
  }
  options.stage = 3;
  EXPECT_EQ(estimate_model_state_bytes(params, options).parameters, frozen + 7 * 4);
  options.stage = 0; // DDP's optimizer is whole: nothing to offload
  EXPECT_THROW(estimate_model_state_bytes(params, options), largo::ConfigError);
}

TEST(MemoryEstimateTest, StatePerElementFollowsTheOptimizer) {
  EXPECT_EQ(optimizer_state_bytes_per_element(sgd_spec(0.0), at::kFloat, false), 0);
  EXPECT_EQ(optimizer_state_bytes_per_element(sgd_spec(0.9), at::kFloat, false), 4);
  EXPECT_EQ(optimizer_state_bytes_per_element(adamw_spec(), at::kFloat, false), 8);
  EXPECT_EQ(optimizer_state_bytes_per_element(adamw_spec(true), at::kFloat, false), 12);
  EXPECT_EQ(optimizer_state_bytes_per_element(adamw_spec(), at::kDouble, false), 16);
  optim::OptimizerSpec lamb;
  lamb.name = "lamb";
  EXPECT_EQ(optimizer_state_bytes_per_element(lamb, at::kFloat, false), 8);
  // LARS keeps "mu" even at momentum 0 (VISSL's code): as much as the optimizer itself holds.
  optim::OptimizerSpec lars;
  lars.name = "lars";
  lars.lars.momentum = 0.0;
  EXPECT_EQ(optimizer_state_bytes_per_element(lars, at::kFloat, false), 4);
  optim::ParamGroup group;
  group.params = {torch::ones({10}).requires_grad_()};
  group.params[0].mutable_grad() = torch::ones({10});
  auto built = optim::make_optimizer({group}, lars);
  built->step();
  EXPECT_EQ(built->state_bytes(), 10 * optimizer_state_bytes_per_element(lars, at::kFloat, false));
  // LARC keeps no state: the same as the optimizer it wraps.
  optim::OptimizerSpec larc_sgd = sgd_spec(0.9);
  larc_sgd.use_larc = true;
  EXPECT_EQ(optimizer_state_bytes_per_element(larc_sgd, at::kFloat, false), 4);
  // fp32 master weights: one more fp32 copy (the paper's K = 12 for mixed-precision Adam).
  EXPECT_EQ(optimizer_state_bytes_per_element(adamw_spec(), at::kFloat, true), 12);

  // SGD without momentum holds nothing, and no step scalars either.
  MemoryEstimateOptions options;
  options.optimizer = sgd_spec(0.0);
  EXPECT_EQ(estimate_model_state_bytes(small_parameters(), options).optimizer_state, 0);
}

// The paper's example (section 1 / figure 1): 7.5 B parameters, mixed-precision Adam
// (fp16 parameters and gradients, fp32 master weights, momentum and variance: K = 12),
// N = 64: 120 GB at stage 0, 31.4 GB at stage 1, 16.6 GB at stage 2, 1.9 GB at stage 3.
TEST(MemoryEstimateTest, ZeroPaperExample) {
  const std::vector<ParameterSize> params{{"psi", 7'500'000'000, at::kHalf, true}};
  MemoryEstimateOptions options;
  options.optimizer = adamw_spec();
  options.master_weights_dtype = at::kFloat;
  options.world_size = 64;
  const double expected_gb[] = {120.0, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    options.stage = stage;
    const double formula_gb = static_cast<double>(zero_formula_bytes(params, options).total()) / 1e9;
    EXPECT_NEAR(formula_gb, expected_gb[stage], 0.05) << "stage " << stage;
    // Largo's layout adds only the padding (< N elements) and the step scalars.
    const double estimate_gb =
        static_cast<double>(estimate_model_state_bytes(params, options).total()) / 1e9;
    EXPECT_NEAR(estimate_gb, formula_gb, 1e-6) << "stage " << stage;
  }
}

TEST(MemoryEstimateTest, MixedDtypesGetOneFlatBufferEach) {
  // 3 fp32 + 3 fp16 elements on 2 ranks: two buffers of 4 (padded), rank 0 owns 2 of each.
  const std::vector<ParameterSize> params{{"w", 3, at::kFloat, true}, {"h", 3, at::kHalf, true}};
  MemoryEstimateOptions options;
  options.optimizer = sgd_spec(0.9);
  options.world_size = 2;
  options.stage = 2;
  expect_bytes(estimate_model_state_bytes(params, options), 4 * 4 + 4 * 2, 2 * 4 + 2 * 2,
               2 * 4 + 2 * 2);
}

TEST(MemoryEstimateTest, RejectsBadOptions) {
  MemoryEstimateOptions options;
  options.world_size = 0;
  EXPECT_THROW(estimate_model_state_bytes(small_parameters(), options), largo::ConfigError);
  options.world_size = 2;
  options.stage = 4;
  EXPECT_THROW(estimate_model_state_bytes(small_parameters(), options), largo::ConfigError);
  options.stage = 1;
  options.rank = 2;
  EXPECT_THROW(estimate_model_state_bytes(small_parameters(), options), largo::ConfigError);
  options.rank = 0;
  options.optimizer.name = "zero";
  EXPECT_THROW(estimate_model_state_bytes(small_parameters(), options), largo::ConfigError);
}

// A conv net with a frozen first layer, training 168 + 330 + 970 + 99 = 1,567 parameters
// (odd, so the second shard is padded), in two groups (decayed weights, undecayed biases).
torch::nn::Sequential make_net() {
  torch::manual_seed(5);
  torch::nn::Sequential net(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 3, 1)), // frozen
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 3).padding(1)), torch::nn::ReLU(),
      torch::nn::MaxPool2d(2), torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 6, 3).padding(1)),
      torch::nn::Tanh(), torch::nn::Flatten(), torch::nn::Linear(6 * 4 * 4, 10), torch::nn::ReLU(),
      torch::nn::Linear(10, 9));
  for (auto& p : net->ptr(0)->parameters()) {
    p.set_requires_grad(false);
  }
  return net;
}

std::vector<optim::ParamGroup> groups_of(const torch::nn::Module& net) {
  optim::ParamGroupOptions options;
  options.lr = 0.05;
  options.weight_decay = 1e-3;
  options.regularize_bias = false;
  return optim::build_param_groups(net, options);
}

std::shared_ptr<comm::ProcessGroup> borrow(comm::ProcessGroup& group) {
  return std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {});
}

// One step of `stage` on 2 ranks; measured within 5 % of estimated in every category (the
// issue's bound; the layouts are the same, so they agree to the byte unless the library
// keeps something the accounting does not know of).
void check_measured_against_estimate(comm::ProcessGroup& group, const optim::OptimizerSpec& spec) {
  for (int stage = 0; stage <= 2; ++stage) {
    SCOPED_TRACE(fmt::format("stage {}, {}, rank {}", stage, spec.name, group.rank()));
    auto net = make_net();
    auto groups = groups_of(*net);
    const auto sizes = parameter_sizes(*net, groups);
    std::unique_ptr<optim::Optimizer> optimizer;
    if (stage == 0) {
      optimizer = optim::make_optimizer(std::move(groups), spec);
    } else {
      ShardedOptimizerOptions options;
      options.make_base_optimizer = [&](std::vector<optim::ParamGroup> pieces) {
        return optim::make_optimizer(std::move(pieces), spec);
      };
      optimizer = std::make_unique<ShardedOptimizer>(std::move(groups), borrow(group), options);
    }
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<ShardedDataParallel> sdp;
    if (stage == 2) {
      sdp = std::make_unique<ShardedDataParallel>(
          net.ptr(), static_cast<ShardedOptimizer&>(*optimizer), borrow(group));
    } else {
      ddp = std::make_unique<DistributedDataParallel>(net.ptr(), borrow(group));
    }
    auto generator = at::make_generator<at::CPUGeneratorImpl>(17 + group.rank());
    at::Tensor images = at::randn({4, 3, 8, 8}, generator);
    at::Tensor labels = at::randint(0, 9, {4}, generator);
    optimizer->zero_grad();
    at::Tensor logits = ddp ? ddp->forward(net, images) : sdp->forward(net, images);
    torch::nn::functional::cross_entropy(logits, labels).backward();
    optimizer->step();

    MemoryEstimateOptions options;
    options.optimizer = spec;
    options.world_size = group.world_size();
    options.stage = stage;
    options.rank = group.rank();
    const ModelStateBytes estimated = estimate_model_state_bytes(sizes, options);
    const ModelStateBytes measured = measure_model_state_bytes(*net, *optimizer);
    const std::pair<const char*, std::pair<int64_t, int64_t>> categories[] = {
        {"parameters", {measured.parameters, estimated.parameters}},
        {"gradients", {measured.gradients, estimated.gradients}},
        {"optimizer state", {measured.optimizer_state, estimated.optimizer_state}}};
    for (const auto& [category, values] : categories) {
      const auto [measured_bytes, estimated_bytes] = values;
      EXPECT_GT(estimated_bytes, 0) << category;
      EXPECT_NEAR(static_cast<double>(measured_bytes), static_cast<double>(estimated_bytes),
                  0.05 * static_cast<double>(estimated_bytes))
          << category << ": measured " << measured_bytes << " B, estimated " << estimated_bytes
          << " B";
    }
    // The sharded stages hold less optimizer state than the full state (stage 0's).
    if (stage > 0) {
      MemoryEstimateOptions full = options;
      full.stage = 0;
      EXPECT_LT(measured.optimizer_state, estimate_model_state_bytes(sizes, full).optimizer_state);
    }
  }
}

TEST(MemoryEstimateMeasuredTest, SgdMomentumStages0To2OnTwoRanks) {
  run_on_ranks(2, [](comm::ProcessGroup& group) { check_measured_against_estimate(group, sgd_spec(0.9)); });
}

TEST(MemoryEstimateMeasuredTest, AdamWStages0To2OnTwoRanks) {
  run_on_ranks(2, [](comm::ProcessGroup& group) { check_measured_against_estimate(group, adamw_spec()); });
}

} // namespace
} // namespace largo::parallel::memory_estimate_test
