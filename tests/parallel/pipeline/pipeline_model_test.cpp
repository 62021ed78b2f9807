// Pipeline parallelism as a mode of parallel::parallelize() (given the blocks, or a
// models::TrunkHeadModel, with a pipeline size), on a torch::nn::Sequential defined here and
// the caller's own loop of forward_backward calls:
// 2 stages train like one process that runs the micro-batches as accumulation steps (in
// float32 and under bfloat16 autocast), evaluation forwards give every rank the outputs (also
// for a batch smaller than the number of micro-batches), the model and optimizer states are
// the whole model's on rank 0 and load back per stage, the replicas end each step with the
// same BatchNorm statistics, and what does not compose (or is not a chain of blocks) is
// refused.
#include <largo/core/error.h>
#include <largo/models/trunk_head_model.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/parallelize.h>

#include "comm/distributed_test_util.h"
#include "parallel/parallelize_test_util.h"

namespace largo::parallel::pipeline_model_test {
namespace {

using largo::testing::run_on_ranks;
using testing::borrow;
using testing::groups_of;
using testing::sgd_momentum;

constexpr int64_t kInputs = 12;
constexpr int64_t kWidth = 16;
constexpr int64_t kClasses = 5;
constexpr int64_t kBatch = 16;
constexpr int kMicroBatches = 4;
constexpr int kSteps = 4;

// fp32: the same arithmetic on each micro-batch of kBatch / kMicroBatches rows; only the order
// in which the micro-batches' gradients are added, and clipping's norm (summed over the
// stages' partial norms), differ, which moves the last bits.
constexpr double kTolerance = 1e-5;

// 6 blocks, each a tensor-to-tensor layer, in a Sequential of the caller's module (which a
// pipeline cuts: pipeline_blocks(net->layers, "layers")).
struct NetImpl : torch::nn::Module {
  NetImpl()
      : layers(register_module(
            "layers",
            torch::nn::Sequential(
                torch::nn::Linear(kInputs, kWidth),
                torch::nn::ReLU(),
                torch::nn::Linear(kWidth, kWidth),
                torch::nn::Tanh(),
                torch::nn::Linear(kWidth, kWidth),
                torch::nn::Linear(kWidth, kClasses)))) {}
  at::Tensor forward(at::Tensor x) {
    return layers->forward(x);
  }
  torch::nn::Sequential layers;
};
TORCH_MODULE(Net);

Net make_net() {
  torch::manual_seed(11);
  return Net();
}

std::vector<PipelineBlock> blocks_of(const Net& net) {
  return pipeline_blocks(net->layers, "layers");
}

std::pair<at::Tensor, at::Tensor> batch_of(int step) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(700 + step);
  return {at::randn({kBatch, kInputs}, generator), at::randint(0, kClasses, {kBatch}, generator)};
}

at::Tensor cross_entropy(const at::Tensor& output, const at::Tensor& target) {
  return torch::nn::functional::cross_entropy(output, target);
}

ParallelOptions pipeline_options(bool bfloat16_autocast) {
  ParallelOptions options;
  options.pipeline.size = 2;
  options.pipeline.stages.num_microbatches(kMicroBatches);
  if (bfloat16_autocast) {
    precision::PrecisionPolicyOptions amp;
    amp.use_amp = true;
    amp.amp_type = "pytorch";
    amp.dtype = "bfloat16";
    options.precision = precision::resolve_precision_policy(amp);
  }
  return options;
}

// The caller's loop: each step's batch in `calls` forward_backward calls of kBatch / calls
// rows (one call: the pipeline splits it into its micro-batches), clipped, stepped. Returns
// the losses.
std::vector<double> train(ParallelModel& model, int calls) {
  std::vector<double> losses;
  const int64_t rows = kBatch / calls;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = batch_of(step);
    model.zero_grad();
    double loss = 0.0;
    for (int k = 0; k < calls; ++k) {
      auto scope = model.micro_step(/*synchronize=*/k + 1 == calls);
      loss += model.forward_backward(
                  x.narrow(0, k * rows, rows), y.narrow(0, k * rows, rows), cross_entropy, calls) /
              calls;
    }
    EXPECT_TRUE(model.finish_backward());
    model.clip_grad_norm(0.5);
    EXPECT_TRUE(model.step());
    losses.push_back(loss);
  }
  return losses;
}

// One process (parallelize's local mode) running the micro-batches as accumulation steps.
std::pair<std::vector<double>, Net> train_reference(bool autocast) {
  Net net = make_net();
  ParallelOptions options = pipeline_options(autocast);
  options.pipeline = {};
  auto model = parallelize(
      net, groups_of(*net), sgd_momentum(), comm::ProcessGroup::single_process(), options);
  return {train(*model, kMicroBatches), net};
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  EXPECT_TRUE(torch::allclose(actual, expected, kTolerance, kTolerance))
      << what << " differs by " << (actual - expected).abs().max().item<double>();
}

TEST(PipelineModelTest, TwoStagesTrainLikeOneProcessAccumulatingTheMicroBatches) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    for (const bool autocast : {false, true}) {
      SCOPED_TRACE(autocast ? "bfloat16 autocast" : "float32");
      const auto [expected_losses, reference] = train_reference(autocast);
      Net net = make_net();
      auto model = parallelize(
          blocks_of(net),
          groups_of(*net),
          sgd_momentum(),
          borrow(group),
          pipeline_options(autocast));
      const std::vector<double> losses = train(*model, /*calls=*/1);
      for (int step = 0; step < kSteps; ++step) {
        EXPECT_NEAR(losses[step], expected_losses[step], kTolerance) << "step " << step;
      }
      // This rank's stage trained like the reference's same-named parameters.
      const auto expected = reference->named_parameters();
      size_t own = 0;
      for (const auto& item : model->module()->named_parameters()) {
        expect_close(item.value(), expected[item.key()], item.key());
        ++own;
      }
      EXPECT_GT(own, 0u);
      EXPECT_LT(own, expected.size());                         // only this stage's
      EXPECT_EQ(model->data_parallel_group().world_size(), 1); // 2 ranks = 2 stages x 1
      ASSERT_NE(model->pipeline(), nullptr);
      EXPECT_NE(model->describe().find("pipeline"), std::string::npos) << model->describe();
    }
  });
}

TEST(PipelineModelTest, ForwardGivesEveryRankTheOutputsOfAnyBatch) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    Net reference = make_net();
    Net net = make_net();
    auto model = parallelize(
        blocks_of(net), groups_of(*net), sgd_momentum(), borrow(group), pipeline_options(false));
    EXPECT_TRUE(model->forward_communicates_without_grad());
    torch::NoGradGuard no_grad;
    for (const int64_t rows : {kBatch, int64_t{1}, int64_t{kMicroBatches - 1}}) {
      const at::Tensor x = batch_of(rows).first.narrow(0, 0, rows);
      const at::Tensor outputs = model->forward(x);
      ASSERT_EQ(outputs.sizes(), (std::vector<int64_t>{rows, kClasses})) << rows << " rows";
      expect_close(outputs, reference->forward(x), std::to_string(rows) + " rows");
    }
  });
}

TEST(PipelineModelTest, StatesAreTheWholeModelsOnRankZeroAndLoadBackPerStage) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto world = borrow(group);
    const auto [losses, reference] = train_reference(false);
    Net net = make_net();
    auto model = parallelize(
        blocks_of(net), groups_of(*net), sgd_momentum(), world, pipeline_options(false));
    train(*model, 1);
    const auto state = model->model_state_dict(0);
    const c10::IValue optimizer_state = model->optimizer_state_dict();
    if (group.rank() == 0) { // the whole model, in its order
      const auto expected = reference->named_parameters();
      ASSERT_EQ(state.size(), expected.size());
      for (size_t i = 0; i < state.size(); ++i) {
        EXPECT_EQ(state[i].first, expected.keys()[i]);
        expect_close(state[i].second, expected.values()[i], state[i].first);
      }
      EXPECT_EQ(
          optimizer_state.toGenericDict().at("state").toGenericDict().size(), expected.size());
    } else {
      EXPECT_TRUE(state.empty());
      EXPECT_TRUE(optimizer_state.isNone());
    }
    // A fresh pipeline takes its stage's part of whole states.
    Net fresh_net = make_net();
    auto fresh = parallelize(
        blocks_of(fresh_net),
        groups_of(*fresh_net),
        sgd_momentum(),
        world,
        pipeline_options(false));
    std::unordered_map<std::string, at::Tensor> values;
    for (const auto& item : reference->named_parameters()) {
      values.emplace(item.key(), item.value().detach());
    }
    fresh->load_model_state_dict(values);
    for (const auto& item : fresh->module()->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), values.at(item.key()))) << item.key();
    }
    // The reference's own optimizer state (one process, whole) into each stage.
    Net one_net = make_net();
    ParallelOptions local;
    auto one = parallelize(
        one_net, groups_of(*one_net), sgd_momentum(), comm::ProcessGroup::single_process(), local);
    train(*one, kMicroBatches);
    fresh->load_optimizer_state_dict(one->optimizer_state_dict());
    const auto stage_state = fresh->optimizer().state_dict().toGenericDict().at("state");
    const auto one_state = one->optimizer().state_dict().toGenericDict().at("state");
    EXPECT_EQ(
        stage_state.toGenericDict().size(),
        static_cast<size_t>(fresh->module()->parameters().size()));
    for (const auto& item : stage_state.toGenericDict()) {
      const at::Tensor momentum = item.value().toGenericDict().at("momentum_buffer").toTensor();
      const at::Tensor expected =
          one_state.toGenericDict().at(item.key()).toGenericDict().at("momentum_buffer").toTensor();
      EXPECT_TRUE(torch::equal(momentum, expected)) << item.key().toStringRef();
    }
  });
}

// Layers with BatchNorm, whose running statistics each replica updates on its own data.
struct NormNetImpl : torch::nn::Module {
  NormNetImpl()
      : layers(register_module(
            "layers",
            torch::nn::Sequential(
                torch::nn::Linear(kInputs, kWidth),
                torch::nn::BatchNorm1d(kWidth),
                torch::nn::ReLU(),
                torch::nn::Linear(kWidth, kWidth),
                torch::nn::BatchNorm1d(kWidth),
                torch::nn::Linear(kWidth, kClasses)))) {}
  torch::nn::Sequential layers;
};
TORCH_MODULE(NormNet);

// Whether every buffer of this rank's stage equals the other replica's (2 replicas).
bool buffers_agree_with_the_other_replica(ParallelModel& model) {
  bool agree = true;
  for (const auto& buffer : model.module()->buffers()) {
    const at::Tensor flat = buffer.reshape({-1}).to(at::kDouble);
    at::Tensor both = at::empty({2, flat.numel()}, flat.options());
    model.data_parallel_group().all_gather(both, flat);
    agree = agree && torch::equal(both[0], both[1]);
  }
  return agree;
}

TEST(PipelineModelTest, ReplicasEndEveryStepWithReplicaZerosBuffers) {
  run_on_ranks(4, [](comm::ProcessGroup& group) {
    auto world = borrow(group);
    for (const bool broadcast : {true, false}) {
      torch::manual_seed(5);
      NormNet net;
      ParallelOptions options = pipeline_options(false);
      options.ddp.broadcast_buffers = broadcast;
      auto model = parallelize(
          pipeline_blocks(net->layers, "layers"), groups_of(*net), sgd_momentum(), world, options);
      ASSERT_EQ(model->data_parallel_group().world_size(), 2); // 2 stages x 2 replicas
      for (int step = 0; step < 2; ++step) {                   // each replica its own batch
        auto [x, y] = batch_of(10 * step + model->data_parallel_group().rank());
        model->zero_grad();
        model->forward_backward(x, y, cross_entropy);
        EXPECT_TRUE(model->finish_backward());
        EXPECT_TRUE(model->step());
      }
      // Stage 1 holds the second BatchNorm, stage 0 the first: every rank has buffers.
      EXPECT_FALSE(model->module()->buffers().empty());
      EXPECT_EQ(buffers_agree_with_the_other_replica(*model), broadcast)
          << "broadcast_buffers " << broadcast;
    }
  });
}

// 2 stages x 2 replicas with ZeRO-1 over each stage's replicas: each replica trains on its
// half of every batch, in 2 micro-batches of 4 rows (no BatchNorm: the micro-batches are
// not visible in the result).
TEST(PipelineModelTest, ZeroOneOverTheReplicasTrainsLikeOneProcessAndCheckpointsWhole) {
  run_on_ranks(4, [](comm::ProcessGroup& group) {
    auto world = borrow(group);
    const auto [losses, reference] = train_reference(false);
    ParallelOptions options = pipeline_options(false);
    options.data_parallelism = DataParallelism::kZero1;
    options.pipeline.stages.num_microbatches(2);
    Net net = make_net();
    auto model = parallelize(blocks_of(net), groups_of(*net), sgd_momentum(), world, options);
    ASSERT_NE(model->describe().find("ZeRO-1"), std::string::npos) << model->describe();
    const int replica = model->data_parallel_group().rank();
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batch_of(step);
      model->zero_grad();
      const double loss = model->forward_backward(
          x.narrow(0, replica * kBatch / 2, kBatch / 2),
          y.narrow(0, replica * kBatch / 2, kBatch / 2),
          cross_entropy);
      EXPECT_TRUE(model->finish_backward());
      model->clip_grad_norm(0.5); // over every rank's pieces
      EXPECT_TRUE(model->step());
      EXPECT_TRUE(std::isfinite(loss));
    }
    const auto expected = reference->named_parameters();
    for (const auto& item : model->module()->named_parameters()) {
      expect_close(item.value(), expected[item.key()], item.key());
    }
    // The whole optimizer state, consolidated over the replicas and merged over the stages,
    // is the one process's (rank 0); loaded back, every rank steps its pieces as before.
    const c10::IValue whole = model->optimizer_state_dict();
    Net one_net = make_net();
    auto one = parallelize(
        one_net,
        groups_of(*one_net),
        sgd_momentum(),
        comm::ProcessGroup::single_process(),
        ParallelOptions{});
    train(*one, kMicroBatches);
    const auto one_state = one->optimizer_state_dict().toGenericDict().at("state").toGenericDict();
    if (group.rank() == 0) {
      const auto state = whole.toGenericDict().at("state").toGenericDict();
      ASSERT_EQ(state.size(), one_state.size());
      for (const auto& item : state) {
        expect_close(
            item.value().toGenericDict().at("momentum_buffer").toTensor(),
            one_state.at(item.key()).toGenericDict().at("momentum_buffer").toTensor(),
            item.key().toStringRef());
      }
    } else {
      EXPECT_TRUE(whole.isNone());
    }
    // A fresh ZeRO-1 pipeline given the one process's weights and optimizer state steps on
    // as the one process does (with the momentum lost, the step would differ).
    Net fresh_net = make_net();
    auto fresh =
        parallelize(blocks_of(fresh_net), groups_of(*fresh_net), sgd_momentum(), world, options);
    std::unordered_map<std::string, at::Tensor> weights;
    for (const auto& item : one_net->named_parameters()) {
      weights.emplace(item.key(), item.value().detach().clone());
    }
    fresh->load_model_state_dict(weights);
    fresh->load_optimizer_state_dict(one->optimizer_state_dict());
    auto [x, y] = batch_of(kSteps);
    for (ParallelModel* stepped : {one.get(), fresh.get()}) {
      const bool pipelined = stepped == fresh.get();
      stepped->zero_grad();
      stepped->forward_backward(
          pipelined ? x.narrow(0, replica * kBatch / 2, kBatch / 2) : x,
          pipelined ? y.narrow(0, replica * kBatch / 2, kBatch / 2) : y,
          cross_entropy);
      EXPECT_TRUE(stepped->finish_backward());
      EXPECT_TRUE(stepped->step());
    }
    const auto stepped_reference = one_net->named_parameters();
    for (const auto& item : fresh->module()->named_parameters()) {
      expect_close(item.value(), stepped_reference[item.key()], "after loading: " + item.key());
    }
  });
}

TEST(PipelineModelTest, WhatDoesNotComposeWithAPipelineIsAnOptionError) {
  auto expect_option_error = [](ParallelOptions options, int world, const std::string& option) {
    try {
      check_parallel_options(options, world);
      ADD_FAILURE() << "expected an OptionError naming " << option;
    } catch (const OptionError& error) {
      EXPECT_EQ(error.option(), option) << error.what();
    }
  };
  ParallelOptions zero2 = pipeline_options(false);
  zero2.data_parallelism = DataParallelism::kZero2;
  expect_option_error(zero2, 4, "ParallelOptions::pipeline.size");
  ParallelOptions checkpointing = pipeline_options(false);
  checkpointing.activation_checkpointing.sequential = "blocks";
  checkpointing.activation_checkpointing.num_splits = 2;
  expect_option_error(checkpointing, 4, "ParallelOptions::pipeline.size");
  expect_option_error(pipeline_options(false), 3, "ParallelOptions::pipeline.size");
  precision::PrecisionPolicyOptions o3;
  o3.use_amp = true;
  o3.opt_level = "O3";
  o3.dtype = "bfloat16";
  ParallelOptions cast = pipeline_options(false);
  cast.precision = precision::resolve_precision_policy(o3);
  expect_option_error(cast, 4, "ParallelOptions::precision");
  // Blocks need a pipeline.
  Net net = make_net();
  ParallelOptions none;
  try {
    parallelize(
        blocks_of(net),
        groups_of(*net),
        sgd_momentum(),
        comm::ProcessGroup::single_process(),
        none);
    ADD_FAILURE() << "expected an OptionError";
  } catch (const OptionError& error) {
    EXPECT_EQ(error.option(), "ParallelOptions::pipeline.size");
  }
  // And a module that is not a chain of blocks cannot be cut into stages: a pipeline given
  // with it is refused, not trained as plain data parallelism.
  ParallelOptions staged;
  staged.pipeline.size = 2;
  try {
    parallelize(
        torch::nn::AnyModule(net),
        groups_of(*net),
        sgd_momentum(),
        comm::ProcessGroup::single_process(),
        staged);
    ADD_FAILURE() << "a pipeline over a module that is not a chain of blocks was accepted";
  } catch (const OptionError& error) {
    EXPECT_EQ(error.option(), "ParallelOptions::pipeline.size");
    EXPECT_NE(std::string(error.what()).find("not a chain of blocks"), std::string::npos)
        << error.what();
  }
}

// A module that is a chain of blocks (a models::TrunkHeadModel, here of Net's layers) given
// with a pipeline size is cut into stages like its blocks: the same losses as one process.
TEST(PipelineModelTest, AModuleThatIsAChainOfBlocksIsCutIntoStages) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const auto [expected_losses, reference] = train_reference(/*autocast=*/false);
    Net net = make_net();
    models::TrunkHeadModel chain(models::Trunk{net->layers, kClasses}, torch::nn::Sequential());
    auto model = parallelize(
        chain, groups_of(*chain), sgd_momentum(), borrow(group), pipeline_options(false));
    ASSERT_NE(model->pipeline(), nullptr);
    const std::vector<double> losses = train(*model, /*calls=*/1);
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(losses[step], expected_losses[step], kTolerance) << "step " << step;
    }
  });
}

} // namespace
} // namespace largo::parallel::pipeline_model_test
