// MODEL.WEIGHTS_INIT: a model initialized from a torchvision state dict saved with
// torch.save, from VISSL's checkpoint layout and from a Largo checkpoint computes what the
// source model computes; mismatches are listed in one error.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/model_state.h>
#include <largo/checkpoint/torch_file.h>
#include <largo/checkpoint/weights_init.h>
#include <largo/core/error.h>
#include <largo/models/model_factory.h>
#include <largo/models/vissl_names.h>

#include "data/temp_dir.h"
#include "test_paths.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

namespace largo::checkpoint::weights_init_test {
namespace {

namespace fs = std::filesystem;
using largo::data::testing::TempDir;

models::ModelOptions torchvision_like_resnet_options(int64_t depth, int64_t num_classes) {
  models::ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = depth;
  options.resnet.stem = "imagenet";
  options.num_classes = num_classes;
  options.image_size = 32;
  return options;
}

models::TrunkHeadModel torchvision_like_resnet(int64_t depth, int64_t num_classes) {
  return models::build_model(torchvision_like_resnet_options(depth, num_classes));
}

std::function<std::string(const std::string&)> resnet_names(int64_t depth) {
  return [depth](const std::string& name) {
    return models::resnet_name_from_torchvision(name, depth);
  };
}

// Every torchvision ResNet-18/50 state_dict name maps to a Largo tensor of the same shape,
// and every Largo tensor is the image of exactly one of them.
TEST(WeightsInitTest, TorchvisionResNetNamesMapOntoLargosOneToOne) {
  std::ifstream file(
      std::string(largo::test_paths::data_dir()) +
      "/checkpoint/baselines/torchvision_resnet_names.json");
  ASSERT_TRUE(file.good()) << "run tests/reference/gen_weights_init_files.py";
  const auto names = nlohmann::json::parse(file)["names"];
  for (int64_t depth : {18, 50}) {
    SCOPED_TRACE(depth);
    models::TrunkHeadModel model = torchvision_like_resnet(depth, 1000);
    std::map<std::string, at::Tensor> largo;
    for (const auto& item : model->named_parameters()) {
      largo.emplace(item.key(), item.value());
    }
    for (const auto& item : model->named_buffers()) {
      largo.emplace(item.key(), item.value());
    }
    std::set<std::string> mapped;
    for (const auto& entry : names[fmt::format("resnet{}", depth)]) {
      const std::string torchvision = entry[0];
      const std::string name = models::resnet_name_from_torchvision(torchvision, depth);
      ASSERT_EQ(largo.count(name), 1u) << torchvision << " -> " << name;
      EXPECT_EQ(largo.at(name).sizes().vec(), entry[1].get<std::vector<int64_t>>()) << name;
      EXPECT_TRUE(mapped.insert(name).second) << name << " twice";
      // VISSL's trunk prefix maps to the same name.
      if (torchvision.rfind("fc.", 0) != 0) {
        EXPECT_EQ(
            models::resnet_name_from_torchvision("trunk._feature_blocks." + torchvision, depth),
            name);
      }
    }
    EXPECT_EQ(mapped.size(), largo.size());
  }
}

struct ReferenceFiles {
  fs::path torchvision;
  fs::path vissl;
  at::Tensor images;
  at::Tensor logits;
};

// torchvision's ResNet-18 written by Python (tests/reference/gen_weights_init_files.py).
std::optional<ReferenceFiles> write_reference_files(const fs::path& dir) {
  if (!fs::exists(LARGO_PYTHON)) {
    return std::nullopt;
  }
  const std::string command = fmt::format(
      LARGO_PYTHON " {}/reference/gen_weights_init_files.py --files {}",
      largo::test_paths::data_dir(),
      dir.string());
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream file(dir / "reference.json");
  const auto reference = nlohmann::json::parse(file);
  ReferenceFiles files{dir / "torchvision_resnet18.pth", dir / "vissl_resnet18.torch", {}, {}};
  files.images =
      torch::tensor(reference["images"].get<std::vector<float>>()).reshape({2, 3, 32, 32});
  files.logits = torch::tensor(reference["logits"].get<std::vector<float>>()).reshape({2, 10});
  return files;
}

// The same float32 network on the same input through the same oneDNN kernels: the logits
// agree to float32 rounding of ~20 layers of sums of up to 4608 products, far below 1e-4 of
// their magnitude.
void expect_reference_logits(models::TrunkHeadModel& model, const ReferenceFiles& files) {
  model->eval();
  torch::NoGradGuard no_grad;
  at::Tensor logits = model->forward(files.images);
  const double scale = files.logits.abs().max().item<double>();
  EXPECT_LE((logits - files.logits).abs().max().item<double>(), 1e-4 * scale);
}

TEST(WeightsInitTest, TorchvisionStateDictAndVisslCheckpointGiveTorchvisionsLogits) {
  TempDir dir;
  auto files = write_reference_files(dir.path());
  if (!files) {
    GTEST_SKIP() << "no Python with torch (LARGO_PYTHON)";
  }
  {
    torch::manual_seed(5);
    models::TrunkHeadModel model = torchvision_like_resnet(18, 10);
    WeightsInitOptions options;
    options.params_file = files->torchvision;
    options.state_dict_key_name = {}; // the file is the state dict
    options.rename = resnet_names(18);
    WeightsInitReport report = init_weights_from_file(*model, options);
    EXPECT_EQ(report.source, "state dict");
    EXPECT_EQ(report.num_loaded, 122 - 20); // every tensor but the 20 num_batches_tracked
    EXPECT_EQ(report.skipped.size(), 20u);  // SKIP_LAYERS' default: num_batches_tracked
    expect_reference_logits(model, *files);
  }
  {
    torch::manual_seed(6);
    models::TrunkHeadModel model = torchvision_like_resnet(18, 10);
    WeightsInitOptions options;
    options.params_file = files->vissl; // STATE_DICT_KEY_NAME: classy_state_dict (default)
    options.rename = models::weights_name_mapping(torchvision_like_resnet_options(18, 10));
    WeightsInitReport report = init_weights_from_file(*model, options);
    EXPECT_EQ(report.source, "VISSL checkpoint");
    expect_reference_logits(model, *files);
  }
}

// A RegNetY (MODEL.TRUNK.REGNET {depth: 6, w_0: 8, w_a: 8, w_m: 2, group_width: 4,
// stem_width: 8}) initialized from torchvision's state dict of the same network
// (tests/reference/gen_regnet_baselines.py: random weights and BatchNorm statistics, checked
// in, ~170 KB) computes torchvision's eval-mode logits on the same two 64x64 images.
TEST(WeightsInitTest, TorchvisionRegNetStateDictGivesTorchvisionsLogits) {
  const fs::path dir = fs::path(largo::test_paths::data_dir()) / "checkpoint" / "baselines";
  models::ModelOptions options;
  options.trunk_name = "regnet";
  options.regnet.depth = 6;
  options.regnet.w_0 = 8;
  options.regnet.w_a = 8;
  options.regnet.w_m = 2;
  options.regnet.group_width = 4;
  options.regnet.stem_width = 8;
  options.num_classes = 10;
  options.image_size = 64;
  torch::manual_seed(3);
  models::TrunkHeadModel model = models::build_model(options);
  WeightsInitOptions init;
  init.params_file = dir / "torchvision_regnet_small.pth";
  init.state_dict_key_name = {};
  init.rename = [&](const std::string& name) {
    return models::regnet_name_from_torchvision(name, options.regnet);
  };
  const WeightsInitReport report = init_weights_from_file(*model, init);
  // 23 BatchNorms (stem, 4 projections, a / b / c of 6 blocks) of 4 tensors, their 23 convs,
  // 6 SE layers' 4 tensors, the head's 2; the 23 num_batches_tracked are skipped.
  EXPECT_EQ(report.skipped.size(), 23u);
  EXPECT_EQ(report.num_loaded, 4 * 23 + 23 + 6 * 4 + 2);

  const auto reference =
      read_torch_file(dir / "torchvision_regnet_small_reference.pth").toGenericDict();
  const at::Tensor images = reference.at("images").toTensor();
  const at::Tensor expected64 = reference.at("logits_float64").toTensor();
  const at::Tensor expected32 = reference.at("logits_float32").toTensor();
  ASSERT_EQ(images.sizes().vec(), (std::vector<int64_t>{2, 3, 64, 64}));
  model->eval();
  torch::NoGradGuard no_grad;
  const double scale = expected64.abs().max().item<double>();
  auto max_error = [](const at::Tensor& a, const at::Tensor& b) {
    return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
  };
  // float32: each layer's sums (at most 8 * 9 = 72 products in a grouped 3x3 conv, 64 in a
  // 1x1) round at 6e-8 relative; through 20 layers the logits agree to ~1e-6 of their scale
  // in practice, and 1e-4 of it bounds the worst case (as the ResNet parity tests).
  const at::Tensor logits32 = model->forward(images);
  const double error32 = max_error(logits32, expected32);
  EXPECT_LE(error32, 1e-4 * scale);
  EXPECT_LE(max_error(logits32, expected64), 1e-4 * scale);
  // float64: the same network with unit roundoff 1.1e-16; ~20 layers of sums of <= 72
  // products differ only in summation order, far below 1e-10 of the logits' scale.
  model->to(torch::kFloat64);
  const at::Tensor logits64 = model->forward(images.to(torch::kFloat64));
  ASSERT_EQ(logits64.sizes().vec(), (std::vector<int64_t>{2, 10}));
  const double error64 = max_error(logits64, expected64);
  EXPECT_LE(error64, 1e-10 * scale);
  RecordProperty("max_abs_error_float32", std::to_string(error32));
  RecordProperty("max_abs_error_float64", std::to_string(error64));
  std::printf(
      "RegNet vs torchvision: logit scale %.4g, max abs error float32 %.3g (rel %.3g), "
      "float64 %.3g (rel %.3g)\n",
      scale,
      error32,
      error32 / scale,
      error64,
      error64 / scale);
}

TEST(WeightsInitTest, LargoCheckpointsInitializeFromTheirModelEntry) {
  TempDir dir;
  torch::manual_seed(1);
  models::TrunkHeadModel trained = torchvision_like_resnet(18, 10);
  StateDict checkpoint = make_state_dict();
  checkpoint.insert("model", model_state_dict(*trained));
  checkpoint.insert("largo_version", std::string("test"));
  save_checkpoint(dir.path() / "checkpoint.torch", checkpoint);

  torch::manual_seed(2);
  models::TrunkHeadModel model = torchvision_like_resnet(18, 10);
  WeightsInitOptions options;
  options.params_file = dir.path() / "checkpoint.torch";
  options.skip_layers = {};
  EXPECT_EQ(init_weights_from_file(*model, options).source, "Largo checkpoint");
  for (const auto& item : trained->named_parameters()) {
    EXPECT_TRUE(item.value().equal(model->named_parameters()[item.key()])) << item.key();
  }
}

StateDict state_of(const torch::nn::Module& model, const std::string& prefix = "") {
  StateDict state = make_state_dict();
  for (const auto& item : model_state_dict(model)) {
    state.insert(prefix + item.key().toStringRef(), item.value());
  }
  return state;
}

TEST(WeightsInitTest, MismatchesAreListedInOneErrorNamingTheFileAndNothingLoads) {
  torch::manual_seed(0);
  models::TrunkHeadModel source = torchvision_like_resnet(18, 10);
  StateDict state = state_of(*source);
  ASSERT_EQ(state.erase("trunk.1.conv1.weight"), 1u);
  state.insert("trunk.9.extra", at::zeros({2}));
  state.insert_or_assign("head.0.weight", at::zeros({3, 512}));

  torch::manual_seed(1);
  models::TrunkHeadModel model = torchvision_like_resnet(18, 10);
  const at::Tensor before = model->named_parameters()["trunk.0.conv1.weight"].clone();
  WeightsInitOptions options;
  options.state_dict_key_name = {};
  try {
    init_weights(*model, state, options, "/data/w.pth");
    FAIL() << "expected a CheckpointError";
  } catch (const CheckpointError& error) {
    const std::string message = error.what();
    for (const char* part :
         {"/data/w.pth",
          "missing from the file (1): trunk.1.conv1.weight",
          "not in the model (1): trunk.9.extra",
          "head.0.weight (file [3, 512], model [10, 512])"}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " in: " << message;
    }
  }
  EXPECT_TRUE(model->named_parameters()["trunk.0.conv1.weight"].equal(before));
}

TEST(WeightsInitTest, PrefixesSkippedLayersAndFrozenHeads) {
  torch::manual_seed(0);
  models::TrunkHeadModel source = torchvision_like_resnet(18, 10);
  torch::manual_seed(1);
  models::TrunkHeadModel model = torchvision_like_resnet(18, 10);
  auto parameter = [&](const std::string& name) { return model->named_parameters()[name].clone(); };
  const at::Tensor head_before = parameter("head.0.weight");
  const at::Tensor block_before = parameter("trunk.1.conv1.weight");

  // A DataParallel-style "module." prefix removed, then "trunk." put back on trunk-relative
  // names; the head is not initialized (linear evaluation) and the file's head is ignored;
  // SKIP_LAYERS keeps block 1 as built.
  StateDict state = make_state_dict();
  for (const auto& item : model_state_dict(*source)) {
    const std::string name = item.key().toStringRef();
    const std::string relative = name.rfind("trunk.", 0) == 0 ? name.substr(6) : "x." + name;
    state.insert("module." + relative, item.value());
  }
  WeightsInitOptions options;
  options.state_dict_key_name = {};
  options.remove_prefix = "module.";
  options.append_prefix = "trunk.";
  options.skip_layers = {"num_batches_tracked", "trunk.1.", "trunk.x.head."};
  options.init_heads = false;
  WeightsInitReport report = init_weights(*model, state, options, "w.pth");
  EXPECT_TRUE(parameter("head.0.weight").equal(head_before));
  EXPECT_TRUE(parameter("trunk.1.conv1.weight").equal(block_before));
  EXPECT_TRUE(
      parameter("trunk.3.conv2.weight").equal(source->named_parameters()["trunk.3.conv2.weight"]));
  EXPECT_NE(
      std::find(report.skipped.begin(), report.skipped.end(), "head.0.weight"),
      report.skipped.end());
  // The log line names the head and counts BatchNorm's counters (one per BatchNorm layer of
  // the ResNet-18: 20) instead of listing them.
  const std::string line = report.describe("w.pth");
  EXPECT_NE(line.find("kept as built: "), std::string::npos) << line;
  EXPECT_NE(line.find("head.0.weight"), std::string::npos) << line;
  EXPECT_NE(line.find("20 num_batches_tracked buffers"), std::string::npos) << line;
  EXPECT_EQ(line.find("bn1.num_batches_tracked"), std::string::npos) << line;
  // Without the skip the file's head entries ("trunk.x.head.0.weight") are reported.
  options.skip_layers = {"num_batches_tracked", "trunk.1."};
  EXPECT_THROW(init_weights(*model, state, options, "w.pth"), CheckpointError);
}

// MODEL.FEATURE_EVAL_SETTINGS.ASSERT_HEAD_LAYER_SHAPE_INIT: a head of another shape in the
// file (another number of classes) is an error, or, when not asserted, keeps its own init
// while the trunk loads.
TEST(WeightsInitTest, AHeadOfAnotherShapeKeepsItsInitUnlessShapesAreAsserted) {
  torch::manual_seed(0);
  models::TrunkHeadModel source = torchvision_like_resnet(18, 10);
  torch::manual_seed(1);
  models::TrunkHeadModel model = torchvision_like_resnet(18, 5);
  auto parameter = [&](const std::string& name) { return model->named_parameters()[name].clone(); };
  const at::Tensor head_before = parameter("head.0.weight");
  StateDict state = make_state_dict();
  for (const auto& item : model_state_dict(*source)) {
    state.insert(item.key(), item.value());
  }
  WeightsInitOptions options;
  options.state_dict_key_name = {};
  EXPECT_THROW(init_weights(*model, state, options, "w.pth"), CheckpointError);
  options.check_head_shapes = false;
  const WeightsInitReport report = init_weights(*model, state, options, "w.pth");
  EXPECT_TRUE(parameter("head.0.weight").equal(head_before));
  EXPECT_TRUE(
      parameter("trunk.3.conv2.weight").equal(source->named_parameters()["trunk.3.conv2.weight"]));
  EXPECT_NE(
      std::find(report.skipped.begin(), report.skipped.end(), "head.0.weight"),
      report.skipped.end());
}

TEST(WeightsInitTest, AMissingKeyNamesTheKeysTheFileHas) {
  StateDict state = make_state_dict();
  state.insert("state_dict", make_state_dict());
  models::TrunkHeadModel model = torchvision_like_resnet(18, 10);
  WeightsInitOptions options; // classy_state_dict
  try {
    init_weights(*model, state, options, "w.pth");
    FAIL() << "expected a CheckpointError";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find("no key 'classy_state_dict'"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("[state_dict]"), std::string::npos) << error.what();
  }
}

} // namespace
} // namespace largo::checkpoint::weights_init_test
