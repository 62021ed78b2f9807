// MODEL.FEATURE_EVAL_SETTINGS in training: a linear evaluation of a pretrained ResNet trains
// heads on tapped features while the trunk keeps its weights and BatchNorm statistics bit for
// bit; each head is scored on its own (checked against the heads recomputed here from the final
// checkpoint); two ranks train the heads as one process does; what cannot compose is refused.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/run_directory.h>
#include <largo/core/error.h>
#include <largo/models/model_factory.h>
#include <largo/train/run_plan.h>
#include <largo/train/training_data.h>

#include "comm/distributed_test_util.h"
#include "train/trainer_run_util.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <map>

namespace largo::train::trainer_linear_eval_test {
namespace {

namespace fs = std::filesystem;
using largo::testing::run_on_ranks;

const Overrides kResNet{
    "MODEL.TRUNK.NAME=resnet", "MODEL.TRUNK.RESNETS.DEPTH=18", "OPTIMIZER.num_epochs=1"};

const Overrides kFrozenTrunk{
    "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
    "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True"};

// Two heads: res4 (256 channels, 2x2 from 24x24 images) averaged to 1x1 into VISSL's eval_mlp,
// and res5avg into an mlp.
const Overrides kTwoHeads =
    kFrozenTrunk +
    Overrides{
        "MODEL.FEATURE_EVAL_SETTINGS.SHOULD_FLATTEN_FEATS=False",
        R"(MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[["res4", ["AdaptiveAvgPool2d", [[1, 1]]]], ["res5avg", ["Identity", []]]])",
        R"(MODEL.HEAD.PARAMS=[["eval_mlp", {"in_channels": 256, "dims": [256, 10]}], ["mlp", {"dims": [512, 10]}]])"};

using Tensors = std::map<std::string, at::Tensor>;

Tensors model_of(const fs::path& checkpoint_file) {
  Tensors tensors;
  for (const auto& entry :
       checkpoint::load_checkpoint(checkpoint_file).at("model").toGenericDict()) {
    tensors.emplace(entry.key().toStringRef(), entry.value().toTensor());
  }
  return tensors;
}

bool is_trunk(const std::string& name) {
  return name.rfind("trunk.", 0) == 0;
}

// A ResNet-18 trained for one epoch (collective): the weights a linear evaluation starts from.
fs::path pretrain(const fs::path& dir, comm::ProcessGroup& group) {
  train_run(dir / "pretrain", kResNet, borrow(group));
  group.barrier(); // rank 0 has written the checkpoint
  return dir / "pretrain" / checkpoint::kLatestCheckpointName;
}

Overrides linear_evaluation_of(const fs::path& weights, const Overrides& heads) {
  return kResNet + heads +
         Overrides{"MODEL.WEIGHTS_INIT.PARAMS_FILE=" + weights.string(), "OPTIMIZER.num_epochs=2"};
}

// Each head's top-1 (percent) and the loss summed over the heads, averaged over the test
// split, recomputed from a checkpoint's weights in a model built here.
struct HeadScores {
  std::vector<double> top1;
  double loss = 0.0;
};

HeadScores score_heads(const Config& config, const fs::path& checkpoint_file) {
  const RunPlan plan = resolve_run(config);
  models::LinearEvalModel model(models::build_model(plan.model), plan.model.feature_eval);
  torch::NoGradGuard no_grad;
  const auto parameters = model->named_parameters();
  const auto buffers = model->named_buffers();
  for (const auto& [name, value] : model_of(checkpoint_file)) {
    const at::Tensor* target = parameters.find(name) ? parameters.find(name) : buffers.find(name);
    if (target == nullptr) {
      throw Error("the model has no " + name);
    }
    at::Tensor(*target).copy_(value);
  }
  model->eval();
  TrainingData data(plan.options, 0, 1);
  data::DataLoader& loader = data.test_loader();
  loader.start_epoch(data.test_order(), 0, 0);
  HeadScores scores;
  scores.top1.assign(static_cast<size_t>(model->num_outputs()), 0.0);
  int64_t samples = 0;
  while (auto batch = loader.next()) {
    const std::vector<at::Tensor> outputs = model->forward_outputs(batch->images);
    for (size_t i = 0; i < outputs.size(); ++i) {
      scores.top1[i] += outputs[i].argmax(1).eq(batch->labels).sum().item<double>();
      scores.loss += torch::nn::functional::cross_entropy(
                         outputs[i].to(at::kDouble),
                         batch->labels,
                         torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                         .item<double>();
    }
    samples += batch->labels.size(0);
  }
  for (double& top1 : scores.top1) {
    top1 *= 100.0 / static_cast<double>(samples);
  }
  scores.loss /= static_cast<double>(samples);
  return scores;
}

// Two heads on a frozen ResNet-18: the trunk's parameters and BatchNorm statistics in every
// checkpoint are the pretrained ones bit for bit, the heads move, and each evaluation reports
// each head's top-1, the best head's as top1, equal to the heads recomputed from the final
// checkpoint (the loss to float32 rounding of 10-class logits: 1e-5 relative).
TEST(TrainerLinearEvalTest, TheFrozenTrunkKeepsItsWeightsWhileEachHeadTrainsAndIsScored) {
  const fs::path dir = test_dir_for("linear_eval");
  fs::remove_all(dir);
  const auto one = comm::ProcessGroup::single_process();
  const Tensors pretrained = model_of(pretrain(dir, *one));
  const Overrides job =
      linear_evaluation_of(dir / "pretrain" / checkpoint::kLatestCheckpointName, kTwoHeads) +
      Overrides{"CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"};
  const fs::path run = dir / "linear";
  train_run(run, job, one);

  const Tensors first = model_of(run / "model_iteration1.torch");
  const Tensors last = model_of(run / checkpoint::kLatestCheckpointName);
  ASSERT_EQ(last.size(), first.size());
  int64_t trunk_tensors = 0;
  for (const auto& [name, value] : last) {
    if (is_trunk(name)) {
      ++trunk_tensors;
      ASSERT_TRUE(pretrained.count(name)) << name;
      EXPECT_TRUE(value.equal(first.at(name))) << name;
      // WEIGHTS_INIT's default SKIP_LAYERS leaves num_batches_tracked out, as in VISSL.
      if (name.find("num_batches_tracked") == std::string::npos) {
        EXPECT_TRUE(value.equal(pretrained.at(name))) << name;
      }
    } else {
      EXPECT_EQ(name.rfind("heads.", 0), 0u) << name;
      if (name.find("num_batches_tracked") == std::string::npos) {
        EXPECT_FALSE(value.equal(first.at(name))) << name << " did not train";
      }
    }
  }
  EXPECT_EQ(
      trunk_tensors,
      static_cast<int64_t>(
          std::count_if(pretrained.begin(), pretrained.end(), [](const auto& item) {
            return is_trunk(item.first);
          })));

  std::vector<nlohmann::json> tests;
  for (const auto& record : read_metrics(run / "metrics.jsonl")) {
    if (record.at("phase") == "test") {
      tests.push_back(record);
    }
  }
  ASSERT_EQ(tests.size(), 2u); // after each epoch
  const nlohmann::json& final_test = tests.back();
  const std::vector<double> per_head = final_test.at("top1_per_output");
  ASSERT_EQ(per_head.size(), 2u);
  const size_t best = final_test.at("best_output");
  EXPECT_EQ(final_test.at("top1").get<double>(), per_head[best]);
  EXPECT_EQ(per_head[best], *std::max_element(per_head.begin(), per_head.end()));
  EXPECT_EQ(final_test.at("top5_per_output").size(), 2u);

  const HeadScores expected =
      score_heads(synthetic_job_config(run, job), run / checkpoint::kLatestCheckpointName);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(per_head[i], expected.top1[i], 1e-9) << "head " << i;
  }
  EXPECT_NEAR(final_test.at("loss").get<double>(), expected.loss, 1e-5 * expected.loss);

  // Evaluated again with the heads frozen too (FREEZE_TRUNK_AND_HEAD in a TEST_ONLY run of
  // the directory): the same figures.
  const std::string eval = "MODEL.FEATURE_EVAL_SETTINGS.";
  train_run(
      run,
      job +
          Overrides{
              eval + "FREEZE_TRUNK_ONLY=False",
              eval + "FREEZE_TRUNK_AND_HEAD=True",
              "TEST_ONLY=True"},
      one);
  const nlohmann::json again = read_metrics(run / "metrics.jsonl").back();
  EXPECT_EQ(again.at("phase"), "test");
  EXPECT_EQ(again.at("top1_per_output"), final_test.at("top1_per_output"));
}

// Without feature taps the model's own head trains on its frozen trunk.
TEST(TrainerLinearEvalTest, WithoutTapsTheModelsOwnHeadTrains) {
  const fs::path dir = test_dir_for("linear_eval");
  fs::remove_all(dir);
  const auto one = comm::ProcessGroup::single_process();
  const Tensors pretrained = model_of(pretrain(dir, *one));
  const fs::path run = dir / "linear";
  train_run(
      run,
      linear_evaluation_of(dir / "pretrain" / checkpoint::kLatestCheckpointName, kFrozenTrunk),
      one);
  const Tensors last = model_of(run / checkpoint::kLatestCheckpointName);
  ASSERT_EQ(last.size(), pretrained.size());
  for (const auto& [name, value] : last) {
    if (name.find("num_batches_tracked") == std::string::npos) { // not loaded (SKIP_LAYERS)
      EXPECT_EQ(value.equal(pretrained.at(name)), is_trunk(name)) << name;
    }
  }
}

// Data parallelism over parameters of which most are frozen: two ranks with half the batch
// each end with the heads one process trains on the whole batch (float32 sums in another
// order: 1e-5) — under DDP with mlp heads, and under ZeRO-2 with eval_mlp heads whose
// BatchNorm is synchronized over both ranks (one process: plain BatchNorm on the whole batch).
TEST(TrainerLinearEvalTest, TwoRanksTrainTheHeadsAsOneProcess) {
  const fs::path dir = test_dir_for("linear_eval");
  const std::string taps =
      R"(MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[["res4", ["AdaptiveAvgPool2d", [[1, 1]]]], ["flatten", ["Identity", []]]])";
  struct Variant {
    std::string name;
    Overrides heads;
    Overrides two_ranks_only;
  };
  const std::vector<Variant> variants{
      {"ddp",
       kFrozenTrunk +
           Overrides{
               taps,
               R"(MODEL.HEAD.PARAMS=[["mlp", {"dims": [256, 10]}], ["mlp", {"dims": [512, 10]}]])"},
       {}},
      {"zero2_sync_bn",
       kFrozenTrunk +
           Overrides{
               taps,
               R"(MODEL.HEAD.PARAMS=[["eval_mlp", {"in_channels": 256, "dims": [256, 10]}], ["eval_mlp", {"in_channels": 512, "dims": [512, 10]}]])"},
       {"MODEL.SHARDED_DDP_SETUP.USE_SDP=True",
        "MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=True",
        "MODEL.SYNC_BN_CONFIG.GROUP_SIZE=0"}},
  };
  run_on_ranks(2, [&](comm::ProcessGroup& group) {
    if (group.rank() == 0) {
      fs::remove_all(dir);
    }
    group.barrier();
    const fs::path weights = pretrain(dir, group);
    for (const Variant& variant : variants) {
      // Without the random flip: an in-memory dataset's transform draws follow the batches
      // (data_loader.h's batch_seed), which differ between one process and two ranks.
      const Overrides job = linear_evaluation_of(weights, variant.heads) +
                            Overrides{"DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]"};
      const RunResult two = train_run(
          dir / (variant.name + "_two"),
          job + variant.two_ranks_only + Overrides{"DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"},
          borrow(group));
      if (group.rank() == 0) {
        const RunResult one =
            train_run(dir / (variant.name + "_one"), job, comm::ProcessGroup::single_process());
        ASSERT_EQ(two.parameters.size(), one.parameters.size());
        for (const auto& [name, value] : one.parameters) {
          EXPECT_TRUE(torch::allclose(two.parameters.at(name), value, 1e-5, 1e-5))
              << variant.name << ": " << name << " differs by "
              << (two.parameters.at(name) - value).abs().max().item<double>();
        }
      }
      group.barrier();
    }
  });
}

// A RegNet's and a ViT's features, tapped by VISSL's names, train one head each: the run plan
// takes them, its model gives one output per head, and a run trains them (finite losses).
TEST(TrainerLinearEvalTest, RegNetAndVitTrunksAreTappedByVisslsNames) {
  const fs::path dir = test_dir_for("linear_eval");
  const Overrides regnet{
      "MODEL.TRUNK.NAME=regnet",
      "MODEL.TRUNK.REGNET={depth: 6, w_0: 8, w_a: 8.0, w_m: 2.0, group_width: 4, stem_width: 8}",
      R"(MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[["res3", ["AdaptiveAvgPool2d", [[1, 1]]]], ["avgpool", ["Identity", []]]])",
      R"(MODEL.HEAD.PARAMS=[["eval_mlp", {"in_channels": 16, "dims": [16, 10]}], ["mlp", {"dims": [64, 10]}]])"};
  const Overrides vit{
      "MODEL.TRUNK.NAME=vision_transformer",
      "MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE=8",
      "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=2",
      "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=2",
      "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=16",
      "MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=32",
      R"(MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[["concatCLS2", ["Identity", []]], ["blkCLS0", ["Identity", []]]])",
      R"(MODEL.HEAD.PARAMS=[["eval_mlp", {"in_channels": 32, "dims": [32, 10]}], ["mlp", {"dims": [16, 10]}]])"};
  for (const auto& [name, trunk] :
       std::vector<std::pair<std::string, Overrides>>{{"regnet", regnet}, {"vit", vit}}) {
    const fs::path run = dir / name;
    fs::remove_all(run);
    const Overrides job = trunk + kFrozenTrunk + Overrides{"OPTIMIZER.num_epochs=1"};
    const RunPlan plan = resolve_run(synthetic_job_config(run, job));
    models::LinearEvalModel model(models::build_model(plan.model), plan.model.feature_eval);
    const std::vector<at::Tensor> outputs = model->forward_outputs(torch::randn({2, 1, 24, 24}));
    ASSERT_EQ(outputs.size(), 2u) << name;
    EXPECT_EQ(outputs[1].sizes(), (std::vector<int64_t>{2, 10})) << name;
    const RunResult result = train_run(run, job, comm::ProcessGroup::single_process());
    ASSERT_FALSE(result.summary.iteration_losses.empty()) << name;
    for (float loss : result.summary.iteration_losses) {
      EXPECT_TRUE(std::isfinite(loss)) << name;
    }
    EXPECT_EQ(result.parameters.count("heads.1.clf.0.weight"), 1u) << name;
  }
}

// Settings that would change nothing, or cannot compose with a frozen trunk, stop the run
// before anything is built, naming the key.
TEST(TrainerLinearEvalTest, RefusesWhatALinearEvaluationCannotDo) {
  const fs::path dir = test_dir_for("linear_eval");
  const std::string eval = "MODEL.FEATURE_EVAL_SETTINGS.";
  const std::vector<std::pair<Overrides, std::string>> cases{
      {{eval + "FREEZE_TRUNK_ONLY=True"}, "FREEZE_TRUNK_ONLY is set but"},
      {{eval + "EVAL_TRUNK_AND_HEAD=True"}, "EVAL_TRUNK_AND_HEAD is set but"},
      {kFrozenTrunk + Overrides{eval + "FREEZE_TRUNK_AND_HEAD=True"}, "choose one"},
      {{eval + "EVAL_MODE_ON=True", eval + "FREEZE_TRUNK_AND_HEAD=True"}, "TEST_ONLY"},
      {kFrozenTrunk + Overrides{"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}, "FSDP"},
      {kFrozenTrunk + Overrides{"MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING=True"},
       "MODEL.ACTIVATION_CHECKPOINTING"},
      {Overrides{"MODEL.TRUNK.NAME=small_cnn"} + kTwoHeads,
       "inside a resnet, regnet, vision_transformer trunk, but MODEL.TRUNK.NAME is small_cnn"},
      {kResNet + kFrozenTrunk +
           Overrides{
               R"(MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[["flatten", ["Identity", []]]])",
               R"(MODEL.HEAD.PARAMS=[["mlp", {"dims": [512, 5]}]])"},
       "MODEL.HEAD.PARAMS[0] ends in 5 outputs"},
  };
  for (const auto& [overrides, expected] : cases) {
    try {
      resolve_run(synthetic_job_config(dir, overrides));
      ADD_FAILURE() << "accepted: " << overrides.back();
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  }
}

} // namespace
} // namespace largo::train::trainer_linear_eval_test
