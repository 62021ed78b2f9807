// `largo estimate`: per-rank model-state bytes of ZeRO stages 0-3 for a config, the
// configured stage marked, and stage 3's gathered units; with tensor parallelism the same
// over each rank's shards; with a pipeline, per pipeline rank its stages' model state and
// peak activations (with tensor parallelism too: its stages' shards, activations not
// measured). The numbers themselves are checked
// against measurements in tests/parallel/estimate/memory_estimate_test.cpp; here the program's
// reading of the config and its report
// (tests/parallel/estimate/mesh_memory_estimate_test.cpp checks the library's estimate), and the
// self-supervised method's own state (the DINO teacher, the MoCo momentum encoder and queue).
#include "apps/program_runner.h"
#include "data/image_test_util.h"
#include "test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace largo::testing::estimate_command_test {
namespace {

namespace fs = std::filesystem;

// A synthetic small-CNN job on 2 ranks with AdamW (Ψ parameters: stage 0 holds 16Ψ bytes per
// rank, stage 3 16Ψ / 2).
std::vector<std::string> estimate_command(std::vector<std::string> overrides) {
  std::vector<std::string> argv = {largo_program(),
                                   "estimate",
                                   "DATA.TRAIN.DATA_SOURCES=[synthetic]",
                                   "DATA.TEST.DATA_SOURCES=[synthetic]",
                                   "MODEL.TRUNK.NAME=small_cnn",
                                   "OPTIMIZER.name=adamw",
                                   // the default job's SGD sets it; adamw does not read it
                                   "OPTIMIZER.nesterov=False",
                                   "DISTRIBUTED.NUM_PROC_PER_NODE=2"};
  argv.insert(argv.end(), overrides.begin(), overrides.end());
  return argv;
}

// "15.25" "MiB" -> bytes (to the rounding of the printed figure).
double to_bytes(const std::string& value, const std::string& unit) {
  const double scale = unit == "GiB" ? 1024.0 * 1024 * 1024
      : unit == "MiB"                ? 1024.0 * 1024
      : unit == "KiB"                ? 1024.0
                                     : 1.0;
  return std::stod(value) * scale;
}

// The byte columns of a stage's row ("  2 ZeRO-2 ... <parameters> <gradients> <optimizer
// state> <total> <formula>"), in bytes.
std::vector<double> stage_row_bytes(const std::string& output, int stage) {
  std::istringstream lines(output);
  const std::regex row("^[ *] " + std::to_string(stage) + " .*");
  const std::regex figure("([0-9.]+) (B|KiB|MiB|GiB)");
  for (std::string line; std::getline(lines, line);) {
    if (!std::regex_match(line, row)) {
      continue;
    }
    std::vector<double> bytes;
    for (std::sregex_iterator it(line.begin(), line.end(), figure), end; it != end; ++it) {
      bytes.push_back(to_bytes((*it)[1], (*it)[2]));
    }
    if (bytes.size() == 5) {
      return bytes;
    }
  }
  ADD_FAILURE() << "no row for stage " << stage << " in:\n" << output;
  return std::vector<double>(5, 0.0);
}

// The total column of a stage's row, in bytes.
double stage_total_bytes(const std::string& output, int stage) {
  return stage_row_bytes(output, stage)[3];
}

TEST(EstimateCommandTest, MarksStageThreeAndItsGatheredUnits) {
  auto run = run_program(estimate_command({"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True"}));
  ASSERT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  EXPECT_NE(run.output.find("\n* 3 ZeRO-3"), std::string::npos) << run.output;
  // AdamW: stage 0 keeps parameters, gradients and two moments whole; stage 3 half of each
  // (to the padding and the rounding of the printed figures).
  EXPECT_NEAR(stage_total_bytes(run.output, 3) / stage_total_bytes(run.output, 0), 0.5, 0.01)
      << run.output;
  // The small CNN's three trunk blocks each have parameters: with threshold 0, three units.
  EXPECT_NE(run.output.find("3 block units with AUTO_WRAP_THRESHOLD 0"), std::string::npos)
      << run.output;

  auto one_unit = run_program(estimate_command(
      {"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True", "MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD=100000000"}));
  ASSERT_TRUE(one_unit.succeeded()) << one_unit.output;
  EXPECT_NE(one_unit.output.find("0 block units with AUTO_WRAP_THRESHOLD 100000000"),
            std::string::npos)
      << one_unit.output;
}

TEST(EstimateCommandTest, StageThreeGathersComputeCopiesWithFsdpO2) {
  // FSDP's AMP_TYPE O2 with a bfloat16 AMP: the block units are gathered as bfloat16 copies,
  // half the bytes of the float32 ones; the BatchNorm parameters are a float32 unit.
  const std::vector<std::string> amp = {"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True",
                                        "MODEL.AMP_PARAMS.USE_AMP=True",
                                        "MODEL.AMP_PARAMS.DTYPE=bfloat16"};
  std::vector<std::string> o2 = amp;
  o2.push_back("MODEL.FSDP_CONFIG.AMP_TYPE=O2");
  auto copies = run_program(estimate_command(o2));
  ASSERT_TRUE(copies.succeeded()) << copies.status() << "\n" << copies.output;
  EXPECT_NE(copies.output.find("the root and float32 units"), std::string::npos) << copies.output;
  EXPECT_NE(copies.output.find("as BFloat16 compute copies"), std::string::npos) << copies.output;
  auto float32 = run_program(estimate_command(amp)); // O1: float32 units under autocast
  ASSERT_TRUE(float32.succeeded()) << float32.output;
  EXPECT_EQ(float32.output.find("compute copies"), std::string::npos) << float32.output;
}

// The figure of the method-state line whose text contains `what`, in bytes.
double method_state_bytes(const std::string& output, const std::string& what) {
  std::istringstream lines(output);
  const std::regex line_form(R"(^ +([0-9.]+) (B|KiB|MiB|GiB)  (.*)$)");
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (std::regex_match(line, match, line_form) &&
        match[3].str().find(what) != std::string::npos) {
      return to_bytes(match[1], match[2]);
    }
  }
  ADD_FAILURE() << "no method-state line with " << what << " in:\n" << output;
  return 0.0;
}

// "model resnet: 28,355,392 parameters (...": the parameter count.
double parameter_count(const std::string& output) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex(R"(: ([0-9,]+) parameters \()"))) {
    ADD_FAILURE() << "no parameter count in:\n" << output;
    return 0.0;
  }
  std::string digits = match[1];
  digits.erase(std::remove(digits.begin(), digits.end(), ','), digits.end());
  return std::stod(digits);
}

// VISSL's MoCo, SwAV and DINO example configs (configs/examples) over a tiny image folder: beside
// the ZeRO table, the momentum encoder and the teacher are whole float32 copies of the trained
// model (4 bytes per parameter, plus ResNet-50's BatchNorm statistics: under 1 % of its
// parameters' bytes), MoCo's queue is K x d float32, and SwAV's its crops' rows.
TEST(EstimateCommandTest, CountsTheMethodsOwnStateBesideTheModelState) {
  TestDir dir;
  for (const std::string label : {"a", "b"}) {
    fs::create_directories(dir / "images" / label);
    data::testing::write_bytes(
        dir / "images" / label / "0.png",
        data::testing::encode_png(data::testing::pattern_image(64, 64, 1)));
  }
  const std::string images = "DATA.TRAIN.DATA_PATHS=[" + (dir / "images").string() + "]";
  const std::string examples = std::string(largo::test_paths::data_dir()) + "/../configs/examples/";
  const ProgramResult moco =
      run_program({largo_program(), "estimate", examples + "moco_resnet50_folder.yaml", images});
  ASSERT_TRUE(moco.succeeded()) << moco.status() << "\n" << moco.output;
  const double encoder = method_state_bytes(moco.output, "MoCo momentum encoder");
  const double parameter_bytes = 4.0 * parameter_count(moco.output);
  EXPECT_GE(encoder, parameter_bytes - 0.005 * 1024 * 1024) << moco.output;
  EXPECT_LE(encoder, 1.01 * parameter_bytes) << moco.output;
  EXPECT_EQ(
      method_state_bytes(moco.output, "MoCo queue (65536 keys x 128, float32)"), 65536.0 * 128 * 4);

  // SwAV's queue: 2 assigned crops x 3840 images (a multiple of the batch of 64) x (the
  // embedding's 128 + the 3000 prototypes' scores).
  const ProgramResult swav = run_program(
      {largo_program(),
       "estimate",
       examples + "swav_resnet50_folder.yaml",
       images,
       "LOSS.swav_loss.queue.queue_length=3840"});
  ASSERT_TRUE(swav.succeeded()) << swav.status() << "\n" << swav.output;
  EXPECT_NEAR(
      method_state_bytes(swav.output, "SwAV queue"),
      2.0 * 3840 * (128 + 3000) * 4,
      0.005 * 1024 * 1024)
      << swav.output;

  const ProgramResult dino =
      run_program({largo_program(), "estimate", examples + "dino_deits16_folder.yaml", images});
  ASSERT_TRUE(dino.succeeded()) << dino.status() << "\n" << dino.output;
  // The ViT has no buffers: the teacher is its parameters, to the rounding of the figure.
  EXPECT_NEAR(
      method_state_bytes(dino.output, "DINO teacher"),
      4.0 * parameter_count(dino.output),
      0.005 * 1024 * 1024)
      << dino.output;
}

TEST(EstimateCommandTest, MarksTheZeroStageOfTheConfig) {
  auto stage2 = run_program(estimate_command({"MODEL.SHARDED_DDP_SETUP.USE_SDP=True"}));
  ASSERT_TRUE(stage2.succeeded()) << stage2.output;
  EXPECT_NE(stage2.output.find("\n* 2 ZeRO-2"), std::string::npos) << stage2.output;
  auto plain = run_program(estimate_command({}));
  ASSERT_TRUE(plain.succeeded()) << plain.output;
  EXPECT_NE(plain.output.find("\n* 0 DDP"), std::string::npos) << plain.output;
}

// A linear evaluation trains its heads only: the small CNN's own head, Linear(576 -> 10) on
// 28x28 images, is what trains (5,770 parameters), its trunk counts as frozen, so the
// optimizer state is the head's alone.
TEST(EstimateCommandTest, ALinearEvaluationCountsItsFrozenTrunkAsFrozen) {
  auto plain = run_program(estimate_command({}));
  ASSERT_TRUE(plain.succeeded()) << plain.output;
  EXPECT_NE(plain.output.find("29,466 parameters (29,466 trained, 0 frozen)"), std::string::npos)
      << plain.output;
  auto linear = run_program(estimate_command({"MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=True",
                                              "MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY=True"}));
  ASSERT_TRUE(linear.succeeded()) << linear.output;
  EXPECT_NE(linear.output.find("29,466 parameters (5,770 trained, 23,696 frozen)"),
            std::string::npos)
      << linear.output;
  EXPECT_LT(stage_total_bytes(linear.output, 0), stage_total_bytes(plain.output, 0));
}

TEST(EstimateCommandTest, ABadFsdpKeyIsAClearError) {
  auto run = run_program(estimate_command(
      {"MODEL.FSDP_CONFIG.AUTO_SETUP_FSDP=True", "MODEL.FSDP_CONFIG.AUTO_WRAP_THRESHOLD=-1"}));
  EXPECT_FALSE(run.succeeded()) << run.output;
  EXPECT_NE(run.output.find("AUTO_WRAP_THRESHOLD"), std::string::npos) << run.output;
}

// The count with thousands separators that `pattern`'s group captures: "29,466" -> 29466.
int64_t printed_count(const std::string& output, const std::string& pattern) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex(pattern))) {
    ADD_FAILURE() << "no match for " << pattern << " in:\n" << output;
    return 0;
  }
  return std::stoll(std::regex_replace(match[1].str(), std::regex(","), ""));
}

// "model small_cnn: 29,466 parameters (...)" -> 29466.
int64_t model_parameter_count(const std::string& output) {
  return printed_count(output, "model [a-z_0-9]+: ([0-9,]+) parameters");
}

// One row of the pipeline table: "  <rank> <stages> <parameters> ... <in flight> <peak>",
// or "... - not measured" when activations were not measured (then in flight and peak 0).
struct PipelineRow {
  int rank = 0;
  int64_t parameters = 0;
  bool measured = false;
  int in_flight = 0;
  double peak_activation_bytes = 0.0;
};

std::vector<PipelineRow> pipeline_rows(const std::string& output) {
  const std::regex row("^  ([0-9]+) +([0-9,]+) +([0-9,]+) .* "
                       "(([0-9]+) +([0-9.]+) (B|KiB|MiB|GiB)|- +not measured)$");
  std::vector<PipelineRow> rows;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (!std::regex_match(line, match, row)) {
      continue;
    }
    PipelineRow parsed;
    parsed.rank = std::stoi(match[1]);
    parsed.parameters = std::stoll(std::regex_replace(match[3].str(), std::regex(","), ""));
    parsed.measured = match[5].matched;
    if (parsed.measured) {
      parsed.in_flight = std::stoi(match[5]);
      parsed.peak_activation_bytes = to_bytes(match[6], match[7]);
    }
    rows.push_back(parsed);
  }
  return rows;
}

constexpr int kPipelineSize = 2;
constexpr int kMicrobatches = 4;

std::vector<std::string> pipeline_estimate(const std::string& schedule) {
  return estimate_command({"DISTRIBUTED.PIPELINE_SIZE=" + std::to_string(kPipelineSize),
                           "MODEL.PIPELINE.SCHEDULE=" + schedule,
                           "MODEL.PIPELINE.NUM_MICROBATCHES=" + std::to_string(kMicrobatches)});
}

// With a pipeline the table is per pipeline rank, its stages' parameters covering the model
// once; gpipe keeps all M micro-batches in flight on rank 0, 1f1b only S (pipeline_schedule.h),
// so on the same cut 1f1b's peak is S / M of gpipe's.
TEST(EstimateCommandTest, APipelineReportsEachRanksStagesAndScheduleMemory) {
  auto gpipe = run_program(pipeline_estimate("gpipe"));
  ASSERT_TRUE(gpipe.succeeded()) << gpipe.status() << "\n" << gpipe.output;
  auto one_f_one_b = run_program(pipeline_estimate("1f1b"));
  ASSERT_TRUE(one_f_one_b.succeeded()) << one_f_one_b.status() << "\n" << one_f_one_b.output;
  EXPECT_EQ(gpipe.output.find("0 DDP"), std::string::npos) << "no ZeRO table:\n" << gpipe.output;

  const auto rows = pipeline_rows(gpipe.output);
  ASSERT_EQ(rows.size(), static_cast<size_t>(kPipelineSize)) << gpipe.output;
  int64_t parameters = 0;
  for (int rank = 0; rank < kPipelineSize; ++rank) {
    EXPECT_EQ(rows[static_cast<size_t>(rank)].rank, rank);
    EXPECT_GT(rows[static_cast<size_t>(rank)].parameters, 0) << "rank " << rank << " holds a stage";
    parameters += rows[static_cast<size_t>(rank)].parameters;
  }
  EXPECT_EQ(parameters, model_parameter_count(gpipe.output)) << gpipe.output;

  const auto one_f_one_b_rows = pipeline_rows(one_f_one_b.output);
  ASSERT_EQ(one_f_one_b_rows.size(), static_cast<size_t>(kPipelineSize)) << one_f_one_b.output;
  EXPECT_EQ(one_f_one_b_rows[0].parameters, rows[0].parameters) << "the same cut";
  EXPECT_EQ(rows[0].in_flight, kMicrobatches) << gpipe.output;
  EXPECT_EQ(one_f_one_b_rows[0].in_flight, kPipelineSize) << one_f_one_b.output;
  EXPECT_LT(one_f_one_b_rows[0].peak_activation_bytes, rows[0].peak_activation_bytes);
  EXPECT_NEAR(one_f_one_b_rows[0].peak_activation_bytes / rows[0].peak_activation_bytes,
              static_cast<double>(kPipelineSize) / kMicrobatches, 0.01)
      << gpipe.output << one_f_one_b.output;
}

// "... each rank holds 1,638,154 parameters ..." -> 1638154.
int64_t rank_parameter_count(const std::string& output) {
  return printed_count(output, "each rank holds ([0-9,]+) parameters");
}

// The example ViT's dimensions, set here so that the test derives its expectations from them.
constexpr int64_t kVitLayers = 4;
constexpr int64_t kVitHidden = 256;
constexpr int64_t kVitMlp = 1024;

std::vector<std::string> vit_estimate(int tensor_parallel_size, int num_processes) {
  return {
      largo_program(),
      "estimate",
      std::string(largo::test_paths::data_dir()) +
          "/../configs/examples/tensor_parallel_vit_synthetic.yaml",
      "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=" + std::to_string(kVitLayers),
      "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=" + std::to_string(kVitHidden),
      "MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=" + std::to_string(kVitMlp),
      "MODEL.TRUNK.VISION_TRANSFORMERS.QKV_BIAS=False",
      "DISTRIBUTED.TENSOR_PARALLEL_SIZE=" + std::to_string(tensor_parallel_size),
      "DISTRIBUTED.NUM_PROC_PER_NODE=" + std::to_string(num_processes)};
}

// At TP 2 each rank holds half of every encoder layer's split Linear parameters (qkv [3d, d]
// and fc1 [m, d] + [m] by rows, proj [d, d] and fc2 [d, m] by columns; proj's and fc2's
// biases replicated) and all the rest; DDP keeps float32 parameters and gradients (4 bytes
// per element) and AdamW's two moments (8, plus a 4-byte step per tensor) of them.
TEST(EstimateCommandTest, SizesATensorParallelRunByEachRanksShards) {
  auto unsplit = run_program(vit_estimate(1, 2));
  ASSERT_TRUE(unsplit.succeeded()) << unsplit.status() << "\n" << unsplit.output;
  auto split = run_program(vit_estimate(2, 2));
  ASSERT_TRUE(split.succeeded()) << split.status() << "\n" << split.output;
  const int64_t d = kVitHidden, m = kVitMlp;
  const int64_t split_numel = kVitLayers * (3 * d * d + d * d + m * d + m + d * m);
  const int64_t whole = model_parameter_count(unsplit.output);
  EXPECT_EQ(model_parameter_count(split.output), whole) << "the model line is the whole model's";
  const int64_t per_rank = whole - split_numel / 2;
  EXPECT_EQ(rank_parameter_count(split.output), per_rank) << split.output;
  EXPECT_NE(
      split.output.find("TENSOR_PARALLEL_SIZE 2 x 1 data-parallel replica;"), std::string::npos)
      << split.output;
  EXPECT_NE(split.output.find("\n* 0 DDP"), std::string::npos) << split.output;

  const double rounding = 0.01 * 1024 * 1024; // the printed figures' two decimals of MiB
  const auto ddp = stage_row_bytes(split.output, 0);
  EXPECT_NEAR(ddp[0], 4.0 * per_rank, rounding) << "parameters\n" << split.output;
  EXPECT_NEAR(ddp[1], 4.0 * per_rank, rounding) << "gradients\n" << split.output;
  EXPECT_NEAR(ddp[2], 8.0 * per_rank, rounding) << "optimizer state\n" << split.output;
  EXPECT_NEAR(stage_row_bytes(unsplit.output, 0)[0], 4.0 * whole, rounding) << unsplit.output;

  // TP 2 x DP 2: the ZeRO rows shard each rank's shards over its two replicas.
  auto two_replicas = run_program(vit_estimate(2, 4));
  ASSERT_TRUE(two_replicas.succeeded()) << two_replicas.output;
  EXPECT_NE(
      two_replicas.output.find("TENSOR_PARALLEL_SIZE 2 x 2 data-parallel replicas"),
      std::string::npos)
      << two_replicas.output;
  EXPECT_NEAR(stage_total_bytes(two_replicas.output, 3), 16.0 * per_rank / 2, 2 * rounding)
      << two_replicas.output;
}

// The tensor-parallel pipeline example (2 stages x 2 shards) with the dimensions above, cut
// by boundaries so that each stage holds half the encoder layers (the embedding before them,
// the final norm and the head after): blocks [0, 1 + L/2, L + 3).
std::vector<std::string> vit_pipeline_estimate(int tensor_parallel_size) {
  const int64_t num_blocks = kVitLayers + 3;
  return {
      largo_program(),
      "estimate",
      std::string(largo::test_paths::data_dir()) +
          "/../configs/examples/tensor_parallel_pipeline_vit_synthetic.yaml",
      "MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS=" + std::to_string(kVitLayers),
      "MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=" + std::to_string(kVitHidden),
      "MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=" + std::to_string(kVitMlp),
      "MODEL.TRUNK.VISION_TRANSFORMERS.QKV_BIAS=False",
      "MODEL.PIPELINE.BOUNDARIES=[0," + std::to_string(1 + kVitLayers / 2) + "," +
          std::to_string(num_blocks) + "]",
      "DISTRIBUTED.TENSOR_PARALLEL_SIZE=" + std::to_string(tensor_parallel_size),
      "DISTRIBUTED.NUM_PROC_PER_NODE=" + std::to_string(2 * tensor_parallel_size)};
}

// Each pipeline rank of TP 2 holds its stage's parameters less half of its L/2 encoder layers'
// split ones (the split parameters of the test above); its activations are not measured,
// and the report says why rather than printing the unsplit blocks'.
TEST(EstimateCommandTest, SizesATensorParallelPipelinePerRankByItsStagesShards) {
  auto unsplit = run_program(vit_pipeline_estimate(1));
  ASSERT_TRUE(unsplit.succeeded()) << unsplit.status() << "\n" << unsplit.output;
  auto split = run_program(vit_pipeline_estimate(2));
  ASSERT_TRUE(split.succeeded()) << split.status() << "\n" << split.output;
  const int64_t d = kVitHidden, m = kVitMlp;
  const int64_t split_per_layer = 3 * d * d + d * d + m * d + m + d * m;
  const int64_t halved_per_stage = (kVitLayers / 2) * split_per_layer / 2;

  const auto whole_rows = pipeline_rows(unsplit.output);
  const auto rows = pipeline_rows(split.output);
  ASSERT_EQ(whole_rows.size(), static_cast<size_t>(kPipelineSize)) << unsplit.output;
  ASSERT_EQ(rows.size(), static_cast<size_t>(kPipelineSize)) << split.output;
  for (size_t rank = 0; rank < rows.size(); ++rank) {
    EXPECT_EQ(rows[rank].parameters, whole_rows[rank].parameters - halved_per_stage)
        << "rank " << rank << "\n"
        << split.output;
    EXPECT_TRUE(whole_rows[rank].measured) << unsplit.output;
    EXPECT_FALSE(rows[rank].measured) << split.output;
  }
  EXPECT_NE(
      split.output.find("tensor parallel inside the stages: DISTRIBUTED."
                        "TENSOR_PARALLEL_SIZE 2"),
      std::string::npos)
      << split.output;
  EXPECT_NE(split.output.find("activations: not measured (tensor parallelism"), std::string::npos)
      << split.output;
}

} // namespace
} // namespace largo::testing::estimate_command_test
