// Tensor parallelism in the trainer (DISTRIBUTED.TENSOR_PARALLEL_SIZE; Gloo over 127.0.0.1):
// the MLP trunk and a small ViT split over 2 ranks train like one process (the checkpoint
// holds the whole model, as one process's does, and resumes in a run without tensor
// parallelism); TP 2 x DP 2 at 4 ranks like DDP over 2, TP 2 x ZeRO-2 (FSDP) like ZeRO-2
// (FSDP) over 2 (and it resumes that run's shard files), TP 2 x PP 2 like one process; a
// mid-epoch resume is bit-exact; with sequence parallelism (DISTRIBUTED.SEQUENCE_PARALLEL) a
// ViT trains like one process, in a pipeline too; with dropout, with and without sequence
// parallelism, the shards keep identical replicated parameters; what does not compose is
// refused naming the key.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/core/error.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

#include <cmath>
#include <map>

namespace largo::train::trainer_tensor_parallel_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

// float32: the sharded layers add their partial products in another order (the row-parallel
// all-reduce sums T partial dot products, one process one long one), about 1e-7 relative per
// sum, compounded over 2 epochs of 12 SGD steps on values of order 1: 1e-5 leaves a margin
// of about 10 (the pipeline suite's bound, from the same argument).
constexpr double kTolerance = 1e-5;

// Dropout 0 and no flips: one process draws other masks than the tensor-parallel ranks (which
// repeat theirs on each shard's slice).
const Overrides kMlp = {
    "MODEL.TRUNK.NAME=mlp",
    "MODEL.TRUNK.MLP.HIDDEN_DIMS=[32, 16]",
    "OPTIMIZER.num_epochs=2",
    "DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]"};
const Overrides kVit = {
    "MODEL.TRUNK.NAME=vision_transformer",
    "MODEL.TRUNK.VISION_TRANSFORMERS.IMAGE_SIZE=24",
    "MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE=8",
    "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=2",
    "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=4",
    "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=32",
    "MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=64",
    "OPTIMIZER.num_epochs=1",
    "OPTIMIZER.param_schedulers.lr.start_value=0.01",
    "DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]"};
// The ViT on 16x16 images: 4 patches and the class token, 5 tokens, which sequence
// parallelism splits unevenly (3 + 2).
const Overrides kFiveTokens = {
    "MODEL.TRUNK.VISION_TRANSFORMERS.IMAGE_SIZE=16",
    "DATA.TRAIN.SYNTHETIC.IMAGE_SHAPE=[1,16,16]",
    "DATA.TEST.SYNTHETIC.IMAGE_SHAPE=[1,16,16]"};
const Overrides kSequenceParallel = {"DISTRIBUTED.SEQUENCE_PARALLEL=True"};
const Overrides kFresh = {"CHECKPOINT.AUTO_RESUME=False", "CHECKPOINT.OVERWRITE_EXISTING=True"};
const Overrides kTensorParallel = {"DISTRIBUTED.TENSOR_PARALLEL_SIZE=2"};

fs::path test_dir() {
  return test_dir_for("tensor_parallel");
}

TEST(TrainerTensorParallelTest, TwoShardsTrainLikeOneProcess) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    const std::vector<std::pair<std::string, Overrides>> models = {
        {"mlp, clipping",
         kMlp + Overrides{"MODEL.GRAD_CLIP.USE_GRAD_CLIP=True", "MODEL.GRAD_CLIP.MAX_NORM=0.5"}},
        {"vit, adamw", kVit + Overrides{"OPTIMIZER.name=adamw"}}};
    for (const auto& [what, model] : models) {
      const RunResult split =
          train_run(dir / "tp", kFresh + model + kTensorParallel, borrow(group));
      if (group.rank() == 0) {
        const RunResult one =
            train_run(dir / "one", kFresh + model, comm::ProcessGroup::single_process());
        expect_same_training(split, one, kTolerance, what);
        ASSERT_TRUE(split.summary.final_top1.has_value()) << what;
        EXPECT_NEAR(*split.summary.final_top1, one.summary.final_top1.value_or(-1.0), 1e-9) << what;
        // The checkpoint holds the whole model under one process's names and shapes.
        const auto saved = checkpoint::load_checkpoint(dir / "tp" / "checkpoint.torch");
        const auto expected = checkpoint::load_checkpoint(dir / "one" / "checkpoint.torch");
        const auto state = saved.at("model").toGenericDict();
        ASSERT_EQ(state.size(), expected.at("model").toGenericDict().size()) << what;
        for (const auto& item : expected.at("model").toGenericDict()) {
          EXPECT_EQ(state.at(item.key()).toTensor().sizes(), item.value().toTensor().sizes())
              << what << ": " << item.key().toStringRef();
        }
      }
      group.barrier();
    }
  });
}

// World rank = replica x 2 + shard: ranks 0, 1 read replica 0's batches, 2, 3 replica 1's,
// as DDP's ranks 0 and 1 do.
TEST(TrainerTensorParallelTest, TwoShardsTimesTwoReplicasTrainLikeDdp) {
  run_on_ranks(4, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    const RunResult split = train_run(dir / "tp", kFresh + kMlp + kTensorParallel, borrow(group));
    auto ddp_group = group.new_group({0, 1});
    if (ddp_group) {
      const RunResult ddp = train_run(dir / "ddp", kFresh + kMlp, ddp_group);
      if (group.rank() == 0) {
        expect_same_training(split, ddp, kTolerance, "TP 2 x DP 2 against DDP over 2 ranks");
      }
    }
    group.barrier();
  });
}

// The model EMA's averages a checkpoint holds, by name.
std::map<std::string, at::Tensor> ema_averages(const fs::path& file) {
  std::map<std::string, at::Tensor> averages;
  const auto state = checkpoint::load_checkpoint(file);
  for (const auto& item :
       state.at("ema_model").toGenericDict().at("averages").toGenericDict()) {
    averages.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  return averages;
}

// TP 2 x ZeRO-2 and TP 2 x FSDP over 2 replicas, with LARC (its trust ratios are the
// unsharded parameters') and the model EMA, train like ZeRO-2 (FSDP) over the 2 replicas
// alone (the EMA's saved averages too); and resume that run's end-of-epoch checkpoint, whose
// optimizer state is in per-rank shard files (consolidated at load, then sliced), continuing
// like it.
TEST(TrainerTensorParallelTest, TwoShardsTimesZeroOrFsdpTrainLikeItAndResumeItsShardFiles) {
  run_on_ranks(4, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    const Overrides larc = {"OPTIMIZER.use_larc=True", "HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True"};
    for (const auto& [what, sharding] : std::vector<std::pair<std::string, Overrides>>{
             {"ZeRO-2", {"MODEL.SHARDED_DDP_SETUP.USE_SDP=True"}},
             {"FSDP", {"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}}}) {
      const RunResult split =
          train_run(dir / "tp", kFresh + kMlp + larc + sharding + kTensorParallel, borrow(group));
      RunResult alone;
      if (auto replicas = group.new_group({0, 1})) {
        alone = train_run(dir / "alone", kFresh + kMlp + larc + sharding, replicas);
        if (group.rank() == 0) {
          expect_same_training(split, alone, kTolerance, "TP 2 x " + what + " against " + what);
          const auto expected = ema_averages(dir / "alone" / "model_phase0.torch");
          const auto averages = ema_averages(dir / "tp" / "model_phase0.torch");
          ASSERT_EQ(averages.size(), expected.size()) << what;
          for (const auto& [name, value] : expected) {
            EXPECT_TRUE(torch::allclose(averages.at(name), value, kTolerance, kTolerance))
                << what << ": EMA of " << name << " differs by "
                << (averages.at(name) - value).abs().max().item<double>();
          }
        }
      }
      if (group.rank() == 0) {
        const fs::path copy = dir / "resumed";
        fs::remove_all(copy);
        fs::create_directories(copy);
        for (const char* file :
             {"model_phase0.torch",
              "model_phase0_shard0.torch",
              "model_phase0_shard1.torch",
              "model_phase0.manifest.json"}) {
          fs::copy_file(dir / "alone" / file, copy / file);
        }
      }
      group.barrier();
      const RunResult resumed =
          train_run(dir / "resumed", kMlp + larc + sharding + kTensorParallel, borrow(group));
      if (group.rank() == 0) {
        ASSERT_TRUE(resumed.summary.resumed) << what;
        expect_same_training(
            RunResult{TrainSummary{}, resumed.parameters},
            RunResult{TrainSummary{}, alone.parameters},
            kTolerance,
            what + "'s sharded checkpoint resumed at TP 2 x " + what);
      }
      group.barrier();
    }
  });
}

// World rank = stage x 2 + shard: the four ranks read the same batches (one replica), each
// stage split over a pair. The MLP has no BatchNorm, so the pipeline's micro-batches add up
// to one process's batch.
TEST(TrainerTensorParallelTest, TwoShardsTimesTwoStagesTrainLikeOneProcess) {
  run_on_ranks(4, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    const Overrides clipping = {
        "MODEL.GRAD_CLIP.USE_GRAD_CLIP=True", "MODEL.GRAD_CLIP.MAX_NORM=0.5"};
    const Overrides pipeline = {"DISTRIBUTED.PIPELINE_SIZE=2", "MODEL.PIPELINE.NUM_MICROBATCHES=2"};
    const RunResult split = train_run(
        dir / "tp_pp", kFresh + kMlp + clipping + kTensorParallel + pipeline, borrow(group));
    if (group.rank() == 0) {
      const RunResult one =
          train_run(dir / "one", kFresh + kMlp + clipping, comm::ProcessGroup::single_process());
      expect_same_training(split, one, kTolerance, "TP 2 x PP 2 against one process");
      ASSERT_TRUE(split.summary.final_top1.has_value());
      EXPECT_NEAR(*split.summary.final_top1, one.summary.final_top1.value_or(-1.0), 1e-9);
    }
    group.barrier();
  });
}

TEST(TrainerTensorParallelTest, MidEpochResumeIsBitExactAndEpochsResumeWithoutTensorParallelism) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    // With the model EMA, whose per-rank average of the shards is saved whole.
    const RunResult reference = expect_mid_epoch_resume_bit_exact(
        dir,
        kMlp + Overrides{"OPTIMIZER.name=adamw", "HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True"} +
            kTensorParallel,
        group,
        [](const fs::path& run) {
          const auto state = checkpoint::load_checkpoint(run / "model_iteration8.torch");
          const auto averages =
              state.at("ema_model").toGenericDict().at("averages").toGenericDict();
          const auto model = state.at("model").toGenericDict();
          for (const auto& item : model) { // whole tensors, as the model's
            EXPECT_EQ(averages.at(item.key()).toTensor().sizes(), item.value().toTensor().sizes())
                << item.key().toStringRef();
          }
        });
    // Its end-of-epoch checkpoint (model, AdamW's state, the EMA) resumed in one process (a
    // mid-epoch one is refused at another world size: its per-rank generators would not fit).
    if (group.rank() == 0) {
      const fs::path copy = dir / "one";
      fs::create_directories(copy);
      fs::copy_file(dir / "full" / "model_phase0.torch", copy / "model_phase0.torch");
      const RunResult one = train_run(
          copy,
          kMlp +
              Overrides{
                  "OPTIMIZER.name=adamw",
                  "DATA.TRAIN.USE_STATEFUL_DISTRIBUTED_SAMPLER=True",
                  "DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"},
          comm::ProcessGroup::single_process());
      ASSERT_TRUE(one.summary.resumed);
      expect_same_training(
          RunResult{TrainSummary{}, one.parameters},
          RunResult{TrainSummary{}, reference.parameters},
          kTolerance,
          "the tensor-parallel checkpoint resumed in one process");
    }
  });
}

// Sequence parallelism splits the ViT's 5 tokens 3 + 2 between the layers: it trains like one
// process (the bound as above: the norms' gradients are summed over the ranks' tokens in
// another order), with the shards' activations sent between pipeline stages too.
// SGD, whose updates are linear in the gradients, as kTolerance's argument assumes: AdamW
// divides each gradient element by its own running magnitude, so an element whose gradient
// sums cancel to the rounding level moves by up to the learning rate on one side and not the
// other (1.7e-5 on trunk.1.qkv.weight on an AVX2 CPU with AdamW). Sequence parallelism changes
// the layers' forward and backward, which SGD shows as well.
TEST(TrainerTensorParallelTest, SequenceParallelTrainsLikeOneProcess) {
  const Overrides vit = kVit + kFiveTokens;
  run_on_ranks(2, [&vit](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    const RunResult split =
        train_run(dir / "sp", kFresh + vit + kTensorParallel + kSequenceParallel, borrow(group));
    if (group.rank() == 0) {
      const RunResult one =
          train_run(dir / "one", kFresh + vit, comm::ProcessGroup::single_process());
      expect_same_training(split, one, kTolerance, "TP 2 with sequence parallelism");
      ASSERT_TRUE(split.summary.final_top1.has_value());
      EXPECT_NEAR(*split.summary.final_top1, one.summary.final_top1.value_or(-1.0), 1e-9);
    }
    group.barrier();
  });
  run_on_ranks(4, [&vit](comm::ProcessGroup& group) { // TP 2 x PP 2
    const fs::path dir = test_dir();
    // Cut between the encoder layers (blocks: the patch embedding, 2 layers, the final norm,
    // the head), so that each rank's tokens cross to the next stage.
    const Overrides pipeline = {
        "DISTRIBUTED.PIPELINE_SIZE=2",
        "MODEL.PIPELINE.NUM_MICROBATCHES=2",
        "MODEL.PIPELINE.BOUNDARIES=[0, 2, 5]"};
    const RunResult split = train_run(
        dir / "sp_pp",
        kFresh + vit + kTensorParallel + kSequenceParallel + pipeline,
        borrow(group));
    if (group.rank() == 0) {
      const RunResult one =
          train_run(dir / "one", kFresh + vit, comm::ProcessGroup::single_process());
      expect_same_training(split, one, kTolerance, "TP 2 x PP 2 with sequence parallelism");
    }
    group.barrier();
  });
}

// Autocast (O1, bfloat16 on the CPU) with tensor and sequence parallelism: the sequence-
// gathered column layers compute their backward in the gradient's dtype and give each
// gradient its tensor's. Bound on the first loss (the same weights and batch): with
// bfloat16's unit roundoff u = 2^-8, one process rounds each row-parallel layer's output once
// and the shards round their partial sums before adding them, at most u more per row layer
// relative to its output; 4 row layers (2 encoder layers) feed the logits, moving a loss of
// order 2.3 by at most about 4u = 1.6 %, so 3 % relative. Later losses are not compared: the
// steps' updates amplify the rounding differently (the run must stay finite and learn).
TEST(TrainerTensorParallelTest, AutocastWithSequenceParallelismMatchesOneProcessToBfloat16) {
  const Overrides vit = kVit + kFiveTokens +
                        Overrides{
                            "OPTIMIZER.name=adamw",
                            "MODEL.AMP_PARAMS.USE_AMP=True",
                            "MODEL.AMP_PARAMS.DTYPE=bfloat16"};
  run_on_ranks(2, [&vit](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    const RunResult split = train_run(
        dir / "sp_amp", kFresh + vit + kTensorParallel + kSequenceParallel, borrow(group));
    if (group.rank() == 0) {
      const RunResult one =
          train_run(dir / "one_amp", kFresh + vit, comm::ProcessGroup::single_process());
      const auto& losses = split.summary.iteration_losses;
      ASSERT_FALSE(losses.empty());
      const double first = one.summary.iteration_losses.at(0);
      EXPECT_NEAR(losses[0], first, 0.03 * std::abs(first));
      for (const double loss : losses) {
        EXPECT_TRUE(std::isfinite(loss));
      }
      EXPECT_LT(losses.back(), losses.front());
    }
    group.barrier();
  });
}

// With dropout and drop path (the ViT's DROPOUT_RATE, ATTENTION_DROPOUT_RATE, DROP_PATH_RATE)
// the two shards of one replica still hold the same replicated parameters (the embedding,
// LayerNorms, the row-parallel biases, the head), bit for bit: they draw one stream, their
// replica's, so they drop the same elements of the activations both compute; and dropout on
// what each holds alone (its heads, its hidden features, under sequence parallelism its
// tokens) draws from its own stream without moving the shared one differently.
// full_parameters() gives each rank's own copy of those (and the gathered shards).
TEST(TrainerTensorParallelTest, DropoutKeepsTheShardsReplicatedParametersIdentical) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const Overrides dropout = {
        "MODEL.TRUNK.VISION_TRANSFORMERS.DROPOUT_RATE=0.2",
        "MODEL.TRUNK.VISION_TRANSFORMERS.ATTENTION_DROPOUT_RATE=0.2",
        "MODEL.TRUNK.VISION_TRANSFORMERS.DROP_PATH_RATE=0.2"};
    for (const Overrides& sequence : {Overrides{}, kFiveTokens + kSequenceParallel}) {
      const RunResult split = train_run(
          test_dir() / "dropout",
          kFresh + kVit + dropout + kTensorParallel + sequence,
          borrow(group));
      for (const auto& [name, value] : split.parameters) {
        const at::Tensor rank0 = value.clone();
        group.broadcast(rank0, 0);
        EXPECT_TRUE(torch::equal(value, rank0))
            << name << " differs from rank 0's by " << (value - rank0).abs().max().item<double>()
            << (sequence.empty() ? "" : " (sequence parallel)");
      }
    }
  });
}

// Refused when the run is planned, before any collective: each rank may check alone.
std::string refusal(const Overrides& overrides, std::shared_ptr<comm::ProcessGroup> group) {
  try {
    train_run(test_dir(), kMlp + kTensorParallel + overrides, std::move(group));
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(TrainerTensorParallelTest, WhatDoesNotComposeIsRefusedNamingTheKey) {
  const std::string world = refusal({}, comm::ProcessGroup::single_process());
  EXPECT_NE(world.find("DISTRIBUTED.TENSOR_PARALLEL_SIZE"), std::string::npos) << world;
  EXPECT_NE(world.find("a divisor of the 1 ranks"), std::string::npos) << world;
  const std::string alone = refusal(
      {"DISTRIBUTED.TENSOR_PARALLEL_SIZE=1", "DISTRIBUTED.SEQUENCE_PARALLEL=True"},
      comm::ProcessGroup::single_process());
  EXPECT_NE(alone.find("DISTRIBUTED.SEQUENCE_PARALLEL = true"), std::string::npos) << alone;
  EXPECT_NE(alone.find("DISTRIBUTED.TENSOR_PARALLEL_SIZE 1"), std::string::npos) << alone;
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const std::string fsdp = refusal(
        {"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True",
         "MODEL.AMP_PARAMS.USE_AMP=True",
         "MODEL.AMP_PARAMS.DTYPE=bfloat16",
         "MODEL.FSDP_CONFIG.AMP_TYPE=O2"},
        borrow(group));
    EXPECT_NE(fsdp.find("MODEL.FSDP_CONFIG.compute_dtype"), std::string::npos) << fsdp;
    const std::string mlp = refusal(kSequenceParallel, borrow(group));
    EXPECT_NE(mlp.find("DISTRIBUTED.SEQUENCE_PARALLEL = true"), std::string::npos) << mlp;
    EXPECT_NE(mlp.find("the MLP trunk has no sequence of tokens"), std::string::npos) << mlp;
  });
  run_on_ranks(4, [](comm::ProcessGroup& group) { // TP 2 x PP 2
    const std::string timed =
        refusal({"DISTRIBUTED.PIPELINE_SIZE=2", "MODEL.PIPELINE.BALANCE=time"}, borrow(group));
    EXPECT_NE(timed.find("MODEL.PIPELINE.BALANCE"), std::string::npos) << timed;
    EXPECT_NE(timed.find("would time the blocks"), std::string::npos) << timed;
  });
}

} // namespace
} // namespace largo::train::trainer_tensor_parallel_test
