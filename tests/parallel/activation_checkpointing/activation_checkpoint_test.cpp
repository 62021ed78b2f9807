// Activation checkpointing: checkpointed segments give the gradients of the plain model
// (bit for bit on the CPU in fp32, where the kernels are deterministic), replay dropout and
// autocast, leave BatchNorm statistics and the RNG as the plain model does, and let each
// parameter's grad-accumulator post-hooks fire exactly once per backward (what DDP's and
// ZeRO-2's gradient reduction rely on).
#include <largo/core/error.h>
#include <largo/core/memory_tracker.h>
#include <largo/core/rng_state.h>
#include <largo/core/torch_compat.h>
#include <largo/models/model_factory.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>
#include <largo/parallel/activation_checkpointing/checkpointed_trunk.h>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <map>
#include <optional>

namespace largo::parallel::activation_checkpoint_test {
namespace {

using models::ModelOptions;
using models::TrunkHeadModel;

// ---- models and one training step ----------------------------------------------------

// Small versions of the zoo's models, fast on 2 CPU cores: the small CNN with dropout (4
// blocks), ResNet-18 with the CIFAR stem (10 blocks), a 3-layer ViT with dropout and
// attention dropout (5 blocks).
ModelOptions small_cnn_options() {
  ModelOptions options;
  options.trunk_name = "small_cnn";
  options.in_channels = 1;
  options.image_size = 16;
  options.small_cnn.channels = {8, 16, 16, 32};
  options.small_cnn.dropout = 0.5;
  return options;
}

ModelOptions resnet18_options() {
  ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = 18;
  options.resnet.stem = "cifar";
  options.in_channels = 3;
  options.image_size = 8;
  return options;
}

ModelOptions vit_options() {
  ModelOptions options;
  options.trunk_name = "vision_transformer";
  options.in_channels = 3;
  options.image_size = 16;
  options.vit.patch_size = 4;
  options.vit.num_layers = 3;
  options.vit.num_heads = 4;
  options.vit.hidden_dim = 32;
  options.vit.mlp_dim = 64;
  options.vit.dropout = 0.1;
  options.vit.attention_dropout = 0.1;
  options.vit.drop_path_rate = 0.2; // stochastic depth draws from the generator too
  return options;
}

TrunkHeadModel build(const ModelOptions& options) {
  seed_everything(7); // both copies of a model start from the same weights
  return models::build_model(options);
}

struct Batch {
  at::Tensor images;
  at::Tensor labels;
};

Batch make_batch(const ModelOptions& options, int64_t batch_size) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1234);
  return {
      torch::randn(
          {batch_size, options.in_channels, options.image_size, options.image_size}, generator),
      torch::randint(0, options.num_classes, {batch_size}, generator, torch::kLong)};
}

struct StepResult {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  std::map<std::string, at::Tensor> buffers;
  at::Tensor rng_after; // the CPU generator's state after forward + backward
};

// zero_grad -> forward (checkpointed at `boundaries`, or plain) -> cross-entropy -> backward,
// with the RNG seeded so both variants draw the same dropout masks.
StepResult train_step(
    TrunkHeadModel& model,
    const Batch& batch,
    std::optional<std::vector<int64_t>> boundaries,
    uint64_t seed = 99) {
  for (auto& parameter : model->parameters()) {
    parameter.mutable_grad() = at::Tensor();
  }
  model->train();
  seed_everything(seed);
  at::Tensor logits;
  if (boundaries) {
    CheckpointedTrunk trunk(model, *boundaries);
    logits = trunk.forward(batch.images);
  } else {
    logits = model->forward(batch.images);
  }
  at::Tensor loss = torch::nn::functional::cross_entropy(logits, batch.labels);
  loss.backward();
  StepResult result;
  result.loss = loss.detach();
  for (const auto& item : model->named_parameters()) {
    result.grads[item.key()] =
        item.value().grad().defined() ? item.value().grad().clone() : at::Tensor();
  }
  for (const auto& item : model->named_buffers()) {
    result.buffers[item.key()] = item.value().clone();
  }
  result.rng_after = cpu_rng_state();
  return result;
}

void expect_bitwise_equal(
    const std::map<std::string, at::Tensor>& expected,
    const std::map<std::string, at::Tensor>& actual,
    const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (const auto& [name, tensor] : expected) {
    const at::Tensor& other = actual.at(name);
    ASSERT_EQ(tensor.defined(), other.defined()) << what << " " << name;
    if (tensor.defined()) {
      EXPECT_TRUE(torch::equal(tensor, other))
          << what << " " << name << " differs; max abs difference "
          << (tensor.to(torch::kDouble) - other.to(torch::kDouble)).abs().max().item<double>();
    }
  }
}

// For 1..4 splits (as PyTorch's checkpoint_sequential cuts) and for the cut plan() balances
// by measured activation bytes: loss, every gradient, every buffer and the RNG state after
// the step equal the plain model's, bit for bit.
void expect_checkpointing_changes_nothing(const ModelOptions& options, int64_t batch_size) {
  TrunkHeadModel plain = build(options);
  const Batch batch = make_batch(options, batch_size);
  const StepResult expected = train_step(plain, batch, std::nullopt);
  for (const auto& [name, grad] : expected.grads) {
    ASSERT_TRUE(grad.defined()) << name << " has no gradient without checkpointing";
  }

  std::vector<std::vector<int64_t>> cuts;
  TrunkHeadModel probe = build(options);
  for (int64_t splits = 1; splits <= 4; ++splits) {
    cuts.push_back(segment_boundaries_by_count(probe->num_trunk_blocks(), splits));
  }
  cuts.push_back(CheckpointedTrunk::plan(
                     probe,
                     TrunkCheckpointingOptions(3),
                     {options.in_channels, options.image_size, options.image_size})
                     .boundaries());
  for (const auto& cut : cuts) {
    SCOPED_TRACE(
        ::testing::Message() << options.trunk_name << " cut at " << cut.size() - 1
                             << " segments, last boundary " << cut[cut.size() - 2]);
    TrunkHeadModel model = build(options);
    const StepResult actual = train_step(model, batch, cut);
    EXPECT_TRUE(torch::equal(expected.loss, actual.loss));
    expect_bitwise_equal(expected.grads, actual.grads, "gradient");
    expect_bitwise_equal(expected.buffers, actual.buffers, "buffer");
    EXPECT_TRUE(torch::equal(expected.rng_after, actual.rng_after))
        << "the recompute changed the caller's RNG state";
  }
}

class ActivationCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
  }
};

TEST_F(ActivationCheckpointTest, SmallCnnWithDropoutGradientsMatchBitwise) {
  expect_checkpointing_changes_nothing(small_cnn_options(), 8);
}

TEST_F(ActivationCheckpointTest, ResNet18GradientsMatchBitwise) {
  expect_checkpointing_changes_nothing(resnet18_options(), 4);
}

TEST_F(ActivationCheckpointTest, VitWithDropoutGradientsMatchBitwise) {
  expect_checkpointing_changes_nothing(vit_options(), 4);
}

// Gradient accumulation: two micro-batches accumulate into .grad exactly as without
// checkpointing (each backward adds once).
TEST_F(ActivationCheckpointTest, GradientAccumulationMatchesBitwise) {
  const ModelOptions options = vit_options();
  const Batch first = make_batch(options, 4);
  const Batch second{first.images.flip(0) * 0.5, first.labels.flip(0)};
  std::map<std::string, at::Tensor> expected;
  for (bool checkpointed : {false, true}) {
    TrunkHeadModel model = build(options);
    CheckpointedTrunk trunk(model, segment_boundaries_by_count(model->num_trunk_blocks(), 3));
    uint64_t seed = 40;
    for (const Batch* batch : {&first, &second}) {
      seed_everything(seed++);
      at::Tensor logits =
          checkpointed ? trunk.forward(batch->images) : model->forward(batch->images);
      torch::nn::functional::cross_entropy(logits, batch->labels).backward();
    }
    std::map<std::string, at::Tensor> grads;
    for (const auto& item : model->named_parameters()) {
      grads[item.key()] = item.value().grad().clone();
    }
    if (!checkpointed) {
      expected = grads;
    } else {
      expect_bitwise_equal(expected, grads, "accumulated gradient");
    }
  }
}

// Several SGD steps: parameters and BatchNorm running statistics (mean, var and
// num_batches_tracked) stay identical to the plain run's, so the recompute did not update
// the statistics a second time.
TEST_F(ActivationCheckpointTest, BatchNormStatisticsMatchAfterSeveralSteps) {
  const ModelOptions options = resnet18_options();
  const Batch batch = make_batch(options, 4);
  std::map<std::string, at::Tensor> expected_buffers;
  std::map<std::string, at::Tensor> expected_parameters;
  for (bool checkpointed : {false, true}) {
    TrunkHeadModel model = build(options);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int step = 0; step < 3; ++step) {
      train_step(
          model,
          batch,
          checkpointed ? std::optional(segment_boundaries_by_count(model->num_trunk_blocks(), 3))
                       : std::nullopt,
          /*seed=*/step);
      sgd.step();
    }
    std::map<std::string, at::Tensor> buffers;
    std::map<std::string, at::Tensor> parameters;
    for (const auto& item : model->named_buffers()) {
      buffers[item.key()] = item.value().clone();
    }
    for (const auto& item : model->named_parameters()) {
      parameters[item.key()] = item.value().detach().clone();
    }
    if (!checkpointed) {
      expected_buffers = buffers;
      expected_parameters = parameters;
      EXPECT_EQ(buffers.at("trunk.0.bn1.num_batches_tracked").item<int64_t>(), 3);
    } else {
      expect_bitwise_equal(expected_buffers, buffers, "buffer");
      expect_bitwise_equal(expected_parameters, parameters, "parameter");
    }
  }
}

// The control for the test above: a segment that does not declare its BatchNorm buffers
// updates them again in the recompute, so the statistics do differ.
TEST_F(ActivationCheckpointTest, UndeclaredBatchNormBuffersAreUpdatedTwice) {
  torch::nn::BatchNorm1d bn(4);
  bn->train();
  at::Tensor x = torch::randn({8, 4});
  checkpoint(
      [&](const std::vector<at::Tensor>& inputs) {
        return std::vector<at::Tensor>{bn->forward(inputs[0])};
      },
      {x},
      CheckpointOptions().parameters(bn->parameters()))
      .front()
      .sum()
      .backward();
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 2);

  torch::nn::BatchNorm1d declared(4);
  declared->train();
  checkpoint_modules(
      {declared.ptr()},
      [&](const std::vector<at::Tensor>& inputs) {
        return std::vector<at::Tensor>{declared->forward(inputs[0])};
      },
      {x})
      .front()
      .sum()
      .backward();
  EXPECT_EQ(declared->num_batches_tracked.item<int64_t>(), 1);
}

// ---- RNG -----------------------------------------------------------------------------

struct DropoutRun {
  at::Tensor input_grad;
  at::Tensor weight_grad;
  at::Tensor rng_after;
};

// y = dropout(x * w, 0.5); loss = sum(y * y).
DropoutRun dropout_run(bool checkpointed, bool preserve_rng_state) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor x = torch::randn({64, 16}, generator).requires_grad_();
  at::Tensor w = torch::randn({16}, generator).requires_grad_();
  auto segment = [&](const std::vector<at::Tensor>& inputs) {
    return std::vector<at::Tensor>{torch::dropout(inputs[0] * w, 0.5, /*train=*/true)};
  };
  seed_everything(3);
  at::Tensor y =
      checkpointed ? checkpoint(
                         segment,
                         {x},
                         CheckpointOptions().parameters({w}).preserve_rng_state(preserve_rng_state))
                         .front()
                   : segment({x}).front();
  // Draws between forward and backward, as a later dropout layer would: the recompute must
  // replay the forward's RNG state, not the one it finds.
  torch::rand({100});
  (y * y).sum().backward();
  return {x.grad().clone(), w.grad().clone(), cpu_rng_state()};
}

TEST_F(ActivationCheckpointTest, DropoutRecomputesTheSameMask) {
  const DropoutRun plain = dropout_run(false, true);
  const DropoutRun checkpointed = dropout_run(true, true);
  EXPECT_TRUE(torch::equal(plain.input_grad, checkpointed.input_grad));
  EXPECT_TRUE(torch::equal(plain.weight_grad, checkpointed.weight_grad));
  EXPECT_TRUE(torch::equal(plain.rng_after, checkpointed.rng_after));
  // The control: without the stashed state the recompute draws another mask.
  const DropoutRun unpreserved = dropout_run(true, false);
  EXPECT_FALSE(torch::equal(plain.input_grad, unpreserved.input_grad));
}

// ---- inputs and outputs --------------------------------------------------------------

// The first segment's input (the images) does not require grad; its parameters still get
// their gradients (PyTorch's reentrant checkpoint gives them none), and the input none.
TEST_F(ActivationCheckpointTest, FirstSegmentWithoutGradInputs) {
  torch::nn::Linear linear(8, 4);
  at::Tensor images = torch::randn({5, 8});
  ASSERT_FALSE(images.requires_grad());
  auto segment = [&](const std::vector<at::Tensor>& inputs) {
    return std::vector<at::Tensor>{torch::tanh(linear->forward(inputs[0]))};
  };
  segment({images}).front().pow(2).sum().backward();
  const at::Tensor expected_weight = linear->weight.grad().clone();
  const at::Tensor expected_bias = linear->bias.grad().clone();
  linear->zero_grad();

  at::Tensor out = checkpoint_modules({linear.ptr()}, segment, {images}).front();
  EXPECT_TRUE(out.requires_grad());
  out.pow(2).sum().backward();
  EXPECT_TRUE(torch::equal(linear->weight.grad(), expected_weight));
  EXPECT_TRUE(torch::equal(linear->bias.grad(), expected_bias));
  EXPECT_FALSE(images.grad().defined());
}

// Several outputs: two floating ones (one of them unused by the loss) and an integer one.
TEST_F(ActivationCheckpointTest, SeveralOutputs) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor w = torch::randn({6, 6}, generator).requires_grad_();
  at::Tensor x = torch::randn({4, 6}, generator).requires_grad_();
  at::Tensor z = torch::randn({4, 6}, generator).requires_grad_();
  auto segment = [&](const std::vector<at::Tensor>& inputs) {
    at::Tensor h = torch::relu(inputs[0].matmul(w));
    return std::vector<at::Tensor>{
        h, (h * inputs[1]).sum(1), h.argmax(1), torch::sigmoid(inputs[1])};
  };
  auto loss_of = [](const std::vector<at::Tensor>& outputs) {
    return outputs[0].pow(2).sum() + outputs[1].sum(); // outputs[3] is unused
  };
  loss_of(segment({x, z})).backward();
  const at::Tensor gw = w.grad().clone();
  const at::Tensor gx = x.grad().clone();
  const at::Tensor gz = z.grad().clone();
  w.mutable_grad() = at::Tensor();
  x.mutable_grad() = at::Tensor();
  z.mutable_grad() = at::Tensor();

  auto outputs = checkpoint(segment, {x, z}, CheckpointOptions().parameters({w}));
  ASSERT_EQ(outputs.size(), 4u);
  EXPECT_TRUE(outputs[0].requires_grad());
  EXPECT_FALSE(outputs[2].requires_grad()); // integer: not differentiable
  EXPECT_EQ(outputs[2].scalar_type(), torch::kLong);
  loss_of(outputs).backward();
  EXPECT_TRUE(torch::equal(w.grad(), gw));
  EXPECT_TRUE(torch::equal(x.grad(), gx));
  EXPECT_TRUE(torch::equal(z.grad(), gz));
}

TEST_F(ActivationCheckpointTest, WithoutGradModeItJustRunsTheSegment) {
  torch::nn::Linear linear(3, 3);
  torch::NoGradGuard no_grad;
  int calls = 0;
  at::Tensor out = checkpoint_modules(
                       {linear.ptr()},
                       [&](const std::vector<at::Tensor>& inputs) {
                         ++calls;
                         return std::vector<at::Tensor>{linear->forward(inputs[0])};
                       },
                       {torch::ones({2, 3})})
                       .front();
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(out.requires_grad());
}

// A leaf the segment uses but does not declare would silently get no gradient: refused.
TEST_F(ActivationCheckpointTest, UndeclaredParameterIsAnError) {
  at::Tensor declared = torch::ones({3}, torch::requires_grad());
  at::Tensor hidden = torch::ones({3}, torch::requires_grad());
  at::Tensor out = checkpoint(
                       [&](const std::vector<at::Tensor>& inputs) {
                         return std::vector<at::Tensor>{inputs[0] * declared * hidden};
                       },
                       {torch::ones({3})},
                       CheckpointOptions().parameters({declared}))
                       .front();
  try {
    out.sum().backward();
    FAIL() << "expected largo::Error";
  } catch (const Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("neither one of its inputs nor one of its declared"),
        std::string::npos)
        << error.what();
  }
}

TEST_F(ActivationCheckpointTest, DoubleBackwardIsRefused) {
  at::Tensor w = torch::ones({3}, torch::requires_grad());
  at::Tensor out = checkpoint(
                       [&](const std::vector<at::Tensor>& inputs) {
                         return std::vector<at::Tensor>{(inputs[0] * w).pow(2)};
                       },
                       {torch::ones({3})},
                       CheckpointOptions().parameters({w}))
                       .front();
  EXPECT_THROW(
      torch::autograd::grad({out.sum()}, {w}, {}, /*retain_graph=*/true, /*create_graph=*/true),
      Error);
}

// ---- hooks: what DDP and ZeRO-2 rely on ----------------------------------------------

struct CountingHook : torch::autograd::FunctionPostHook {
  CountingHook(int* count, const at::Tensor& parameter, bool* grad_missing)
      : count(count), parameter(parameter), grad_missing(grad_missing) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    ++*count;
    // A reducer reads .grad from this hook: it must already hold the gradient.
    *grad_missing = *grad_missing || !parameter.grad().defined();
    return outputs;
  }
  int* count;
  at::Tensor parameter;
  bool* grad_missing;
};

TEST_F(ActivationCheckpointTest, GradAccumulatorHooksFireOncePerParameterPerBackward) {
  const ModelOptions options = resnet18_options();
  TrunkHeadModel model = build(options);
  const Batch batch = make_batch(options, 4);
  auto parameters = model->parameters();
  std::vector<int> counts(parameters.size(), 0);
  bool grad_missing = false;
  // The accumulators must stay alive, or the hooks are dropped with them.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  for (size_t i = 0; i < parameters.size(); ++i) {
    accumulators.push_back(torch::autograd::impl::grad_accumulator(parameters[i]));
    accumulators.back()->add_post_hook(
        std::make_unique<CountingHook>(&counts[i], parameters[i], &grad_missing));
  }
  CheckpointedTrunk trunk(model, segment_boundaries_by_count(model->num_trunk_blocks(), 4));
  // Two micro-batches of gradient accumulation: one firing per parameter per backward.
  for (int micro_step = 1; micro_step <= 2; ++micro_step) {
    torch::nn::functional::cross_entropy(trunk.forward(batch.images), batch.labels).backward();
    for (size_t i = 0; i < parameters.size(); ++i) {
      EXPECT_EQ(counts[i], micro_step) << "parameter " << i << " of " << parameters.size();
    }
  }
  EXPECT_FALSE(grad_missing);
}

// ---- autocast ------------------------------------------------------------------------

// The recompute runs under the forward's autocast state even though backward() is called
// outside autocast: the gradients are the plain autocast run's, which differ from fp32's.
TEST_F(ActivationCheckpointTest, RecomputeUsesTheForwardsAutocastState) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(21);
  torch::nn::Linear first(16, 16);
  torch::nn::Linear second(16, 16);
  at::Tensor x = torch::randn({8, 16}, generator);
  auto segment = [&](const std::vector<at::Tensor>& inputs) {
    return std::vector<at::Tensor>{second->forward(torch::relu(first->forward(inputs[0])))};
  };
  auto run = [&](bool autocast, bool checkpointed) {
    first->zero_grad();
    second->zero_grad();
    compat::set_autocast_enabled(c10::DeviceType::CPU, autocast);
    compat::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
    at::Tensor out = checkpointed
                         ? checkpoint_modules({first.ptr(), second.ptr()}, segment, {x}).front()
                         : segment({x}).front();
    compat::set_autocast_enabled(c10::DeviceType::CPU, false);
    at::autocast::clear_cache();
    out.to(torch::kFloat).pow(2).sum().backward();
    return first->weight.grad().clone();
  };
  const at::Tensor fp32 = run(false, false);
  const at::Tensor autocast_plain = run(true, false);
  const at::Tensor autocast_checkpointed = run(true, true);
  EXPECT_TRUE(torch::equal(autocast_plain, autocast_checkpointed));
  EXPECT_FALSE(torch::equal(autocast_plain, fp32)); // the control: bf16 does change them
  EXPECT_FALSE(compat::is_autocast_enabled(c10::DeviceType::CPU)); // state put back
}

// ---- memory --------------------------------------------------------------------------

// The mechanism itself: a checkpointed forward keeps only segment inputs, so the measured
// peak of a step falls.
TEST_F(ActivationCheckpointTest, CheckpointingLowersThePeakMemoryOfAStep) {
  torch::nn::Sequential net;
  for (int i = 0; i < 16; ++i) {
    net->push_back(torch::nn::Linear(128, 128));
    net->push_back(torch::nn::Tanh());
  }
  at::Tensor x = torch::randn({512, 128});
  MemoryTracker tracker(torch::kCPU);
  auto peak_of = [&](int64_t segments) {
    net->zero_grad(/*set_to_none=*/false); // the gradients stay allocated: activations only
    tracker.start_window();
    {
      at::Tensor out = segments == 0 ? net->forward(x) : checkpoint_sequential(net, segments, x);
      out.pow(2).sum().backward();
    }
    return tracker.window_peak_bytes();
  };
  peak_of(0); // the first step allocates the gradients, which later steps keep
  const int64_t plain = peak_of(0);
  const int64_t checkpointed = peak_of(4);
  // 32 blocks holding 256 KiB each (a Linear its input, a Tanh its output): the plain step
  // holds all of them, the checkpointed one the segment inputs, the last segment and one
  // recomputed segment at a time.
  EXPECT_LT(static_cast<double>(checkpointed), 0.6 * static_cast<double>(plain))
      << "plain " << plain << " bytes, checkpointed " << checkpointed << " bytes";
}

// ---- segment boundaries --------------------------------------------------------------

TEST(SegmentBoundariesTest, ByCountMatchesPyTorchsCheckpointSequential) {
  // torch.utils.checkpoint.checkpoint_sequential: segment_size = n // segments, the last
  // segment takes the rest.
  EXPECT_EQ(segment_boundaries_by_count(10, 1), (std::vector<int64_t>{0, 10}));
  EXPECT_EQ(segment_boundaries_by_count(10, 3), (std::vector<int64_t>{0, 3, 6, 10}));
  EXPECT_EQ(segment_boundaries_by_count(18, 4), (std::vector<int64_t>{0, 4, 8, 12, 18}));
  EXPECT_EQ(segment_boundaries_by_count(4, 4), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_THROW(segment_boundaries_by_count(3, 4), Error);
  EXPECT_THROW(segment_boundaries_by_count(3, 0), Error);
}

TEST(SegmentBoundariesTest, BalancedMinimizesTheLargestSegment) {
  EXPECT_EQ(balanced_segment_boundaries({1, 1, 1, 1}, 2), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(balanced_segment_boundaries({5, 1, 1, 1}, 1), (std::vector<int64_t>{0, 4}));
  // A heavy block on each end: each gets a segment of its own.
  EXPECT_EQ(
      balanced_segment_boundaries({10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 10}, 3),
      (std::vector<int64_t>{0, 1, 10, 11}));
  // Early blocks heavy (a ResNet's activations): the first segments are short. The best
  // largest segment is 12 ([8] [8, 4] [4, 2, 2, 1, 1]); equal counts would give 16.
  auto cut = balanced_segment_boundaries({8, 8, 4, 4, 2, 2, 1, 1}, 3);
  EXPECT_EQ(cut, (std::vector<int64_t>{0, 1, 3, 8}));
  EXPECT_THROW(balanced_segment_boundaries({1, 1}, 3), Error);
  EXPECT_THROW(balanced_segment_boundaries({1, -1}, 1), Error);
}

TEST(SegmentBoundariesTest, CheckpointSequentialRejectsBadBoundaries) {
  torch::nn::Sequential net(torch::nn::Linear(2, 2), torch::nn::ReLU());
  at::Tensor x = torch::ones({1, 2});
  EXPECT_THROW(checkpoint_sequential(net, std::vector<int64_t>{0, 1}, x), Error);
  EXPECT_THROW(checkpoint_sequential(net, std::vector<int64_t>{0, 0, 2}, x), Error);
  EXPECT_NO_THROW(checkpoint_sequential(net, std::vector<int64_t>{0, 1, 2}, x));
}

// ---- CUDA ----------------------------------------------------------------------------

TEST_F(ActivationCheckpointTest, CudaDropoutAndAutocastRecomputeIdentically) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device: the CUDA RNG and CUDA autocast paths need one";
  }
  const torch::Device cuda(torch::kCUDA, 0);
  torch::nn::Linear linear(32, 32);
  linear->to(cuda);
  at::Tensor x = torch::randn({16, 32}, torch::TensorOptions().device(cuda));
  auto segment = [&](const std::vector<at::Tensor>& inputs) {
    return std::vector<at::Tensor>{torch::dropout(linear->forward(inputs[0]), 0.5, true)};
  };
  auto run = [&](bool checkpointed) {
    linear->zero_grad();
    torch::manual_seed(17);
    compat::set_autocast_enabled(c10::DeviceType::CUDA, true);
    at::Tensor out = checkpointed ? checkpoint_modules({linear.ptr()}, segment, {x}).front()
                                  : segment({x}).front();
    compat::set_autocast_enabled(c10::DeviceType::CUDA, false);
    at::autocast::clear_cache();
    EXPECT_EQ(out.scalar_type(), at::kHalf);
    out.to(torch::kFloat).pow(2).sum().backward();
    return linear->weight.grad().clone();
  };
  EXPECT_TRUE(torch::equal(run(false), run(true)));
}

} // namespace
} // namespace largo::parallel::activation_checkpoint_test
