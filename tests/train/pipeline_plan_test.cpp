// What a run with a pipeline resolves to (train/pipeline_plan.h, and the library's
// parallel::check_parallel_options through resolve_run): the keys that do not compose with
// one are refused by name before any data is read, and the replicas, not the stages, make
// the global batch.
#include <largo/core/error.h>
#include <largo/train/run_plan.h>

#include "train/trainer_test_util.h"

namespace largo::train::pipeline_plan_test {
namespace {

using Overrides = std::vector<std::string>;

RunPlan plan_of(const Overrides& overrides) {
  Overrides all = {"DISTRIBUTED.NUM_PROC_PER_NODE=4", "DISTRIBUTED.PIPELINE_SIZE=2"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return resolve_run(synthetic_job_config(test_dir_for("pipeline_plan"), all));
}

void expect_refused(const Overrides& overrides, const std::string& message) {
  try {
    plan_of(overrides);
    ADD_FAILURE() << "expected a ConfigError mentioning " << message;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(PipelinePlanTest, WhatDoesNotComposeWithAPipelineIsRefusedByItsKey) {
  expect_refused({"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}, "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP");
  expect_refused({"MODEL.SHARDED_DDP_SETUP.USE_SDP=True"}, "MODEL.SHARDED_DDP_SETUP.USE_SDP");
  expect_refused(
      {"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True"},
      "use MODEL.PIPELINE.CHECKPOINT_STAGES");
  expect_refused(
      {"MODEL.AMP_PARAMS.USE_AMP=True",
       "MODEL.AMP_PARAMS.DTYPE=bfloat16",
       "MODEL.AMP_PARAMS.AMP_ARGS={opt_level: O2}"},
      "a cast of the stages (O2, O3) is not built");
  expect_refused(
      {"MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=True"},
      "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN");
  expect_refused({"HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True"}, "HOOKS.EMA_MODEL");
  expect_refused(
      {"MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
       "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True"},
      "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON");
  expect_refused(
      {"MODEL.PIPELINE.NUM_MICROBATCHES=32"},
      "BATCHSIZE_PER_REPLICA = 16 cannot be split into MODEL.PIPELINE.NUM_MICROBATCHES "
      "= 32");
  expect_refused(
      {"DISTRIBUTED.PIPELINE_SIZE=3"},
      "DISTRIBUTED.PIPELINE_SIZE = 3: expected a divisor of the 4 ranks");
  expect_refused({"MODEL.PIPELINE.SCHEDULE=pipedream"}, "MODEL.PIPELINE.SCHEDULE");
  expect_refused({"MODEL.PIPELINE.BALANCE=flops"}, "MODEL.PIPELINE.BALANCE");
  expect_refused({"MODEL.PIPELINE.VIRTUAL_STAGES=2"}, "only interleaved_1f1b runs several");
  expect_refused({"MODEL.PIPELINE.SCHEDULE=interleaved_1f1b"}, "VIRTUAL_STAGES >= 2");
  expect_refused(
      {"MODEL.PIPELINE.SCHEDULE=zb_h1", "MODEL.PIPELINE.CHECKPOINT_STAGES=True"},
      "MODEL.PIPELINE.CHECKPOINT_STAGES = true: expected false with MODEL.PIPELINE.SCHEDULE "
      "= zb_h1");
  expect_refused({"MODEL.PIPELINE.BOUNDARIES=[0,2]"}, "MODEL.PIPELINE.BOUNDARIES = [0, 2]");
  expect_refused({"MODEL.PIPELINE.BOUNDARIES=[0,3,2]"}, "strictly increasing");
}

TEST(PipelinePlanTest, PipelineKeysWithoutAPipelineAreRefused) {
  expect_refused(
      {"DISTRIBUTED.PIPELINE_SIZE=1",
       "MODEL.PIPELINE.SCHEDULE=gpipe",
       "MODEL.PIPELINE.CHECKPOINT_STAGES=True"},
      "MODEL.PIPELINE.SCHEDULE, MODEL.PIPELINE.CHECKPOINT_STAGES is set, but "
      "DISTRIBUTED.PIPELINE_SIZE is 1");
}

TEST(PipelinePlanTest, TheReplicasMakeTheGlobalBatch) {
  // 4 ranks = 2 stages x 2 replicas, 16 per replica, 2 accumulation steps.
  const RunPlan plan = plan_of({"TRAINER.GRADIENT_ACCUMULATION_STEPS=2"});
  EXPECT_EQ(plan.global_batch, 16 * 2 * 2);
  EXPECT_EQ(plan.batch_per_node, 16 * 2 * 2); // one node holds both replicas
  EXPECT_EQ(plan.parallel.pipeline.size, 2);
  EXPECT_NE(plan.describe().find("pipeline of 2 stages (1f1b, 4 micro-batches)"), std::string::npos)
      << plan.describe();
  // ZeRO-1 shards the optimizer state over each stage's replicas.
  const RunPlan zero = plan_of({"OPTIMIZER.use_zero=True"});
  EXPECT_EQ(zero.parallel.data_parallelism, parallel::DataParallelism::kZero1);
  EXPECT_NE(zero.describe().find("x ZeRO-1 over 2 ranks"), std::string::npos) << zero.describe();
  const RunPlan without = plan_of({"DISTRIBUTED.PIPELINE_SIZE=1"});
  EXPECT_EQ(without.global_batch, 16 * 4);
}

// A layer's tensor-parallel shards share their replica's batch as a pipeline's stages do.
TEST(PipelinePlanTest, TensorParallelShardsShareTheirReplicasBatch) {
  // 4 ranks = 2 shards x 2 replicas, both on the one node.
  const RunPlan split = plan_of(
      {"DISTRIBUTED.PIPELINE_SIZE=1",
       "DISTRIBUTED.TENSOR_PARALLEL_SIZE=2",
       "TRAINER.GRADIENT_ACCUMULATION_STEPS=2"});
  EXPECT_EQ(split.global_batch, 16 * 2 * 2);
  EXPECT_EQ(split.batch_per_node, 16 * 2 * 2);
  EXPECT_NE(
      split.describe().find("tensor parallel over 2 ranks x DDP over 2 ranks"), std::string::npos)
      << split.describe();
  // 4 ranks = 2 stages x 2 shards: one replica.
  const RunPlan staged = plan_of({"DISTRIBUTED.TENSOR_PARALLEL_SIZE=2"});
  EXPECT_EQ(staged.global_batch, 16);
  EXPECT_EQ(staged.batch_per_node, 16);
  EXPECT_NE(
      staged.describe().find(
          "pipeline of 2 stages (1f1b, 4 micro-batches) x tensor parallel over 2 "
          "ranks x 1 replica"),
      std::string::npos)
      << staged.describe();
}

} // namespace
} // namespace largo::train::pipeline_plan_test
