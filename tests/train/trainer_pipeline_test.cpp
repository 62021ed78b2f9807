// Pipeline parallelism in the trainer (DISTRIBUTED.PIPELINE_SIZE, MODEL.PIPELINE; Gloo over
// 127.0.0.1): 2 stages train like one process that runs the micro-batches as gradient
// accumulation steps (BatchNorm normalises each micro-batch either way), 2 stages x 2
// replicas like DDP over 2 ranks with the same accumulation, and with ZeRO-1 over the replicas
// like without; a mid-epoch resume is bit-exact;
// a pipeline's checkpoint resumes in a run without one; each rank keeps only its stages'
// weights.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/error.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

namespace largo::train::trainer_pipeline_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

// fp32: the same arithmetic per micro-batch; the gradients of the micro-batches are added in
// another order (each weighted loss's backward accumulates into .grad, against one process's
// accumulation steps, and DDP's all-reduce against the pipeline's), and the global norm of
// clipping is summed over the stages' partial norms, which moves the last bits.
constexpr double kTolerance = 1e-5;

// No dropout: a pipeline stage draws its own dropout masks, one process draws them in another
// order.
// No flips either: the in-memory dataset draws its augmentation per batch, and the batches
// differ (16 against 8).
const Overrides kModel = {
    "MODEL.TRUNK.SMALL_CNN.DROPOUT=0.0",
    "OPTIMIZER.num_epochs=2",
    "DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]"};
// Every run starts afresh (the last one's files are moved aside).
const Overrides kJob =
    kModel + Overrides{"CHECKPOINT.AUTO_RESUME=False", "CHECKPOINT.OVERWRITE_EXISTING=True"};

// A pipeline of 2 stages over a batch of 16 split into 2 micro-batches of 8 ...
const Overrides kPipeline = {"DISTRIBUTED.PIPELINE_SIZE=2", "MODEL.PIPELINE.NUM_MICROBATCHES=2"};
// ... computes what one process computes on batches of 8 accumulated 2 at a time.
const Overrides kAccumulated = {
    "DATA.TRAIN.BATCHSIZE_PER_REPLICA=8", "TRAINER.GRADIENT_ACCUMULATION_STEPS=2"};

fs::path test_dir() {
  return test_dir_for("pipeline");
}

// The same losses, parameters and test accuracy (the evaluation forwards run through the
// pipeline and are counted over the replicas).
void expect_same_run(
    const RunResult& pipeline, const RunResult& reference, const std::string& what) {
  expect_same_training(pipeline, reference, kTolerance, what);
  ASSERT_TRUE(pipeline.summary.final_top1.has_value()) << what;
  EXPECT_NEAR(*pipeline.summary.final_top1, reference.summary.final_top1.value_or(-1.0), 1e-9)
      << what;
}

TEST(TrainerPipelineTest, TwoStagesTrainLikeOneProcessAccumulatingTheMicroBatches) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    struct Variant {
      std::string what;
      Overrides both;     // for the pipeline and the one process
      Overrides schedule; // the pipeline's
    };
    const std::vector<Variant> variants = {
        {"1f1b", {}, {}},
        {"gpipe, clipping",
         {"MODEL.GRAD_CLIP.USE_GRAD_CLIP=True", "MODEL.GRAD_CLIP.MAX_NORM=0.5"},
         {"MODEL.PIPELINE.SCHEDULE=gpipe"}},
        {"zb_h1, adamw",
         {"OPTIMIZER.name=adamw", "OPTIMIZER.param_schedulers.lr.start_value=0.002"},
         {"MODEL.PIPELINE.SCHEDULE=zb_h1"}},
        {"1f1b with the stages recomputed, larc",
         {"OPTIMIZER.use_larc=True"},
         {"MODEL.PIPELINE.CHECKPOINT_STAGES=True"}},
        // small_cnn has 4 blocks (3 trunk blocks and the head's layer): one per virtual stage.
        {"interleaved_1f1b, 2 virtual stages per rank",
         {},
         {"MODEL.PIPELINE.SCHEDULE=interleaved_1f1b", "MODEL.PIPELINE.VIRTUAL_STAGES=2"}},
        {"1f1b cut at given boundaries", {}, {"MODEL.PIPELINE.BOUNDARIES=[0,1,4]"}},
        {"1f1b balanced by measured block time", {}, {"MODEL.PIPELINE.BALANCE=time"}},
    };
    for (const Variant& variant : variants) {
      const RunResult pipeline = train_run(
          dir / "pipeline", kJob + kPipeline + variant.both + variant.schedule, borrow(group));
      if (group.rank() == 0) { // pipeline rank 0 holds the gathered model
        const RunResult one = train_run(
            dir / "one", kJob + kAccumulated + variant.both, comm::ProcessGroup::single_process());
        expect_same_run(pipeline, one, variant.what);
      }
      group.barrier();
    }
  });
}

TEST(TrainerPipelineTest, TwoStagesTimesTwoReplicasTrainLikeDdpAccumulatingTheMicroBatches) {
  run_on_ranks(4, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    // World rank = stage x 2 + replica: ranks 0 and 1 are stage 0 of replicas 0 and 1 and
    // read what DDP's ranks 0 and 1 read.
    const RunResult pipeline = train_run(dir / "pipeline", kJob + kPipeline, borrow(group));
    auto ddp_group = group.new_group({0, 1});
    if (ddp_group) {
      const RunResult ddp = train_run(dir / "ddp", kJob + kAccumulated, ddp_group);
      if (group.rank() == 0) {
        // Not the test accuracy: replica 1 evaluates with replica 0's BatchNorm statistics
        // (taken at the end of every step), DDP's rank 1 with rank 0's of before its last
        // forward, updated by that forward.
        expect_same_training(
            pipeline, ddp, kTolerance, "2 stages x 2 replicas against DDP over 2 ranks");
        // The checkpoints too, BatchNorm's running statistics included (replica 0's and
        // DDP's rank 0's: the buffers' root in both).
        const auto saved = checkpoint::load_checkpoint(dir / "pipeline" / "checkpoint.torch");
        const auto expected = checkpoint::load_checkpoint(dir / "ddp" / "checkpoint.torch");
        const auto model = saved.at("model").toGenericDict();
        ASSERT_EQ(model.size(), expected.at("model").toGenericDict().size());
        for (const auto& item : expected.at("model").toGenericDict()) {
          const at::Tensor value = model.at(item.key()).toTensor().to(at::kDouble);
          EXPECT_TRUE(torch::allclose(
              value, item.value().toTensor().to(at::kDouble), kTolerance, kTolerance))
              << item.key().toStringRef();
        }
      }
    }
    group.barrier();
  });
}

TEST(TrainerPipelineTest, ZeroOneOverTheReplicasTrainsLikeDdpAndResumesBitExactly) {
  run_on_ranks(4, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    const Overrides zero = {"OPTIMIZER.use_zero=True"};
    const Overrides clipped = {
        "MODEL.GRAD_CLIP.USE_GRAD_CLIP=True", "MODEL.GRAD_CLIP.MAX_NORM=0.5"};
    expect_same_training(
        train_run(dir / "zero1", kJob + kPipeline + clipped + zero, borrow(group)),
        train_run(dir / "ddp", kJob + kPipeline + clipped, borrow(group)),
        kTolerance,
        "ZeRO-1 against DDP over 2 stages x 2 replicas, rank " + std::to_string(group.rank()));
    // The checkpoint holds the whole optimizer state (consolidated and merged), from which
    // each replica takes its pieces again.
    expect_mid_epoch_resume_bit_exact(dir / "resume", kPipeline + zero, group);
  });
}

TEST(TrainerPipelineTest, MidEpochResumeIsBitExact) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    expect_mid_epoch_resume_bit_exact(test_dir(), kPipeline, group, [&](const fs::path& run) {
      // One file, written by rank 0: the whole model, as a run without a pipeline has it.
      const auto state = checkpoint::load_checkpoint(run / "model_iteration8.torch");
      size_t trunk = 0;
      size_t head = 0;
      for (const auto& item : state.at("model").toGenericDict()) {
        trunk += item.key().toStringRef().rfind("trunk.", 0) == 0 ? 1 : 0;
        head += item.key().toStringRef().rfind("head.", 0) == 0 ? 1 : 0;
      }
      EXPECT_GT(trunk, 0u);
      EXPECT_GT(head, 0u);
      EXPECT_EQ(state.at("train_sampler").toGenericDict().at("num_replicas").toInt(), 1);
    });
  });
}

TEST(TrainerPipelineTest, APipelinesCheckpointResumesWithoutAPipeline) {
  const fs::path root = test_dir();
  if (largo::testing::is_parent()) {
    fs::remove_all(root);
  }
  // 6 iterations per epoch; stopped after 8, checkpoint.torch is the end of epoch 0.
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    train_run(root / "pipeline", kModel + kPipeline, borrow(group), /*stop_after=*/8);
  });
  if (largo::testing::is_parent()) {
    auto single = comm::ProcessGroup::single_process();
    train_run(root / "one", kModel + kAccumulated, single, /*stop_after=*/8);
    const RunResult expected = train_run(root / "one", kModel + kAccumulated, single);
    const RunResult resumed = train_run(root / "pipeline", kModel + kAccumulated, single);
    ASSERT_TRUE(expected.summary.resumed);
    ASSERT_TRUE(resumed.summary.resumed);
    expect_same_training(resumed, expected, kTolerance, "a pipeline's checkpoint, one process");
  }
}

TEST(TrainerPipelineTest, AnEvaluationOnlyRunScoresThroughThePipelineAsOneProcessDoes) {
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    const fs::path run = test_dir();
    if (group.rank() == 0) {
      fs::remove_all(run);
    }
    group.barrier();
    const Overrides evaluate = {"TEST_ONLY=True"};
    const RunResult trained = train_run(run, kModel + kPipeline, borrow(group));
    const RunResult scored = train_run(run, kModel + kPipeline + evaluate, borrow(group));
    ASSERT_TRUE(scored.summary.resumed);
    EXPECT_TRUE(scored.summary.iteration_losses.empty());
    ASSERT_TRUE(scored.summary.final_top1.has_value());
    EXPECT_EQ(*scored.summary.final_top1, trained.summary.final_top1.value_or(-1.0));
    group.barrier();
    if (group.rank() == 0) { // the same checkpoint, evaluated without a pipeline
      const RunResult one = train_run(run, kModel + evaluate, comm::ProcessGroup::single_process());
      EXPECT_NEAR(one.summary.final_top1.value_or(-1.0), *scored.summary.final_top1, 1e-9);
    }
  });
}

TEST(TrainerPipelineTest, EachRankHoldsOnlyItsStagesWeights) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    auto options =
        trainer_options_from_config(synthetic_job_config(test_dir(), kJob + kPipeline));
    Trainer trainer(options, "", borrow(group));
    trainer.run();
    int64_t own = 0;
    for (const auto& parameter : trainer.model()->parameters()) {
      own += parameter.numel();
    }
    at::Tensor total = at::tensor({own}, at::kLong);
    group.all_reduce(total);
    const auto whole = trainer.full_parameters(); // rank 0: gathered from both stages
    if (group.rank() == 0) {
      int64_t expected = 0;
      for (const auto& [name, value] : whole) {
        expected += value.numel();
      }
      EXPECT_EQ(total.item<int64_t>(), expected); // each parameter on exactly one rank
    }
    EXPECT_GT(own, 0);
    EXPECT_LT(own, total.item<int64_t>());
  });
}

} // namespace
} // namespace largo::train::trainer_pipeline_test
