// Tensor parallelism (parallel/tensor_parallel/tensor_parallel.h, tensor_parallel_plan.h): the shard
// arithmetic as functions of (rank, world); the zoo's MLP trunk and a small ViT sharded over
// two ranks (Gloo, the world group as the tensor-parallel group) against the same model
// unsharded, built from the same seed in the same process: forward outputs, every gradient,
// the gradient norm, and 20 clipped AdamW steps (the ViT with sequence parallelism also on
// the GPU); one step under autocast against the unsharded model under the same autocast
// (bfloat16 on the CPU, float16 and bfloat16 on the GPU); and the plan's error messages.
//
// Both models run in float64, so that any difference is rounding in a different order
// (partial products summed by an all-reduce, the bias added after it) and the bound can be
// derived instead of tuned: see kRelativeTolerance.
#include <largo/core/error.h>
#include <largo/models/mlp.h>
#include <largo/models/trunk_head_model.h>
#include <largo/models/vit.h>
#include <largo/optim/adamw.h>
#include <largo/parallel/tensor_parallel/tensor_parallel.h>
#include <largo/parallel/tensor_parallel/tensor_parallel_plan.h>
#include <largo/precision/autocast.h>
#include <largo/precision/tf32.h>

#include "comm/distributed_test_util.h"
#include "parallel/parallelize_test_util.h"
#include "parallel/tensor_parallel_test_util.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <cmath>
#include <functional>

namespace largo::parallel::tensor_parallel_test {
namespace {

using largo::testing::run_on_ranks;
using testing::adamw_noise_bound;
using testing::borrow;
using testing::expect_close;
using testing::groups_of;
using testing::kRelativeTolerance;
using testing::small_vit_options;
using testing::with_linear_head;

constexpr int kTensorParallelSize = 2;
constexpr int kSteps = 20;
constexpr int64_t kBatch = 4;
constexpr int64_t kClasses = 5;
constexpr double kLearningRate = 1e-2;
// The bounds against the unsharded model: tensor_parallel_test_util.h derives them.

// Three Linear blocks: the first two a column/row pair, the third (odd) replicated; the
// head replicated.
models::TrunkHeadModel make_mlp() {
  torch::manual_seed(11);
  models::MlpOptions options;
  options.hidden_dims = {32, 24, 16};
  auto model = with_linear_head(models::build_mlp_trunk(options, /*in_channels=*/1, 4), kClasses);
  model->to(at::kDouble);
  return model;
}

// The same weights on every device and in every dtype: drawn on the CPU in float32, then moved.
models::TrunkHeadModel make_vit_on(at::Device device, at::ScalarType dtype) {
  torch::manual_seed(12);
  auto model = with_linear_head(models::build_vit_trunk(small_vit_options(), 3, 16), kClasses);
  model->to(device, dtype);
  return model;
}

models::TrunkHeadModel make_vit() {
  return make_vit_on(at::kCPU, at::kDouble);
}

// Step `step`'s batch, the same on every rank (tensor parallelism splits the model, not the
// data), drawn on the CPU and moved to `device`.
std::pair<at::Tensor, at::Tensor> batch(
    int step,
    at::IntArrayRef image_shape,
    at::Device device = at::kCPU,
    at::ScalarType dtype = at::kDouble) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(900 + step);
  std::vector<int64_t> shape{kBatch};
  shape.insert(shape.end(), image_shape.begin(), image_shape.end());
  at::Tensor images = at::randn(shape, generator, at::kDouble);
  at::Tensor labels = at::randint(0, kClasses, {kBatch}, generator);
  return {images.to(device, dtype), labels.to(device)};
}

at::Tensor loss_of(models::TrunkHeadModel& model, const std::pair<at::Tensor, at::Tensor>& data) {
  return torch::nn::functional::cross_entropy(model->forward(data.first), data.second);
}

// Every gradient of the sharded model equals the unsharded one's (its slice for a shard), and
// the replicated ones are the same, bit for bit, on every rank.
void expect_gradients_match(
    models::TrunkHeadModel& sharded, models::TrunkHeadModel& unsharded, comm::ProcessGroup& group) {
  const auto specs = tensor_parallel_sharded_parameters(*sharded);
  const auto full = unsharded->named_parameters();
  for (const auto& item : sharded->named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    const at::Tensor& full_grad = full[item.key()].grad();
    const auto spec = specs.find(item.key());
    if (spec != specs.end()) {
      expect_close(
          grad,
          shard_of(full_grad, spec->second, group.rank(), group.world_size()),
          "gradient of shard " + item.key());
      continue;
    }
    expect_close(grad, full_grad, "gradient of replicated " + item.key());
    at::Tensor every_rank = at::empty({group.world_size(), grad.numel()}, grad.options());
    group.all_gather(every_rank, grad.contiguous());
    EXPECT_TRUE(at::equal(every_rank[0], every_rank[1]))
        << item.key() << ": replicated gradient differs between the tensor-parallel ranks";
  }
}

double unsharded_grad_norm(models::TrunkHeadModel& model) {
  double squares = 0.0;
  for (const at::Tensor& parameter : model->parameters()) {
    squares += parameter.grad().square().sum().item<double>();
  }
  return std::sqrt(squares);
}

// clip_grad_norm_ on the unsharded model (the formula of torch.nn.utils.clip_grad_norm_).
void clip_unsharded(models::TrunkHeadModel& model, double max_norm) {
  const double coefficient = max_norm / (unsharded_grad_norm(model) + 1e-6);
  if (coefficient < 1.0) {
    for (const at::Tensor& parameter : model->parameters()) {
      parameter.grad().mul_(coefficient);
    }
  }
}

optim::AdamW adamw_of(torch::nn::Module& model) {
  auto param_groups = groups_of(model);
  param_groups[0].lr = kLearningRate;
  param_groups[0].weight_decay = 0.05;
  return optim::AdamW(param_groups);
}

// The whole comparison, on one rank of the tensor-parallel group.
void expect_trains_like_unsharded(
    const std::function<models::TrunkHeadModel()>& make,
    at::IntArrayRef image_shape,
    comm::ProcessGroup& group,
    TensorParallelPlanOptions plan = {},
    at::Device device = at::kCPU) {
  models::TrunkHeadModel unsharded = make();
  models::TrunkHeadModel sharded = make();
  EXPECT_FALSE(apply_tensor_parallel(*sharded, borrow(group), plan).empty());

  // First step in detail: outputs, gradients, gradient norm.
  const auto first = batch(0, image_shape, device);
  expect_close(sharded->forward(first.first), unsharded->forward(first.first), "output");
  loss_of(sharded, first).backward();
  loss_of(unsharded, first).backward();
  expect_gradients_match(sharded, unsharded, group);
  const double norm = unsharded_grad_norm(unsharded);
  const double sharded_norm = tensor_parallel_grad_norm(*sharded, group);
  EXPECT_LE(std::abs(sharded_norm - norm), kRelativeTolerance * norm)
      << "gradient norm " << sharded_norm << ", unsharded " << norm;

  // Then kSteps AdamW steps, clipped to half the first norm so that clipping acts.
  const double max_norm = 0.5 * norm;
  optim::AdamW sharded_optimizer = adamw_of(*sharded);
  optim::AdamW unsharded_optimizer = adamw_of(*unsharded);
  for (int step = 0; step < kSteps; ++step) {
    sharded_optimizer.zero_grad();
    unsharded_optimizer.zero_grad();
    const auto data = batch(step, image_shape, device);
    at::Tensor sharded_loss = loss_of(sharded, data);
    at::Tensor unsharded_loss = loss_of(unsharded, data);
    expect_close(sharded_loss.detach(), unsharded_loss.detach(), fmt::format("loss {}", step));
    sharded_loss.backward();
    unsharded_loss.backward();
    clip_tensor_parallel_grad_norm_(*sharded, max_norm, group);
    clip_unsharded(unsharded, max_norm);
    sharded_optimizer.step();
    unsharded_optimizer.step();
  }
  const auto expected = unsharded->named_parameters();
  for (const auto& [name, value] : full_parameters(*sharded, group)) {
    expect_close(
        value,
        expected[name],
        "after training, full " + name,
        adamw_noise_bound(max_norm, kSteps, kLearningRate));
  }
}

TEST(TensorParallelShards, RankHoldsItsPartOfEveryBlock) {
  // 12 rows as 3 blocks (q | k | v) of 4, over 2 ranks: rank 1 holds rows 2-3 of each block.
  at::Tensor rows = at::arange(12, at::kLong).reshape({12, 1}).expand({12, 2}).contiguous();
  at::Tensor local = shard_of(rows, {0, 3}, /*rank=*/1, /*world_size=*/2);
  EXPECT_TRUE(at::equal(local.select(1, 0), at::tensor({2, 3, 6, 7, 10, 11}, at::kLong)));
  // A plain split of columns.
  at::Tensor columns = at::arange(8, at::kLong).reshape({1, 8});
  EXPECT_TRUE(
      at::equal(shard_of(columns, {1, 1}, 0, 4), at::tensor({0, 1}, at::kLong).reshape({1, 2})));
  EXPECT_TRUE(
      at::equal(shard_of(columns, {1, 1}, 3, 4), at::tensor({6, 7}, at::kLong).reshape({1, 2})));
  EXPECT_THROW(shard_of(columns, {1, 1}, 0, 3), OptionError);
}

// gather_output: every rank gets all output features, and the input's gradient is whole.
TEST(TensorParallel, GatheredColumnLinearEqualsLinear) {
  run_on_ranks(kTensorParallelSize, [](comm::ProcessGroup& group) {
    torch::manual_seed(13);
    torch::nn::Linear full(torch::nn::LinearOptions(8, 6));
    full->to(at::kDouble);
    ColumnParallelLinearOptions options;
    options.gather_output = true;
    ColumnParallelLinear column(*full, borrow(group), options);
    at::Tensor input = at::randn({3, 8}, at::kDouble).requires_grad_(true); // same seed: same
    at::Tensor full_input = input.detach().clone().requires_grad_(true);
    at::Tensor output = column->forward(input); // [3, 6]
    at::Tensor full_output = full->forward(full_input);
    expect_close(output, full_output, "gathered output");
    // A loss that weighs every output feature differently, so a misplaced slice shows.
    at::Tensor weights = at::arange(1, 7, at::kDouble);
    (output * weights).sum().backward();
    (full_output * weights).sum().backward();
    expect_close(input.grad(), full_input.grad(), "input gradient");
    expect_close(
        column->weight.grad(),
        shard_of(full->weight.grad(), {0, 1}, group.rank(), 2),
        "weight gradient");
    expect_close(full_parameter(*column, "weight", group), full->weight.detach(), "full weight");
  });
}

TEST(TensorParallel, MlpTrunkTrainsLikeUnsharded) {
  run_on_ranks(kTensorParallelSize, [](comm::ProcessGroup& group) {
    // The first pair is split (32 = 2 x 16 features), the odd third block is not.
    models::TrunkHeadModel probe = make_mlp();
    apply_tensor_parallel(*probe, borrow(group));
    EXPECT_EQ(probe->named_parameters()["trunk.0.linear.weight"].size(0), 16);
    EXPECT_EQ(probe->named_parameters()["trunk.1.linear.weight"].size(1), 16);
    EXPECT_EQ(probe->named_parameters()["trunk.2.linear.weight"].size(0), 16);
    expect_trains_like_unsharded(make_mlp, {1, 4, 4}, group);
  });
}

TEST(TensorParallel, VitTrainsLikeUnsharded) {
  run_on_ranks(kTensorParallelSize, [](comm::ProcessGroup& group) {
    // Each rank: 2 of the 4 heads (q, k and v: 3 x 16 rows of qkv) and 32 of fc1's 64.
    models::TrunkHeadModel probe = make_vit();
    apply_tensor_parallel(*probe, borrow(group));
    const auto parameters = probe->named_parameters();
    EXPECT_EQ(parameters["trunk.1.qkv.weight"].size(0), 3 * 16);
    EXPECT_EQ(parameters["trunk.1.qkv.bias"].size(0), 3 * 16);
    EXPECT_EQ(parameters["trunk.1.proj.weight"].size(1), 16);
    EXPECT_EQ(parameters["trunk.2.fc1.weight"].size(0), 32);
    EXPECT_EQ(parameters["trunk.2.fc2.weight"].size(1), 32);
    EXPECT_EQ(parameters["head.0.weight"].size(0), kClasses);
    expect_trains_like_unsharded(make_vit, {3, 16, 16}, group);
  });
}

// Sequence parallelism: the small ViT's 5 tokens (4 patches and the class token) split 3 + 2
// over 2 ranks and 2 + 2 + 1 + 0 over 4, so uneven shards and a rank without tokens are
// covered; between the layers each rank holds its tokens only. The norms' and the row layers'
// biases' gradients (each rank's covering its tokens) are summed over the ranks: replicated
// bit for bit, equal to the unsharded ones within the float64 bound.
TEST(TensorParallel, VitWithSequenceParallelismTrainsLikeUnsharded) {
  for (const int ranks : {2, 4}) {
    run_on_ranks(ranks, [ranks](comm::ProcessGroup& group) {
      TensorParallelPlanOptions plan;
      plan.sequence_parallel = true;
      models::TrunkHeadModel probe = make_vit();
      apply_tensor_parallel(*probe, borrow(group), plan);
      const auto layer = [&probe](int64_t block) {
        return std::dynamic_pointer_cast<models::VitEncoderLayerImpl>(probe->trunk_block(block));
      };
      at::Tensor tokens = probe->forward_trunk_range(batch(0, {3, 16, 16}).first, 0, 1);
      ASSERT_EQ(tokens.size(1), 5);
      tokens = layer(1)->forward(tokens);
      const std::vector<int64_t> held =
          ranks == 2 ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 2, 1, 0};
      EXPECT_EQ(tokens.size(1), held[group.rank()]);
      EXPECT_EQ(layer(2)->forward(tokens).size(1), 5);
      expect_trains_like_unsharded(make_vit, {3, 16, 16}, group, plan);
    });
  }
}

// Inputs of another size than the ViT was built for (its positional embedding interpolated,
// 4 to 9 patches + the class token): tensor parallelism splits heads and features, not
// tokens, so it trains like unsharded; sequence parallelism's gather restores the built
// token count, so it refuses them, naming the option and both counts, on every rank.
TEST(TensorParallel, VitOnInputsOfAnotherSizeTrainsOrIsRefusedUnderSequenceParallelism) {
  run_on_ranks(kTensorParallelSize, [](comm::ProcessGroup& group) {
    expect_trains_like_unsharded(make_vit, {3, 24, 24}, group);
    TensorParallelPlanOptions plan;
    plan.sequence_parallel = true;
    models::TrunkHeadModel model = make_vit();
    apply_tensor_parallel(*model, borrow(group), plan);
    try {
      model->forward(batch(0, {3, 24, 24}).first);
      ADD_FAILURE() << "expected an OptionError";
    } catch (const OptionError& error) {
      const std::string message = error.what();
      EXPECT_NE(
          message.find("TensorParallelPlanOptions::sequence_parallel = true"), std::string::npos)
          << message;
      EXPECT_NE(message.find("10 tokens, not its 5"), std::string::npos) << message;
    }
  });
}

// The same comparison on the GPU (float64, 2 ranks sharing it over Gloo, which stages CUDA
// tensors through host memory): the sequence regions' gathers and reduce-scatters, and the
// shard random streams' device generator, on CUDA tensors. The bound is the CPU run's: cuBLAS
// sums float64 products in another order, within the same K * u.
TEST(TensorParallel, CudaVitWithSequenceParallelismOverGlooTrainsLikeUnsharded) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  run_on_ranks(kTensorParallelSize, [](comm::ProcessGroup& group) {
    const at::Device cuda(at::kCUDA, 0);
    TensorParallelPlanOptions plan;
    plan.sequence_parallel = true;
    expect_trains_like_unsharded(
        [cuda] { return make_vit_on(cuda, at::kDouble); }, {3, 16, 16}, group, plan, cuda);
  });
}

// Autocast with tensor and sequence parallelism on `device`, one forward and backward of a
// float32 ViT against the unsharded model under the same autocast: the sequence-gathered
// column layers compute their backward in the gradient's dtype and every parameter's
// gradient comes back in float32. Bound, with the low dtype's unit roundoff u (2^-8 bfloat16,
// 2^-11 float16): the shards round their partial products before summing them where one
// process rounds the sum once, at most u more per sharded linear layer relative to its
// output. The loss sits behind 4 row layers (2 encoder layers), at most ~4u; a gradient behind
// those and the 4 column layers' input gradients of backward, ~12u of the gradients' norm.
// 16u for both: 6 % in bfloat16, 0.8 % in float16, where a missing reduction or a wrong shard
// is off by the order of the values themselves.
void autocast_with_sequence_parallelism_matches_unsharded(
    comm::ProcessGroup& group, at::Device device, at::ScalarType low) {
  SCOPED_TRACE(fmt::format("{} autocast on {}", c10::toString(low), device.str()));
  TensorParallelPlanOptions plan;
  plan.sequence_parallel = true;
  models::TrunkHeadModel unsharded = make_vit_on(device, at::kFloat);
  models::TrunkHeadModel sharded = make_vit_on(device, at::kFloat);
  apply_tensor_parallel(*sharded, borrow(group), plan);
  const auto data = batch(0, {3, 16, 16}, device, at::kFloat);
  at::Tensor sharded_loss;
  at::Tensor unsharded_loss;
  {
    precision::AutocastGuard autocast(device.type(), low);
    sharded_loss = loss_of(sharded, data);
    unsharded_loss = loss_of(unsharded, data);
  }
  sharded_loss.backward();
  unsharded_loss.backward();
  const double bound = 16.0 * std::ldexp(1.0, low == at::kBFloat16 ? -8 : -11);
  const double expected_loss = unsharded_loss.item<double>();
  EXPECT_NEAR(sharded_loss.item<double>(), expected_loss, bound * std::abs(expected_loss));

  const auto specs = tensor_parallel_sharded_parameters(*sharded);
  const auto full = unsharded->named_parameters();
  double difference_squares = 0.0;
  double expected_squares = 0.0;
  for (const auto& item : sharded->named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    EXPECT_EQ(grad.scalar_type(), at::kFloat) << item.key();
    EXPECT_TRUE(grad.isfinite().all().item<bool>()) << item.key();
    const auto spec = specs.find(item.key());
    const at::Tensor& full_grad = full[item.key()].grad();
    const at::Tensor expected =
        spec == specs.end() ? full_grad
                            : shard_of(full_grad, spec->second, group.rank(), group.world_size());
    difference_squares += (grad - expected).to(at::kDouble).square().sum().item<double>();
    expected_squares += expected.to(at::kDouble).square().sum().item<double>();
  }
  EXPECT_LE(std::sqrt(difference_squares), bound * std::sqrt(expected_squares))
      << "|gradient difference| " << std::sqrt(difference_squares) << " of |gradient| "
      << std::sqrt(expected_squares) << " (this rank's part)";
}

TEST(TensorParallel, AutocastWithSequenceParallelismOnCpuMatchesUnsharded) {
  run_on_ranks(kTensorParallelSize, [](comm::ProcessGroup& group) {
    autocast_with_sequence_parallelism_matches_unsharded(group, at::kCPU, at::kBFloat16);
  });
}

TEST(TensorParallel, CudaAutocastWithSequenceParallelismOverGlooMatchesUnsharded) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  run_on_ranks(kTensorParallelSize, [](comm::ProcessGroup& group) {
    const at::Device cuda(at::kCUDA, 0);
    precision::apply_tf32({/*matmul=*/false, /*cudnn=*/false}); // float32 parts in float32
    for (const at::ScalarType low : {at::kHalf, at::kBFloat16}) {
      autocast_with_sequence_parallelism_matches_unsharded(group, cuda, low);
    }
  });
}

TEST(SequenceParallel, RanksHoldConsecutiveTokensTheLastOnesFewer) {
  const std::vector<std::pair<int64_t, int64_t>> of_197_over_4 = {
      {0, 50}, {50, 50}, {100, 50}, {150, 47}};
  for (int rank = 0; rank < 4; ++rank) {
    const SequenceShard shard = sequence_shard_of(197, rank, 4);
    EXPECT_EQ(std::make_pair(shard.begin, shard.size), of_197_over_4[rank]) << rank;
  }
  EXPECT_EQ(sequence_shard_of(2, 2, 3).begin, 2); // 2 tokens over 3 ranks: 1, 1, none
  EXPECT_EQ(sequence_shard_of(2, 2, 3).size, 0);
}

// The OptionError message check_tensor_parallel_plan throws, or "" when it throws none.
std::string
plan_error(torch::nn::Module& model, int64_t tp_size, TensorParallelPlanOptions plan = {}) {
  try {
    check_tensor_parallel_plan(model, tp_size, plan);
  } catch (const OptionError& error) {
    return error.what();
  }
  return "";
}

void expect_contains(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos)
      << "\"" << message << "\" lacks \"" << part << "\"";
}

TEST(TensorParallelPlan, ErrorsNameTheModuleTheSizeAndTheGroup) {
  models::VitOptions six_heads = small_vit_options();
  six_heads.num_heads = 6;
  six_heads.hidden_dim = 36;
  six_heads.mlp_dim = 72; // divisible by 2, 3 and 4: only the heads fail at 4
  auto vit = with_linear_head(models::build_vit_trunk(six_heads, 3, 16), kClasses);
  const std::string heads = plan_error(*vit, 4);
  expect_contains(heads, "\"trunk.1\" (VitEncoderLayer) num_heads = 6");
  expect_contains(heads, "a multiple of the tensor-parallel size 4");
  EXPECT_EQ(plan_error(*vit, 2), "");
  EXPECT_EQ(plan_error(*vit, 3), "");

  models::VitOptions odd_mlp = small_vit_options();
  odd_mlp.mlp_dim = 66;
  auto vit_mlp = with_linear_head(models::build_vit_trunk(odd_mlp, 3, 16), kClasses);
  expect_contains(plan_error(*vit_mlp, 4), "\"trunk.1\" (VitEncoderLayer) mlp_dim = 66");

  models::MlpOptions mlp_options;
  mlp_options.hidden_dims = {30, 16};
  auto mlp = with_linear_head(models::build_mlp_trunk(mlp_options, 1, 4), kClasses);
  const std::string width = plan_error(*mlp, 4);
  expect_contains(
      width, "\"trunk.0\" (MlpBlock, column-parallel before \"trunk.1\") out_features = 30");
  expect_contains(width, "tensor-parallel size 4");

  torch::nn::Sequential convolutional(torch::nn::Conv2d(3, 8, 3), torch::nn::Linear(8, 2));
  const std::string no_plan = plan_error(*convolutional, 2);
  expect_contains(no_plan, "torch::nn::Conv2dImpl");
  expect_contains(no_plan, "other layers have no tensor-parallel plan");

  EXPECT_THROW(
      apply_tensor_parallel(*convolutional, comm::ProcessGroup::single_process()), OptionError);
  expect_contains(plan_error(*mlp, 0), "tensor-parallel size = 0");

  TensorParallelPlanOptions sequence;
  sequence.sequence_parallel = true;
  const std::string no_tokens = plan_error(*mlp, 2, sequence);
  expect_contains(no_tokens, "TensorParallelPlanOptions::sequence_parallel = true");
  expect_contains(no_tokens, "the MLP trunk has no sequence of tokens");
  models::VitOptions one_patch = small_vit_options();
  one_patch.image_size = one_patch.patch_size; // 1 patch and the class token: 2 tokens
  auto short_vit = with_linear_head(models::build_vit_trunk(one_patch, 3, 8), kClasses);
  EXPECT_EQ(plan_error(*short_vit, 2, sequence), "");
  expect_contains(plan_error(*short_vit, 4, sequence), "takes 2 tokens, fewer than the 4 ranks");
  models::VitEncoderLayerOptions layer_options;
  layer_options.hidden_dim = 32;
  layer_options.num_heads = 4;
  layer_options.mlp_dim = 64;
  torch::nn::Sequential bare_layers{models::VitEncoderLayer(layer_options)};
  EXPECT_EQ(plan_error(*bare_layers, 2), "");
  expect_contains(plan_error(*bare_layers, 2, sequence), "right after a models::VitPatchEmbedding");

  apply_tensor_parallel(*mlp, comm::ProcessGroup::single_process());
  expect_contains(plan_error(*mlp, 1), "tensor-parallel already");
}

} // namespace
} // namespace largo::parallel::tensor_parallel_test
