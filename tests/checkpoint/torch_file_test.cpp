// Reading what Python's torch.save writes: a module's state_dict, a dict of tensors of every
// dtype and of scalars, pickle protocol 4, a Largo checkpoint loaded and saved again in
// Python; and the files Largo refuses (pre-1.6 format, numpy scalars, TorchScript) with a
// message that names the file and the reason. The Python files come from
// tests/reference/gen_torch_save_files.py, run once for the suite.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/model_state.h>
#include <largo/checkpoint/torch_file.h>
#include <largo/core/error.h>

#include "checkpoint/checkpoint_test_util.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace largo::checkpoint::torch_file_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(TinyNet);

class TorchFileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("largo_torch_file_{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    save_checkpoint(dir_ / "largo.torch", largo_checkpoint());
    if (!fs::exists(LARGO_PYTHON)) {
      return;
    }
    const std::string command = fmt::format(
        LARGO_PYTHON " {}/reference/gen_torch_save_files.py {} {}",
        largo::test_paths::data_dir(),
        dir_.string(),
        (dir_ / "largo.torch").string());
    generated_ = std::system(command.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    fs::remove_all(dir_);
  }
  void SetUp() override {
    if (!fs::exists(LARGO_PYTHON)) {
      GTEST_SKIP() << "no Python with torch (LARGO_PYTHON) to write the torch.save files";
    }
    ASSERT_TRUE(generated_) << "tests/reference/gen_torch_save_files.py failed";
  }

  // What Largo's trainer writes, in miniature: typed dicts and lists, nested state.
  static StateDict largo_checkpoint() {
    torch::manual_seed(3);
    TinyNet net;
    StateDict state = make_state_dict();
    state.insert("model", model_state_dict(*net));
    StateDict sampler = make_state_dict();
    sampler.insert("epoch", int64_t{2});
    state.insert("train_sampler", sampler);
    state.insert("pieces", c10::List<int64_t>({4, 12}));
    state.insert("names", c10::List<std::string>({"trunk", "head"}));
    state.insert("rng_state", torch::randint(0, 255, {16}, torch::kUInt8));
    state.insert("top1", 91.5);
    state.insert("complete", true);
    state.insert("best_top1", c10::IValue());
    return state;
  }

  static json expected(const std::string& name) {
    std::ifstream in(dir_ / (name + ".json"));
    return json::parse(in);
  }

  static fs::path dir_;
  static bool generated_;
};

fs::path TorchFileTest::dir_;
bool TorchFileTest::generated_ = false;

at::ScalarType dtype_named(const std::string& name) {
  static const std::map<std::string, at::ScalarType> dtypes = {
      {"float32", at::kFloat},
      {"float64", at::kDouble},
      {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},
      {"int32", at::kInt},
      {"uint8", at::kByte},
      {"bool", at::kBool}};
  return dtypes.at(name);
}

// Compares a value read by Largo with Python's description of it (gen_torch_save_files.py).
void expect_matches(const c10::IValue& value, const json& want, const std::string& where) {
  if (want.contains("tensor")) {
    ASSERT_TRUE(value.isTensor()) << where;
    const at::Tensor tensor = value.toTensor();
    EXPECT_EQ(tensor.scalar_type(), dtype_named(want["dtype"])) << where;
    EXPECT_EQ(tensor.sizes().vec(), want["shape"].get<std::vector<int64_t>>()) << where;
    const at::Tensor flat = tensor.to(at::kDouble).contiguous().flatten();
    const auto values = want["values"].get<std::vector<double>>();
    ASSERT_EQ(flat.numel(), static_cast<int64_t>(values.size())) << where;
    for (size_t i = 0; i < values.size(); ++i) { // exact: every value is representable
      EXPECT_EQ(flat[static_cast<int64_t>(i)].item<double>(), values[i])
          << where << "[" << i << "]";
    }
  } else if (want.contains("dict")) {
    ASSERT_TRUE(value.isGenericDict()) << where;
    const auto dict = value.toGenericDict();
    EXPECT_EQ(dict.size(), want["dict"].size()) << where;
    for (const auto& [key, item] : want["dict"].items()) {
      ASSERT_TRUE(dict.contains(key)) << where << "." << key;
      expect_matches(dict.at(key), item, where + "." + key);
    }
  } else if (want.contains("list")) {
    ASSERT_TRUE(value.isList() || value.isTuple()) << where;
    const auto elements =
        value.isList() ? value.toListRef().vec() : value.toTupleRef().elements().vec();
    ASSERT_EQ(elements.size(), want["list"].size()) << where;
    for (size_t i = 0; i < elements.size(); ++i) {
      expect_matches(elements[i], want["list"][i], fmt::format("{}[{}]", where, i));
    }
  } else {
    const json& scalar = want["scalar"];
    if (scalar.is_null()) {
      EXPECT_TRUE(value.isNone()) << where;
    } else if (scalar.is_boolean()) {
      EXPECT_EQ(value.toBool(), scalar.get<bool>()) << where;
    } else if (scalar.is_number_integer()) {
      EXPECT_EQ(value.toInt(), scalar.get<int64_t>()) << where;
    } else if (scalar.is_number()) {
      EXPECT_EQ(value.toDouble(), scalar.get<double>()) << where;
    } else {
      EXPECT_EQ(value.toStringRef(), scalar.get<std::string>()) << where;
    }
  }
}

std::string refusal(const fs::path& path) {
  return largo::testing::checkpoint_error([&] { load_checkpoint(path); });
}

TEST_F(TorchFileTest, StateDictLoadsIntoTheModule) {
  const StateDict state = load_checkpoint(dir_ / "state_dict.pt");
  expect_matches(state, expected("state_dict"), "state_dict");
  TinyNet net;
  load_model_state_dict(*net, state);
  EXPECT_EQ(net->bn->num_batches_tracked.item<int64_t>(), 7);
  EXPECT_TRUE(torch::equal(net->bn->running_mean, torch::tensor({0.5f, -0.25f, 2.0f})));
}

TEST_F(TorchFileTest, EveryDtypeScalarAndContainerMatchesPython) {
  const StateDict state = load_checkpoint(dir_ / "mixed.pt");
  expect_matches(state, expected("mixed"), "mixed");
  // The view shares the storage of the tensor it was taken from, as in Python.
  EXPECT_EQ(
      state.at("view").toTensor().storage().data(),
      state.at("float32").toTensor().storage().data());
  // Untagged Python lists get the element type of their elements.
  EXPECT_EQ(state.at("milestones").toIntVector(), std::vector<int64_t>({30, 60, 90}));
}

TEST_F(TorchFileTest, PickleProtocolFourIsRead) {
  expect_matches(load_checkpoint(dir_ / "protocol4.pt"), expected("protocol4"), "protocol4");
}

TEST_F(TorchFileTest, LargoCheckpointSavedAgainByPythonReadsLikeTheOriginal) {
  const StateDict original = load_checkpoint(dir_ / "largo.torch");
  const StateDict resaved = load_checkpoint(dir_ / "resaved.torch", {"model", "pieces"});
  ASSERT_EQ(resaved.size(), original.size());
  for (const auto& entry : original) {
    const std::string& key = entry.key().toStringRef();
    const c10::IValue& again = resaved.at(key);
    if (entry.value().isGenericDict()) {
      ASSERT_TRUE(again.isGenericDict()) << key;
      for (const auto& inner : entry.value().toGenericDict()) {
        const c10::IValue& other = again.toGenericDict().at(inner.key());
        EXPECT_TRUE(
            inner.value().isTensor() ? torch::equal(inner.value().toTensor(), other.toTensor())
                                     : inner.value() == other)
            << key << "." << inner.key().toStringRef();
      }
    } else if (entry.value().isTensor()) {
      EXPECT_TRUE(torch::equal(entry.value().toTensor(), again.toTensor())) << key;
    } else {
      EXPECT_EQ(entry.value(), again) << key;
    }
  }
  // Code that reads Largo's typed lists reads the Python copy the same way.
  EXPECT_EQ(resaved.at("pieces").toIntVector(), std::vector<int64_t>({4, 12}));
  TinyNet net;
  load_model_state_dict(*net, resaved.at("model").toGenericDict());
}

TEST_F(TorchFileTest, UnreadableFilesAreRefusedWithTheReason) {
  std::string message = refusal(dir_ / "legacy.pt");
  EXPECT_NE(message.find("legacy.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("legacy format"), std::string::npos) << message;
  message = refusal(dir_ / "numpy_scalar.pt");
  EXPECT_NE(message.find("numpy_scalar.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("numpy"), std::string::npos) << message;
  message = refusal(dir_ / "script.pt");
  EXPECT_NE(message.find("script.pt"), std::string::npos) << message;
  EXPECT_NE(message.find("TorchScript"), std::string::npos) << message;
}

} // namespace
} // namespace largo::checkpoint::torch_file_test
