// The parallel modes on CUDA tensors: 2 processes sharing the one GPU over Gloo (c10d's Gloo
// stages CUDA tensors through host memory; Largo's send, recv and sum reduce do it
// themselves, process_group.h) train like one process on that GPU: DDP, ZeRO-1, ZeRO-2 and
// FSDP through parallelize() (the sharded ones also with their optimizer offloaded to the
// host), and a 2-stage pipeline under every schedule; and with float16
// and loss scaling, an inf in one rank's gradient makes every rank skip the step. Each body takes
// the device and runs on the CPU too (the tests without Cuda in their name), so that on a
// GPU only the device changes. Each rank trains the one-process reference itself and
// compares its own result, so a rank's failed expectation is its exit status.
//
// Tolerances: as parallelize_test.cpp and pipeline_parallel_test.cpp argue, the parallel run
// computes the same float32 quantities as one process and only sums them in another order
// (halves of the batch averaged over 2 ranks, flat buckets, shards, micro-batches), which
// moves a gradient entry by a few float32 ulps of values of order 0.1-1 and a parameter after
// a few SGD steps by a few 1e-7; 1e-5 holds that with a margin, while a missed reduction or a
// wrong scale moves parameters by 1e-2. TF32 is turned off on the GPU: it would round the
// matmul inputs to 10 bits (2^-11 relative), differently for the two batch shapes.
#include <largo/parallel/data_parallel/host_offload_optimizer.h>
#include <largo/parallel/parallelize.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>
#include <largo/precision/precision_policy.h>
#include <largo/precision/tf32.h>

#include "comm/distributed_test_util.h"
#include "parallel/parallelize_test_util.h"
#include "parallel/pipeline_test_util.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <limits>

namespace largo::parallel::parallel_cuda_test {
namespace {

using largo::testing::run_on_ranks;
using testing::Block;
using testing::BlockImpl;
using testing::borrow;
using testing::groups_of;
using testing::sgd_momentum;

constexpr double kTolerance = 1e-5;

// Every test here runs its body on `device` in both ranks; this prepares a rank for it.
void prepare(at::Device device) {
  torch::set_num_threads(1);
  if (device.is_cuda()) {
    precision::apply_tf32({/*matmul=*/false, /*cudnn=*/false});
  }
}

const at::Device kCuda(at::kCUDA, 0);

// ---- the data-parallel modes through parallelize() --------------------------------------

constexpr int64_t kInputs = 12;
constexpr int64_t kWidth = 16;
constexpr int64_t kClasses = 5;
constexpr int64_t kGlobalBatch = 8;
constexpr int kSteps = 4;

// The identity forward; backward passes the gradient on with an inf in its first element:
// one rank's inf in one parameter's gradient. After the reduction ZeRO-2 and FSDP hold it in
// the gradient shard of that element's owner only, so the other rank skips only if the ranks
// agree; DDP and ZeRO-1 all-reduce it to every rank.
struct PoisonGradient : torch::autograd::Function<PoisonGradient> {
  static at::Tensor forward(torch::autograd::AutogradContext*, at::Tensor x) {
    return x.clone();
  }
  static torch::autograd::variable_list
  backward(torch::autograd::AutogradContext*, torch::autograd::variable_list grads) {
    at::Tensor grad = grads[0].clone();
    grad.view({-1}).narrow(0, 0, 1).fill_(std::numeric_limits<float>::infinity());
    return {grad};
  }
};

// Its blocks in a Sequential, where FSDP's units are chosen.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : embed(register_module("embed", torch::nn::Linear(kInputs, kWidth))),
        blocks(register_module("blocks", torch::nn::Sequential(Block(kWidth), Block(kWidth)))),
        head(register_module("head", torch::nn::Linear(kWidth, kClasses))) {}
  at::Tensor forward(at::Tensor x) {
    x = blocks->forward(torch::relu(embed(x)));
    // The head's parameters as the forward sees them (FSDP's gathered copies).
    const at::Tensor bias =
        poison_head_bias_gradient ? PoisonGradient::apply(head->bias) : head->bias;
    return torch::nn::functional::linear(x, head->weight, bias);
  }
  torch::nn::Linear embed;
  torch::nn::Sequential blocks;
  torch::nn::Linear head;
  bool poison_head_bias_gradient = false; // see PoisonGradient
};
TORCH_MODULE(Net);

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// On `device`; rank 1 starts from other weights on purpose: the modes must give every rank
// rank 0's.
Net make_net(int rank, at::Device device) {
  torch::manual_seed(rank == 0 ? 3 : 77);
  Net net;
  net->to(device);
  return net;
}

// Rows [begin, begin + count) of step `step`'s global batch, on `device`.
std::pair<at::Tensor, at::Tensor> rows(int step, int64_t begin, int64_t count, at::Device device) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(500 + step);
  at::Tensor inputs = at::randn({kGlobalBatch, kInputs}, generator);
  at::Tensor labels = at::randint(0, kClasses, {kGlobalBatch}, generator);
  return {inputs.narrow(0, begin, count).to(device), labels.narrow(0, begin, count).to(device)};
}

// kSteps steps, each rank its rows of the global batch in `accumulation` micro-steps; the
// full parameters (host copies) at the end.
NamedTensors train(ParallelModel& model, at::Device device, int accumulation = 1) {
  comm::ProcessGroup& group = model.process_group();
  const int64_t per_rank = kGlobalBatch / group.world_size();
  const int64_t micro = per_rank / accumulation;
  for (int step = 0; step < kSteps; ++step) {
    model.zero_grad();
    for (int k = 0; k < accumulation; ++k) {
      auto [x, y] = rows(step, group.rank() * per_rank + k * micro, micro, device);
      auto scope = model.micro_step(/*synchronize=*/k + 1 == accumulation);
      model.backward(torch::nn::functional::cross_entropy(model.forward(x), y) / accumulation);
    }
    EXPECT_TRUE(model.finish_backward());
    model.clip_grad_norm(10.0);
    EXPECT_TRUE(model.step());
  }
  return model.full_parameters();
}

NamedTensors train_one_process(at::Device device) {
  Net net = make_net(0, device);
  auto model = parallelize(
      net,
      groups_of(*net),
      sgd_momentum(),
      comm::ProcessGroup::single_process(),
      ParallelOptions());
  return train(*model, device);
}

ParallelOptions mode_options(DataParallelism mode) {
  ParallelOptions options;
  options.data_parallelism = mode;
  options.ddp.bucket_cap_bytes = 2048; // several buckets
  options.ddp.first_bucket_cap_bytes = 1024;
  options.zero.reduce_buffer_bytes = 2048;
  options.fsdp.wrap_policy = WrapPolicy::of_type<BlockImpl>("Block");
  return options;
}

void expect_close(const NamedTensors& actual, const NamedTensors& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(actual[i].first, expected[i].first);
    const double difference =
        (actual[i].second.to(at::kDouble) - expected[i].second.to(at::kDouble))
            .abs()
            .max()
            .item<double>();
    EXPECT_LE(difference, kTolerance) << expected[i].first;
  }
}

// With the optimizer offloaded: its state is on the host, pinned when the model is on a GPU
// (so that the copies are asynchronous).
void expect_state_on_the_host(ParallelModel& model, at::Device device) {
  const HostOffloadOptimizer* offload = find_host_offload(model.optimizer());
  ASSERT_NE(offload, nullptr);
  const auto& groups = offload->host_optimizer().param_groups();
  ASSERT_FALSE(groups.front().names.empty());
  const optim::ParamState* state = offload->find_state(groups.front().names.front());
  ASSERT_NE(state, nullptr);
  const at::Tensor& momentum = state->at("momentum_buffer");
  EXPECT_TRUE(momentum.device().is_cpu());
  EXPECT_EQ(momentum.is_pinned(), device.is_cuda());
}

// DDP, ZeRO-1, ZeRO-2 and FSDP, each without and with gradient accumulation, and the sharded
// ones with their optimizer offloaded to the host, against one process on the same device.
// Offloaded on a GPU, the host's SGD replaces the device's: the same element-wise update,
// rounded alike but for fused multiply-adds, a last-bit difference within the tolerance.
void modes_train_like_one_process(comm::ProcessGroup& group, at::Device device) {
  prepare(device);
  const NamedTensors reference = train_one_process(device);
  for (DataParallelism mode :
       {DataParallelism::kDdp,
        DataParallelism::kZero1,
        DataParallelism::kZero2,
        DataParallelism::kFsdp}) {
    for (bool offload : {false, true}) {
      for (int accumulation : {1, 2}) {
        if (offload && mode == DataParallelism::kDdp) {
          continue; // DDP's optimizer is not sharded: nothing to offload
        }
        SCOPED_TRACE(fmt::format(
            "{} on {}, {} micro-steps per step{}",
            to_string(mode),
            device.str(),
            accumulation,
            offload ? ", offloaded" : ""));
        ParallelOptions options = mode_options(mode);
        options.offload_optimizer = offload;
        Net net = make_net(group.rank(), device);
        auto model = parallelize(net, groups_of(*net), sgd_momentum(), borrow(group), options);
        expect_close(train(*model, device, accumulation), reference);
        if (offload) {
          expect_state_on_the_host(*model, device);
        }
      }
    }
  }
}

TEST(ParallelOnDeviceTest, EveryDataParallelModeOnCpuTrainsLikeOneProcess) {
  run_on_ranks(2, [](comm::ProcessGroup& group) { modes_train_like_one_process(group, at::kCPU); });
}

TEST(ParallelOnDeviceTest, EveryDataParallelModeOnCudaOverGlooTrainsLikeOneProcess) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  run_on_ranks(2, [](comm::ProcessGroup& group) { modes_train_like_one_process(group, kCuda); });
}

// ---- float16 with loss scaling: one rank's inf skips the step on every rank ---------------

// float16 in each mode: autocast with DDP and ZeRO (O1), FSDP's float16 compute copies of
// float32 shards; dynamic loss scaling from 1024 (2^16, the default, would overflow float16
// gradients of this net on its own).
ParallelOptions float16_options(DataParallelism mode) {
  ParallelOptions options = mode_options(mode);
  if (mode == DataParallelism::kFsdp) {
    options.fsdp.compute_dtype = at::kHalf;
    options.precision.loss_scaling = precision::LossScaling::kDynamic;
  } else {
    precision::PrecisionPolicyOptions amp;
    amp.use_amp = true;
    amp.amp_type = "pytorch";
    amp.dtype = "float16";
    options.precision = precision::resolve_precision_policy(amp);
  }
  options.grad_scaler.init_scale = 1024.0;
  return options;
}

// Every rank's host copy of the full parameters, flattened: equal to rank 0's.
at::Tensor flat(const NamedTensors& parameters) {
  std::vector<at::Tensor> pieces;
  for (const auto& [name, value] : parameters) {
    pieces.push_back(value.reshape({-1}).to(at::kFloat));
  }
  return at::cat(pieces);
}

void expect_same_on_every_rank(
    comm::ProcessGroup& group,
    const at::Tensor& value,
    at::Device device,
    const std::string& what) {
  at::Tensor rank0 = value.to(device, /*non_blocking=*/false, /*copy=*/true);
  group.broadcast(rank0, 0);
  EXPECT_TRUE(torch::equal(rank0.cpu(), value.cpu())) << what << " differs from rank 0's";
}

// Step 0: rank 1's gradient of one head bias element is inf, every rank's others finite;
// every rank finds it, skips the step and backs the scale off alike. Step 1 is clean.
void one_ranks_inf_skips_every_rank(comm::ProcessGroup& group, at::Device device) {
  prepare(device);
  for (DataParallelism mode :
       {DataParallelism::kDdp,
        DataParallelism::kZero1,
        DataParallelism::kZero2,
        DataParallelism::kFsdp}) {
    SCOPED_TRACE(
        fmt::format("{} float16 on {}, rank {}", to_string(mode), device.str(), group.rank()));
    Net net = make_net(group.rank(), device);
    auto model =
        parallelize(net, groups_of(*net), sgd_momentum(), borrow(group), float16_options(mode));
    ASSERT_TRUE(model->precision().has_loss_scaling());
    const int64_t per_rank = kGlobalBatch / group.world_size();
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE(fmt::format("step {}", step));
      const at::Tensor before = flat(model->full_parameters());
      const double scale = model->precision().loss_scale();
      net->poison_head_bias_gradient = step == 0 && group.rank() == 1;
      model->zero_grad();
      auto [x, y] = rows(step, group.rank() * per_rank, per_rank, device);
      model->backward(torch::nn::functional::cross_entropy(model->forward(x), y));
      const bool finite = model->finish_backward();
      const bool stepped = model->step();
      const at::Tensor after = flat(model->full_parameters());
      if (step == 0) {
        EXPECT_FALSE(finite);
        EXPECT_FALSE(stepped);
        EXPECT_TRUE(torch::equal(after, before)) << "the skipped step moved the parameters";
        EXPECT_EQ(model->precision().loss_scale(), scale * 0.5);
      } else {
        EXPECT_TRUE(finite);
        EXPECT_TRUE(stepped);
        EXPECT_FALSE(torch::equal(after, before)) << "the clean step left the parameters";
        EXPECT_EQ(model->precision().loss_scale(), scale);
      }
      EXPECT_TRUE(torch::isfinite(after).all().item<bool>());
      expect_same_on_every_rank(group, after, device, "the parameters");
    }
  }
}

TEST(ParallelOnDeviceTest, Float16InfOnOneRankOnCpuSkipsTheStepOnEveryRank) {
  run_on_ranks(
      2, [](comm::ProcessGroup& group) { one_ranks_inf_skips_every_rank(group, at::kCPU); });
}

TEST(ParallelOnDeviceTest, Float16InfOnOneRankOnCudaOverGlooSkipsTheStepOnEveryRank) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  run_on_ranks(2, [](comm::ProcessGroup& group) { one_ranks_inf_skips_every_rank(group, kCuda); });
}

// ---- the pipeline: 2 stages on 2 ranks --------------------------------------------------

constexpr int kPipelineSteps = 3;
constexpr int64_t kPipelineBatch = 16;

// pipeline_test_util.h's reference and pipeline loops, with the batches on `device`.
void train_reference_on(models::TrunkHeadModel& model, at::Device device) {
  auto sgd = testing::make_sgd(*model);
  for (int step = 0; step < kPipelineSteps; ++step) {
    auto [images, labels] = testing::global_batch(step, kPipelineBatch);
    sgd->zero_grad();
    testing::cross_entropy(model->forward(images.to(device)), labels.to(device)).backward();
    sgd->step();
  }
}

void train_pipeline_on(PipelineParallel& pipeline, at::Device device) {
  auto sgd = testing::make_sgd(*pipeline.module());
  for (int step = 0; step < kPipelineSteps; ++step) {
    auto [images, labels] = testing::global_batch(step, kPipelineBatch);
    sgd->zero_grad();
    pipeline.forward_backward(images.to(device), labels.to(device), testing::cross_entropy);
    pipeline.reduce_gradients();
    sgd->step();
  }
}

// Every schedule (interleaved: 4 stages, 2 per rank) against one process on the same device;
// its activations and gradients cross between the ranks by send and recv.
void pipeline_trains_like_one_process(comm::ProcessGroup& group, at::Device device) {
  prepare(device);
  auto reference = testing::make_model();
  reference->to(device);
  train_reference_on(reference, device);
  const std::vector<std::pair<PipelineScheduleKind, int>> schedules = {
      {PipelineScheduleKind::kGPipe, 1},
      {PipelineScheduleKind::kOneFOneB, 1},
      {PipelineScheduleKind::kZeroBubbleH1, 1},
      {PipelineScheduleKind::kInterleaved1F1B, 2},
  };
  for (const auto& [kind, virtual_stages] : schedules) {
    SCOPED_TRACE(fmt::format("{} on {}", to_string(kind), device.str()));
    auto model = testing::make_model();
    model->to(device);
    PipelineParallel pipeline(
        pipeline_blocks(*model),
        borrow(group),
        nullptr,
        PipelineParallelOptions()
            .schedule(kind)
            .virtual_stages(virtual_stages)
            .num_microbatches(4));
    train_pipeline_on(pipeline, device);
    EXPECT_LT(testing::max_difference(pipeline, *reference), kTolerance) << pipeline.describe();
    // The outputs of the last stage, broadcast to every rank.
    auto [images, labels] = testing::global_batch(0, kPipelineBatch);
    const at::Tensor outputs = pipeline.forward(images.to(device), /*broadcast_outputs=*/true);
    EXPECT_EQ(outputs.device(), device);
    torch::NoGradGuard no_grad;
    const at::Tensor expected = reference->forward(images.to(device));
    EXPECT_LT((outputs - expected).abs().max().item<double>(), kTolerance);
  }
}

TEST(ParallelOnDeviceTest, TwoStagePipelineOnCpuTrainsLikeOneProcess) {
  run_on_ranks(
      2, [](comm::ProcessGroup& group) { pipeline_trains_like_one_process(group, at::kCPU); });
}

TEST(ParallelOnDeviceTest, TwoStagePipelineOnCudaOverGlooTrainsLikeOneProcess) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  run_on_ranks(
      2, [](comm::ProcessGroup& group) { pipeline_trains_like_one_process(group, kCuda); });
}

} // namespace
} // namespace largo::parallel::parallel_cuda_test
