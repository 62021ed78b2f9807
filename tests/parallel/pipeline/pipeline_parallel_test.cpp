// Pipeline parallelism against one process: every schedule at 2 and 4 pipeline ranks, and
// 2 stages x 2 data-parallel replicas, trains a small trunk-of-blocks model like one process
// on the same global batch (Gloo over 127.0.0.1; 4 ranks oversubscribe the cores).
//
// Tolerances. The pipeline computes the same float32 quantities as the single process, but
// sums them in another order: a weight gradient is a sum over the batch, formed per
// micro-batch (2 to 5 rows) and then across micro-batches (and averaged across replicas),
// where the reference forms it in one matmul over 16-18 rows. Reassociating n terms moves a
// float32 sum by at most about n * 2^-24 * sum|terms|; here n <= 18 and sum|terms| of a
// gradient entry stays below ~1 (activations and weights of order 1, mean loss), so each
// gradient entry differs by < ~1.1e-6, and a parameter after 3 SGD steps (lr 0.1, momentum
// 0.9: coefficients 0.1 + 0.19 + 0.271 per step's gradient) by < ~1e-6: 1e-5 holds that
// with a margin. This model's gradients are small (deep, narrow, ReLU), so parameters
// alone would hide a wrong gradient; the first step's gradients are compared too, each
// tensor relative to its largest entry: reassociation moves them by ~18 * 2^-24 ~ 1e-6 of
// that scale, so 1e-5 holds, while a micro-batch's loss weighted 1 % off moves them by
// 2e-3 to 2e-2 of it (measured).
#include <largo/parallel/data_parallel/sharded_optimizer.h>
#include <largo/parallel/mesh/device_mesh.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>

#include "comm/distributed_test_util.h"
#include "parallel/pipeline_test_util.h"

namespace largo::parallel::pipeline_parallel_test {
namespace {

using namespace largo::parallel::testing;
using largo::testing::run_on_ranks;

constexpr int kSteps = 3;
constexpr double kTolerance = 1e-5;
constexpr double kGradientTolerance = 1e-5;

struct ScheduleCase {
  PipelineScheduleKind kind;
  int virtual_stages;
};

const std::vector<ScheduleCase> kSchedules = {
    {PipelineScheduleKind::kGPipe, 1},
    {PipelineScheduleKind::kOneFOneB, 1},
    {PipelineScheduleKind::kZeroBubbleH1, 1},
    {PipelineScheduleKind::kInterleaved1F1B, 2},
};

PipelineParallelOptions options_for(const ScheduleCase& schedule, int microbatches) {
  return PipelineParallelOptions()
      .schedule(schedule.kind)
      .virtual_stages(schedule.virtual_stages)
      .num_microbatches(microbatches);
}

// Trains the pipeline and the in-process reference and compares this rank's stages.
void expect_like_one_process(
    std::shared_ptr<comm::ProcessGroup> pipeline_group,
    std::shared_ptr<comm::ProcessGroup> replicas,
    const ScheduleCase& schedule,
    int64_t global_batch,
    int microbatches) {
  SCOPED_TRACE(fmt::format(
      "{} on {} ranks, {} micro-batches",
      to_string(schedule.kind),
      pipeline_group->world_size(),
      microbatches));
  auto reference = make_model();
  const auto reference_losses = train_reference(reference, kSteps, global_batch);
  auto model = make_model();
  PipelineParallel pipeline(
      pipeline_blocks(*model), pipeline_group, replicas, options_for(schedule, microbatches));
  const int replica = replicas ? replicas->rank() : 0;
  const int num_replicas = replicas ? replicas->world_size() : 1;
  // The first step's gradients, before any optimizer step.
  auto [images, labels] = testing::global_batch(0, global_batch);
  pipeline.forward_backward(
      replica_slice(images, replica, num_replicas),
      replica_slice(labels, replica, num_replicas),
      cross_entropy);
  pipeline.reduce_gradients();
  EXPECT_LT(
      max_relative_gradient_difference(pipeline, reference_gradients(global_batch)),
      kGradientTolerance);
  const auto losses = train_pipeline(pipeline, kSteps, global_batch, replica, num_replicas);
  EXPECT_LT(max_difference(pipeline, *reference), kTolerance) << pipeline.describe();
  if (num_replicas == 1) { // with replicas each sees half the batch: another loss
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_NEAR(losses[step], reference_losses[step], kTolerance) << "step " << step;
    }
  }
}

TEST(PipelineParallelTest, EveryScheduleOnFourRanksTrainsLikeOneProcess) {
  run_on_ranks(4, [](comm::ProcessGroup& world) {
    for (const auto& schedule : kSchedules) {
      // 8 blocks: 4 stages of 2 blocks, or 8 stages of one (interleaved, 2 per rank).
      expect_like_one_process(
          borrow(world),
          nullptr,
          schedule,
          /*global_batch=*/16,
          /*microbatches=*/schedule.virtual_stages > 1 ? 8 : 6);
    }
  });
}

TEST(PipelineParallelTest, EveryScheduleOnTwoRanksAndTwoStagesTimesTwoReplicas) {
  run_on_ranks(4, [](comm::ProcessGroup& world) {
    // Two independent pipelines of 2 ranks, {0, 1} and {2, 3}, each on the whole batch of
    // 18 rows: 4 micro-batches of 5, 5, 4, 4 rows.
    std::shared_ptr<comm::ProcessGroup> pair;
    for (int first : {0, 2}) {
      if (auto group = world.new_group({first, first + 1})) {
        pair = group;
      }
    }
    for (const auto& schedule : kSchedules) {
      expect_like_one_process(pair, nullptr, schedule, /*global_batch=*/18, /*microbatches=*/4);
    }
    // 2 stages x 2 replicas: each replica's pipeline runs half of a batch of 16.
    const DeviceMesh mesh(world, pp_dp_tp_dimensions(2, 2));
    for (const auto& schedule : kSchedules) {
      expect_like_one_process(
          mesh.group("pp"),
          mesh.group("dp"),
          schedule,
          /*global_batch=*/16,
          /*microbatches=*/4);
    }
    // ZeRO-1 within each stage's replicas: a ShardedOptimizer over the data-parallel group
    // steps this replica's half of the stage's parameters after reduce_gradients().
    auto reference = make_model();
    train_reference(reference, kSteps, 16);
    auto model = make_model();
    PipelineParallel pipeline(
        pipeline_blocks(*model),
        mesh.group("pp"),
        mesh.group("dp"),
        PipelineParallelOptions().num_microbatches(4));
    train_pipeline(
        pipeline, kSteps, 16, mesh.coordinate("dp"), 2, [&](const torch::nn::Module& module) {
          ShardedOptimizerOptions options;
          options.make_base_optimizer = [](std::vector<optim::ParamGroup> groups) {
            optim::SGDOptions sgd;
            sgd.momentum = 0.9;
            return std::make_unique<optim::SGD>(std::move(groups), sgd);
          };
          optim::ParamGroupOptions groups;
          groups.lr = 0.1;
          groups.weight_decay = 1e-3;
          return std::make_unique<ShardedOptimizer>(
              optim::build_param_groups(module, groups), mesh.group("dp"), options);
        });
    EXPECT_LT(max_difference(pipeline, *reference), kTolerance) << "ZeRO-1";
  });
}

} // namespace
} // namespace largo::parallel::pipeline_parallel_test
