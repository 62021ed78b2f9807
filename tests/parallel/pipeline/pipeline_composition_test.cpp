// What composes with pipeline parallelism, each against one process doing the same
// (2 pipeline ranks over Gloo on 127.0.0.1): loss scaling with found_inf agreed by every
// stage, global-norm clipping and LARC across stages, gradient accumulation, checkpointed
// stages, bfloat16 autocast, and BatchNorm per micro-batch.
// Tolerances as in pipeline_parallel_test.cpp: float32 reassociation of at most ~18-term
// sums, 3 steps, parameters within 1e-5.
#include <largo/core/error.h>
#include <largo/optim/grad_clipping.h>
#include <largo/optim/larc.h>
#include <largo/parallel/parallelize.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>
#include <largo/precision/autocast.h>
#include <largo/precision/grad_scaler.h>

#include <limits>

#include "comm/distributed_test_util.h"
#include "parallel/pipeline_test_util.h"

namespace largo::parallel::pipeline_composition_test {
namespace {

using namespace largo::parallel::testing;
using largo::testing::run_on_ranks;

constexpr int kSteps = 3;
constexpr int64_t kBatch = 16;
constexpr double kTolerance = 1e-5;

std::vector<at::Tensor> gradients_of(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (const auto& parameter : parameters) {
    grads.push_back(parameter.grad());
  }
  return grads;
}

std::unique_ptr<optim::Optimizer> make_larc(const torch::nn::Module& module) {
  optim::LARCOptions larc;
  larc.trust_coefficient = 0.02;
  larc.clip = true;
  return std::make_unique<optim::LARC>(make_sgd(module), larc);
}

// Poisons the gradient of parameter `name` with an infinity, where this rank holds it.
void poison(const torch::nn::Module& module, const std::string& name) {
  const auto parameters = module.named_parameters(); // find() points into this dict
  if (const auto* parameter = parameters.find(name)) {
    parameter->grad().view({-1})[0] = std::numeric_limits<float>::infinity();
  }
}

precision::GradScalerOptions scaler_options() {
  precision::GradScalerOptions options;
  options.init_scale = 1024.0;
  options.growth_interval = 1;
  return options;
}

// Step 1's first trunk gradient is infinite on stage 0 only: every stage must skip that step
// and back off alike. Clipping binds (max norm 0.05) and LARC adapts every layer.
TEST(PipelineCompositionTest, LossScalingClippingAndLarcAgreeAcrossStages) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const std::string poisoned = "trunk.0.linear.weight";
    auto reference = make_model();
    auto reference_optimizer = make_larc(*reference);
    precision::GradScaler reference_scaler(scaler_options());
    std::vector<double> reference_norms;
    for (int step = 0; step < kSteps; ++step) {
      auto [images, labels] = global_batch(step, kBatch);
      reference_optimizer->zero_grad();
      reference_scaler.scale(cross_entropy(reference->forward(images), labels)).backward();
      if (step == 1) {
        poison(*reference, poisoned);
      }
      reference_scaler.unscale_(gradients_of(reference->parameters()));
      if (!reference_scaler.found_inf()) {
        reference_norms.push_back(optim::clip_grad_norm(reference->parameters(), 0.05));
      }
      reference_scaler.step([&] { reference_optimizer->step(); });
      reference_scaler.update();
    }

    auto model = make_model();
    PipelineParallel pipeline(
        pipeline_blocks(*model),
        borrow(group),
        nullptr,
        PipelineParallelOptions().num_microbatches(4));
    auto optimizer = make_larc(*pipeline.module());
    auto options = scaler_options();
    options.found_inf_reducer = pipeline.found_inf_reducer();
    precision::GradScaler scaler(options);
    std::vector<double> norms;
    for (int step = 0; step < kSteps; ++step) {
      auto [images, labels] = global_batch(step, kBatch);
      optimizer->zero_grad();
      pipeline.forward_backward(images, labels, cross_entropy, [&](const at::Tensor& loss) {
        return scaler.scale(loss);
      });
      pipeline.reduce_gradients();
      if (step == 1) {
        poison(*pipeline.module(), poisoned);
      }
      scaler.unscale_(gradients_of(pipeline.parameters()));
      if (!scaler.found_inf()) {
        norms.push_back(pipeline.clip_grad_norm(0.05));
      }
      scaler.step([&] { optimizer->step(); });
      scaler.update();
    }
    EXPECT_EQ(scaler.get_scale(), reference_scaler.get_scale()); // 1024 -> 2048 -> 1024 -> 2048
    ASSERT_EQ(norms.size(), reference_norms.size());
    for (size_t i = 0; i < norms.size(); ++i) {
      EXPECT_NEAR(norms[i], reference_norms[i], 1e-5 * reference_norms[i]);
      EXPECT_GT(norms[i], 0.05); // the clip did bind
    }
    EXPECT_LT(max_difference(pipeline, *reference), kTolerance);
  });
}

// Two accumulation steps of half a batch each, checkpointed stages, for 1f1b and
// interleaving: like one process on the whole batch.
TEST(PipelineCompositionTest, GradientAccumulationWithCheckpointedStages) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto reference = make_model();
    train_reference(reference, kSteps, kBatch);
    for (auto [kind, virtual_stages] :
         {std::pair{PipelineScheduleKind::kOneFOneB, 1},
          std::pair{PipelineScheduleKind::kInterleaved1F1B, 2}}) {
      auto model = make_model();
      PipelineParallel pipeline(
          pipeline_blocks(*model),
          borrow(group),
          nullptr,
          PipelineParallelOptions()
              .schedule(kind)
              .virtual_stages(virtual_stages)
              .num_microbatches(4)
              .checkpoint_stages(true));
      auto sgd = make_sgd(*pipeline.module());
      for (int step = 0; step < kSteps; ++step) {
        auto [images, labels] = global_batch(step, kBatch);
        sgd->zero_grad();
        for (int half = 0; half < 2; ++half) {
          pipeline.forward_backward(
              replica_slice(images, half, 2),
              replica_slice(labels, half, 2),
              cross_entropy,
              [](const at::Tensor& loss) { return loss / 2; });
        }
        pipeline.reduce_gradients();
        sgd->step();
      }
      EXPECT_LT(max_difference(pipeline, *reference), kTolerance) << pipeline.describe();
    }
    auto model = make_model();
    EXPECT_THROW(
        PipelineParallel(
            pipeline_blocks(*model),
            borrow(group),
            nullptr,
            PipelineParallelOptions()
                .schedule(PipelineScheduleKind::kZeroBubbleH1)
                .checkpoint_stages(true)),
        OptionError); // check_pipeline_parallel_options, below
  });
}

// zb_h1 splits a stage's backward into an input pass and a later weight pass; a checkpointed
// stage is one autograd node, so the weight pass would recompute it a second time. The rule is
// stated once, by the library, in its own option names: the constructor and
// check_parallel_options (a run's validation before anything is built) both apply it.
TEST(PipelineCompositionTest, CheckpointedStagesWithZbH1AreRefusedByOptionName) {
  const auto zb_h1 = PipelineParallelOptions()
                         .schedule(PipelineScheduleKind::kZeroBubbleH1)
                         .checkpoint_stages(true);
  try {
    check_pipeline_parallel_options(zb_h1);
    ADD_FAILURE() << "expected an OptionError";
  } catch (const OptionError& error) {
    EXPECT_EQ(error.option(), "PipelineParallelOptions::checkpoint_stages");
    EXPECT_EQ(error.value(), "true");
    EXPECT_NE(
        error.expected().find("false with PipelineParallelOptions::schedule = zb_h1"),
        std::string::npos)
        << error.what();
  }
  ParallelOptions parallel;
  parallel.pipeline.size = 2;
  parallel.pipeline.stages = zb_h1;
  EXPECT_THROW(check_parallel_options(parallel, 2), OptionError);

  EXPECT_NO_THROW(check_pipeline_parallel_options(
      PipelineParallelOptions().schedule(PipelineScheduleKind::kZeroBubbleH1)));
  for (PipelineScheduleKind kind :
       {PipelineScheduleKind::kGPipe,
        PipelineScheduleKind::kOneFOneB,
        PipelineScheduleKind::kInterleaved1F1B}) {
    EXPECT_NO_THROW(check_pipeline_parallel_options(
        PipelineParallelOptions().schedule(kind).checkpoint_stages(true)))
        << to_string(kind);
  }
}

// One step of one process running the same micro-batches as gradient-accumulation steps,
// each forward (and loss) under `autocast`, each backward outside it. What a pipeline
// computes, stage by stage, in the same order. Returns the mean loss.
template <typename Model>
double accumulate_microbatches(
    Model& model,
    const at::Tensor& images,
    const at::Tensor& labels,
    int microbatches,
    bool autocast) {
  const int64_t size = images.size(0) / microbatches;
  double total = 0.0;
  for (int mb = 0; mb < microbatches; ++mb) {
    at::Tensor loss;
    {
      precision::AutocastGuard guard(c10::DeviceType::CPU, at::kBFloat16, autocast);
      loss = cross_entropy(
                 model->forward(images.narrow(0, mb * size, size)),
                 labels.narrow(0, mb * size, size)) /
             microbatches;
    }
    loss.backward();
    total += loss.item<double>();
  }
  return total;
}

// bfloat16 autocast around forward_backward: the result (loss and trained weights) equals
// one process accumulating the same micro-batches under autocast, and the loss differs from
// float32's by far more than float32 reassociation could (~1e-7): the forward ran in
// bfloat16.
TEST(PipelineCompositionTest, BfloatAutocastMatchesMicroBatchedOneProcess) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto [images, labels] = global_batch(0, kBatch);
    auto reference = make_model();
    auto reference_sgd = make_sgd(*reference);
    const double reference_loss =
        accumulate_microbatches(reference, images, labels, 4, /*autocast=*/true);
    reference_sgd->step();

    auto model = make_model();
    PipelineParallel pipeline(
        pipeline_blocks(*model),
        borrow(group),
        nullptr,
        PipelineParallelOptions().num_microbatches(4));
    auto sgd = make_sgd(*pipeline.module());
    double loss = 0.0;
    {
      precision::AutocastGuard guard(c10::DeviceType::CPU, at::kBFloat16);
      loss = pipeline.forward_backward(images, labels, cross_entropy);
    }
    sgd->step();
    EXPECT_LT(max_difference(pipeline, *reference), kTolerance);
    const double float32_loss = cross_entropy(make_model()->forward(images), labels).item<double>();
    EXPECT_NEAR(loss, reference_loss, 1e-6);
    EXPECT_GT(std::abs(loss - float32_loss), 1e-5) << "the forward did not run in bfloat16";
  });
}

// BatchNorm layers see each micro-batch alone: the pipeline equals one process running the
// micro-batches as accumulation steps (statistics per micro-batch, running statistics
// updated once per micro-batch), not one process on the whole batch.
TEST(PipelineCompositionTest, BatchNormNormalisesEachMicroBatch) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto make_net = [] {
      torch::manual_seed(5);
      return torch::nn::Sequential(
          torch::nn::Flatten(),
          torch::nn::Linear(16, 12),
          torch::nn::BatchNorm1d(12),
          torch::nn::ReLU(),
          torch::nn::Linear(12, 12),
          torch::nn::BatchNorm1d(12),
          torch::nn::ReLU(),
          torch::nn::Linear(12, kClasses));
    };
    auto reference = make_net();
    auto reference_sgd = make_sgd(*reference);
    auto net = make_net();
    PipelineParallel pipeline(
        pipeline_blocks(net),
        borrow(group),
        nullptr,
        PipelineParallelOptions().num_microbatches(4));
    auto sgd = make_sgd(*pipeline.module());
    for (int step = 0; step < 2; ++step) {
      auto [images, labels] = global_batch(step, kBatch);
      reference_sgd->zero_grad();
      accumulate_microbatches(reference, images, labels, 4, /*autocast=*/false);
      reference_sgd->step();
      sgd->zero_grad();
      pipeline.forward_backward(images, labels, cross_entropy);
      sgd->step();
    }
    const auto expected = reference->named_buffers();
    int buffers = 0;
    for (const auto& item : pipeline.module()->named_buffers()) {
      EXPECT_TRUE(at::allclose(item.value(), expected[item.key()], 0, kTolerance)) << item.key();
      ++buffers;
    }
    EXPECT_EQ(buffers, 3); // running mean, variance and count of this rank's BatchNorm
    double most = 0.0;
    const auto parameters = reference->named_parameters();
    for (const auto& item : pipeline.module()->named_parameters()) {
      most = std::max(most, (item.value() - parameters[item.key()]).abs().max().item<double>());
    }
    EXPECT_LT(most, kTolerance);
  });
}

} // namespace
} // namespace largo::parallel::pipeline_composition_test
