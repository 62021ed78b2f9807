// FSDP (ZeRO stage 3) in the trainer (Gloo over 127.0.0.1): MODEL.FSDP_CONFIG trains like
// plain DDP (every unit layout, with and without reshard_after_forward and prefetch,
// accumulation, clipping, LARC, AdamW, activation checkpointing, a ViT, autocast with the
// sharded loss scaler); its
// checkpoints (the model gathered unit by unit, the optimizer state in per-rank shards)
// resume bit-exactly, at other world sizes, into unsharded and ZeRO runs, and consolidate
// offline; the combinations not built yet are clear errors.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/sharded_checkpoint.h>
#include <largo/core/error.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

#include <cstdlib>

namespace largo::train::trainer_fsdp_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

// fp32: FSDP applies the same element-wise updates as DDP; only the order of the gradient
// sums (reduce-scatter vs all-reduce) and of the norms (per-piece partials) differ.
constexpr double kTolerance = 1e-5;

const Overrides kFsdp = {"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"};

fs::path test_dir() {
  return test_dir_for("fsdp");
}

TEST(TrainerFsdpTest, TrainsLikeDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir(); // AUTO_RESUME off: every run starts afresh (OVERWRITE_EXISTING
                                     // moves the last one's files aside)
    const Overrides job = {
        "OPTIMIZER.num_epochs=2",
        "CHECKPOINT.AUTO_RESUME=False",
        "CHECKPOINT.OVERWRITE_EXISTING=True"};
    // Each variant: the job's settings, and the FSDP settings on top of them. Plain SGD comes
    // first: clipping, AdamW and LARC do not see a gradient that is off by a constant factor.
    const std::vector<std::tuple<std::string, Overrides, Overrides>> variants = {
        {"every block a unit, sgd momentum", {}, {}},
        {"clipping", {"MODEL.GRAD_CLIP.USE_GRAD_CLIP=True", "MODEL.GRAD_CLIP.MAX_NORM=0.5"}, {}},
        {"one root unit", {}, {"MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD=100000000"}},
        {"no reshard after forward, no prefetch",
         {},
         {"MODEL.FSDP_CONFIG.reshard_after_forward=False", "MODEL.FSDP_CONFIG.prefetch=False"}},
        {"accumulation 2", {"TRAINER.GRADIENT_ACCUMULATION_STEPS=2"}, {}},
        {"adamw", {"OPTIMIZER.name=adamw", "OPTIMIZER.param_schedulers.lr.start_value=0.002"}, {}},
        {"adam, L2 decay and amsgrad",
         {"OPTIMIZER.name=adam",
          "OPTIMIZER.amsgrad=True",
          "OPTIMIZER.param_schedulers.lr.start_value=0.002"},
         {}},
        {"rmsprop, centered with momentum",
         {"OPTIMIZER.name=rmsprop",
          "OPTIMIZER.centered=True",
          "OPTIMIZER.param_schedulers.lr.start_value=0.001"},
         {}},
        {"larc", {"OPTIMIZER.use_larc=True"}, {}},
        // LARS's norms completed across the ranks' pieces, its exclusion by name (every
        // piece is 1-D); eta 0.02 so that a per-piece norm would show.
        {"lars",
         {"OPTIMIZER.name=lars", "OPTIMIZER.eta=0.02", "OPTIMIZER.exclude_bias_and_norm=True"},
         {}},
        // Every block its own segment, the first two checkpointed: the recompute in the
        // backward gathers each unit again.
        {"activation checkpointing",
         {"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
          "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=3"},
         {}},
        {"activation checkpointing, no reshard after forward",
         {"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
          "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=2"},
         {"MODEL.FSDP_CONFIG.reshard_after_forward=False"}},
        {"resnet18",
         {"MODEL.TRUNK.NAME=resnet",
          "MODEL.TRUNK.RESNETS.DEPTH=18",
          "MODEL.TRUNK.RESNETS.STEM=cifar",
          "OPTIMIZER.num_epochs=1"},
         {}},
        {"vit",
         {"MODEL.TRUNK.NAME=vision_transformer",
          "MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE=6",
          "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=2",
          "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=32",
          "MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=64",
          "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=2"},
         {}},
    };
    for (const auto& [what, settings, fsdp_settings] : variants) {
      const RunResult ddp = train_run(dir / "ddp", job + settings, borrow(group));
      expect_same_training(
          train_run(dir / "fsdp", job + settings + kFsdp + fsdp_settings, borrow(group)),
          ddp,
          kTolerance,
          "FSDP, " + what);
    }
  });
}

TEST(TrainerFsdpTest, AutocastWithTheShardedLossScalerTrainsLikeDdp) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    const fs::path dir = test_dir();
    // bfloat16 autocast (the CPU's low-precision type) with PyTorch's dynamic scaler; AMP on
    // makes AUTO_SETUP_FSDP select mixed_precision with float32 units (VISSL's inference), and
    // fp32_reduce_scatter is then allowed.
    const Overrides job = {
        "OPTIMIZER.num_epochs=1",
        "CHECKPOINT.AUTO_RESUME=False",
        "CHECKPOINT.OVERWRITE_EXISTING=True",
        "MODEL.AMP_PARAMS.USE_AMP=True",
        "MODEL.AMP_PARAMS.AMP_TYPE=pytorch",
        "MODEL.AMP_PARAMS.DTYPE=bfloat16"};
    const RunResult ddp = train_run(dir / "ddp", job, borrow(group));
    const RunResult fsdp = train_run(
        dir / "fsdp",
        job + kFsdp + Overrides{"MODEL.FSDP_CONFIG.fp32_reduce_scatter=True"},
        borrow(group));
    // bfloat16 ops round to 8 bits of mantissa: a last-bit difference of a float32 input (the
    // reduction order above) can flip one rounding, so the comparison is at bfloat16's
    // resolution (2^-8 relative) rather than float32's.
    expect_same_training(fsdp, ddp, 4e-3, "FSDP under bfloat16 autocast");
  });
}

// FSDP's AMP_TYPE O2 with a bfloat16 AMP: compute copies of float32 shards, BatchNorm in
// float32, the gradients reduced in float32.
const Overrides kFsdpO2 = {
    "MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True",
    "MODEL.AMP_PARAMS.USE_AMP=True",
    "MODEL.AMP_PARAMS.DTYPE=bfloat16",
    "MODEL.FSDP_CONFIG.AMP_TYPE=O2",
    "MODEL.FSDP_CONFIG.fp32_reduce_scatter=True"};

TEST(TrainerFsdpTest, ComputeCopiesComputeLikeApexO2) {
  // One process: FSDP's compute copies compute what Apex O2 computes (a bfloat16 model with
  // float32 BatchNorm, inputs cast down, the loss in float32), so the first iteration's loss
  // is Apex's, to the rounding of the conv weights' layouts (channels-last in the Apex
  // model, contiguous in FSDP's flat buffers). After the first step the two part ways on
  // purpose: Apex makes its float32 masters from the already-cast model, FSDP keeps the
  // float32 weights as its masters (as FairScale does), and bfloat16 training amplifies
  // that difference. The library test (BFloat16ComputeCopiesTrainFloat32MastersLikeApexO2)
  // checks every step against masters made from the float32 weights.
  const fs::path dir = test_dir();
  const Overrides job = {
      "OPTIMIZER.num_epochs=1",
      "CHECKPOINT.AUTO_RESUME=False",
      "CHECKPOINT.OVERWRITE_EXISTING=True"};
  auto single = comm::ProcessGroup::single_process();
  const RunResult apex = train_run(
      dir / "apex",
      job +
          Overrides{
              "MODEL.AMP_PARAMS.USE_AMP=True",
              "MODEL.AMP_PARAMS.AMP_TYPE=apex",
              "MODEL.AMP_PARAMS.AMP_ARGS.opt_level=O2",
              "MODEL.AMP_PARAMS.DTYPE=bfloat16"},
      single);
  const RunResult fsdp = train_run(dir / "fsdp", job + kFsdpO2, single);
  ASSERT_FALSE(fsdp.summary.iteration_losses.empty());
  EXPECT_NEAR(fsdp.summary.iteration_losses[0], apex.summary.iteration_losses[0], 1e-3);
  // The masters the optimizer stepped keep float32 precision (Apex's model is bfloat16).
  for (const auto& [name, value] : fsdp.parameters) {
    EXPECT_EQ(value.scalar_type(), at::kFloat) << name;
  }
}

TEST(TrainerFsdpTest, ComputeCopiesDoNotDependOnTheUnitLayoutOrCheckpointing) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    // Every block a unit with prefetch, against one root unit (plus the float32 unit) kept
    // from forward to backward, and against activation checkpointing: the same bfloat16
    // values meet the same ops, and the float32 sums of two ranks' gradients are exact in
    // any order.
    const fs::path dir = test_dir();
    const Overrides job = {
        "OPTIMIZER.num_epochs=1",
        "CHECKPOINT.AUTO_RESUME=False",
        "CHECKPOINT.OVERWRITE_EXISTING=True"};
    const RunResult blocks = train_run(dir / "blocks", job + kFsdpO2, borrow(group));
    expect_same_training(
        train_run(
            dir / "root",
            job + kFsdpO2 +
                Overrides{
                    "MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD=100000000",
                    "MODEL.FSDP_CONFIG.reshard_after_forward=False",
                    "MODEL.FSDP_CONFIG.prefetch=False"},
            borrow(group)),
        blocks,
        kTolerance,
        "FSDP compute copies, one root unit");
    // Activation checkpointing: the recompute gathers the bfloat16 copies again and runs the
    // same ops on them.
    expect_same_training(
        train_run(
            dir / "checkpointed",
            job + kFsdpO2 +
                Overrides{
                    "MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True",
                    "MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS=3"},
            borrow(group)),
        blocks,
        kTolerance,
        "FSDP compute copies with activation checkpointing");
  });
}

TEST(TrainerFsdpTest, ComputeCopiesResumeBitExactly) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    // The checkpoint holds the float32 masters (gathered from the shards, not the bfloat16
    // copies): the resumed run casts the same copies again and continues bit for bit.
    const fs::path dir = test_dir();
    expect_mid_epoch_resume_bit_exact(dir, kFsdpO2, group);
    // The model entry holds float32 values below bfloat16's resolution: the masters.
    if (group.rank() == 0) {
      const auto model = checkpoint::load_checkpoint(dir / "full" / "checkpoint.torch")
                             .at("model")
                             .toGenericDict();
      double below_bfloat16 = 0;
      for (const auto& item : model) {
        const at::Tensor value = item.value().toTensor();
        if (value.scalar_type() == at::kFloat) {
          below_bfloat16 = std::max(
              below_bfloat16,
              (value - value.to(at::kBFloat16).to(at::kFloat)).abs().max().item<double>());
        }
      }
      EXPECT_GT(below_bfloat16, 0.0);
    }
  });
}

TEST(TrainerFsdpTest, CheckpointResumeIsBitExact) {
  run_on_ranks(2, [](comm::ProcessGroup& group) {
    // 6 iterations per epoch, interrupted at 10, resumed from the checkpoint of 8.
    expect_mid_epoch_resume_bit_exact(
        test_dir(), Overrides{"OPTIMIZER.name=adamw"} + kFsdp, group, [](const fs::path& run) {
          EXPECT_TRUE(fs::exists(run / "model_iteration8_shard0.torch"));
          EXPECT_TRUE(fs::exists(run / "model_iteration8_shard1.torch"));
          EXPECT_TRUE(fs::exists(run / "model_iteration8.manifest.json"));
        });
  });
}

TEST(TrainerFsdpTest, CheckpointsResumeAtOtherWorldSizesAndStagesAndConsolidate) {
  const fs::path root = test_dir();
  // 2 epochs of 3 iterations; checkpoint.torch is model_phase0 (the end of epoch 0), written
  // by 2 ranks with a plain optimizer state ("plain") and by FSDP ("fsdp").
  const Overrides job = {"OPTIMIZER.num_epochs=2"};
  if (largo::testing::is_parent()) {
    fs::remove_all(root);
  }
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    train_run(root / "plain", job, borrow(group), /*stop_after=*/4);
    train_run(root / "fsdp", job + kFsdp, borrow(group), 4);
  });
  ASSERT_TRUE(fs::exists(root / "fsdp" / "model_phase0_shard1.torch"));

  if (largo::testing::is_parent()) {
    // The model entry is a plain state dict of whole tensors, equal to the DDP run's.
    const auto fsdp_model = checkpoint::load_checkpoint(root / "fsdp" / "model_phase0.torch")
                                .at("model")
                                .toGenericDict();
    const auto plain_model = checkpoint::load_checkpoint(root / "plain" / "model_phase0.torch")
                                 .at("model")
                                 .toGenericDict();
    ASSERT_EQ(fsdp_model.size(), plain_model.size());
    for (const auto& item : plain_model) {
      EXPECT_TRUE(torch::allclose(
          fsdp_model.at(item.key()).toTensor(), item.value().toTensor(), kTolerance, kTolerance))
          << item.key().toStringRef();
    }
    // One process: the FSDP checkpoint continues like the plain one in an unsharded run, a
    // one-rank FSDP run and a one-rank ZeRO-1 run.
    for (const char* copy : {"plain_at1", "fsdp_at1_plain", "fsdp_at1_fsdp", "fsdp_at1_zero"}) {
      copy_run(root / (std::string(copy).rfind("plain", 0) == 0 ? "plain" : "fsdp"), root / copy);
    }
    auto single = comm::ProcessGroup::single_process();
    const RunResult expected = train_run(root / "plain_at1", job, single);
    ASSERT_TRUE(expected.summary.resumed);
    expect_same_training(
        train_run(root / "fsdp_at1_plain", job, single),
        expected,
        kTolerance,
        "FSDP checkpoint of 2 ranks into an unsharded run");
    expect_same_training(
        train_run(root / "fsdp_at1_fsdp", job + kFsdp, single),
        expected,
        kTolerance,
        "FSDP checkpoint of 2 ranks into a 1-rank FSDP run");
    expect_same_training(
        train_run(root / "fsdp_at1_zero", job + Overrides{"OPTIMIZER.use_zero=True"}, single),
        expected,
        kTolerance,
        "FSDP checkpoint of 2 ranks into a 1-rank ZeRO-1 run");

    // Offline consolidation gives the plain run's optimizer state.
    const fs::path consolidated = checkpoint::consolidate_checkpoint(root / "fsdp");
    expect_same_momentum(consolidated, root / "plain" / "model_phase0.torch", kTolerance);
    // PyTorch reads the consolidated checkpoint as it reads the plain one.
    if (fs::exists(LARGO_PYTHON)) {
      const std::string command = fmt::format(
          LARGO_PYTHON
          " -c \"import torch; d = torch.load('{}'); p = torch.load('{}'); "
          "assert d['model'].keys() == p['model'].keys(); "
          "assert all(torch.allclose(d['model'][k].double(), p['model'][k].double(), atol=1e-5) "
          "for k in p['model']); "
          "assert d['optimizer']['state'].keys() == p['optimizer']['state'].keys()\"",
          consolidated.string(),
          (root / "plain" / "model_phase0.torch").string());
      EXPECT_EQ(std::system(command.c_str()), 0) << command;
    }
    copy_run(root / "plain", root / "plain_at3");
    copy_run(root / "fsdp", root / "fsdp_at3");
    copy_run(root / "plain", root / "plain_into_fsdp_at3");
  }
  // Three ranks: the FSDP shards of 2 ranks resharded over 3, and a plain DDP checkpoint
  // taken up by a 3-rank FSDP run, equal the plain checkpoint's 3-rank DDP run.
  run_on_ranks(3, [&](comm::ProcessGroup& group) {
    const RunResult expected = train_run(root / "plain_at3", job, borrow(group));
    ASSERT_TRUE(expected.summary.resumed);
    expect_same_training(
        train_run(root / "fsdp_at3", job + kFsdp, borrow(group)),
        expected,
        kTolerance,
        "FSDP shards of 2 ranks into 3");
    expect_same_training(
        train_run(root / "plain_into_fsdp_at3", job + kFsdp, borrow(group)),
        expected,
        kTolerance,
        "a DDP checkpoint into a 3-rank FSDP run");
  });
}

std::string setup_error(const Overrides& overrides) {
  try {
    Trainer trainer(
        trainer_options_from_config(synthetic_job_config(test_dir(), kFsdp + overrides)),
        "",
        comm::ProcessGroup::single_process());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TrainerFsdpConfigTest, CombinationsNotBuiltAreClearErrors) {
  // fp32_reduce_scatter needs mixed_precision, which AUTO_SETUP_FSDP takes from USE_AMP.
  EXPECT_NE(
      setup_error({"MODEL.FSDP_CONFIG.fp32_reduce_scatter=True"})
          .find("fp32_reduce_scatter needs mixed_precision"),
      std::string::npos);
  // Compute copies need mixed precision (USE_AMP); without it FSDP's AMP_TYPE O2 changes
  // nothing (as in VISSL), but an explicit half compute_dtype is an error.
  EXPECT_NE(
      setup_error({"MODEL.FSDP_CONFIG.compute_dtype=bfloat16"})
          .find("compute_dtype bfloat16 needs mixed_precision"),
      std::string::npos);
  EXPECT_EQ(setup_error({"MODEL.FSDP_CONFIG.AMP_TYPE=O2"}), "(no error)");
  EXPECT_NE(setup_error({"OPTIMIZER.use_zero=True"}).find("both on"), std::string::npos);
  try {
    trainer_options_from_config(synthetic_job_config(
        test_dir(), kFsdp + Overrides{"MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD=-1"}));
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("AUTO_WRAP_THRESHOLD"), std::string::npos) << e.what();
  }
}

TEST(TrainerFsdpConfigTest, TheSeedsKeysConfigureIt) {
  // MODEL.FSDP_CONFIG as the seed lists it, with AMP on: VISSL's inference selects PyTorch
  // AMP and mixed precision.
  const std::string seed = R"(
MODEL:
  AMP_PARAMS:
    USE_AMP: True
    AMP_TYPE: apex
  FSDP_CONFIG:
    AUTO_SETUP_FSDP: True
    AUTO_WRAP_THRESHOLD: 5000
    AMP_TYPE: "01"
    flatten_parameters: True
    mixed_precision: True
    fp32_reduce_scatter: True
    compute_dtype: float32
    bucket_cap_mb: 0
    clear_autocast_cache: True
    verbose: True
)";
  Config config = synthetic_job_config(test_dir());
  config.merge_yaml(seed, "the seed");
  const TrainerOptions options = trainer_options_from_config(config);
  const parallel::FullyShardedDataParallelOptions& fsdp = options.parallel.fsdp;
  EXPECT_EQ(options.parallel.data_parallelism, parallel::DataParallelism::kFsdp);
  EXPECT_EQ(
      fsdp.wrap_policy.describe(),
      "the elements of trunk that are modules with >= 5000 trainable parameter elements");
  EXPECT_TRUE(fsdp.fp32_reduce_scatter); // allowed: AMP on turns mixed_precision on
  EXPECT_FALSE(fsdp.compute_dtype);      // compute_dtype float32: float32 units
  EXPECT_TRUE(fsdp.reshard_after_forward);
  EXPECT_EQ(options.amp.amp_type, "pytorch");
  // AMP off: mixed_precision off whatever the key says, so no compute copies.
  const TrainerOptions no_amp =
      trainer_options_from_config(synthetic_job_config(test_dir(), kFsdp));
  EXPECT_FALSE(no_amp.parallel.fsdp.compute_dtype);
  EXPECT_FALSE(no_amp.amp.use_amp);
}

} // namespace
} // namespace largo::train::trainer_fsdp_test
