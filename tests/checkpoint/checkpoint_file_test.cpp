// Checkpoint files: round trip, Python readability, and the error paths (missing,
// empty, truncated, foreign, mismatched model).
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/model_state.h>
#include <largo/core/error.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace largo::checkpoint::checkpoint_file_test {
namespace {

namespace fs = std::filesystem;

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
        fmt::format("largo_ckpt_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl(int64_t hidden) {
    fc = register_module("fc", torch::nn::Linear(4, hidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(TinyNet);

template <typename Fn>
std::string checkpoint_error(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return "";
}

TEST_F(CheckpointFileTest, RoundTripIsExact) {
  torch::manual_seed(1);
  TinyNet net(3);
  StateDict state = make_state_dict();
  state.insert("model", model_state_dict(*net));
  state.insert("iteration", int64_t{42});
  state.insert("note", std::string("hello"));
  save_checkpoint(dir_ / "a.torch", state);

  TinyNet other(3);
  StateDict loaded = load_checkpoint(dir_ / "a.torch", {"model", "iteration"});
  EXPECT_EQ(loaded.at("iteration").toInt(), 42);
  load_model_state_dict(*other, loaded.at("model").toGenericDict());
  EXPECT_TRUE(torch::equal(net->fc->weight, other->fc->weight));
  EXPECT_TRUE(torch::equal(net->bn->running_var, other->bn->running_var));
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(CheckpointFileTest, PythonTorchLoadReadsIt) {
  if (!fs::exists(LARGO_PYTHON)) {
    GTEST_SKIP() << "no Python with torch (LARGO_PYTHON)";
  }
  StateDict state = make_state_dict();
  StateDict model(c10::StringType::get(), c10::TensorType::get());
  model.insert("w", torch::arange(6, torch::kFloat).reshape({2, 3}));
  state.insert("model", model);
  state.insert("epoch", int64_t{3});
  save_checkpoint(dir_ / "p.torch", state);
  std::string command = fmt::format(
      LARGO_PYTHON " -c \"import torch; d = torch.load('{}'); "
                   "assert d['epoch'] == 3; assert d['model']['w'].sum().item() == 15.0\"",
      (dir_ / "p.torch").string());
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

TEST_F(CheckpointFileTest, MissingEmptyTruncatedForeignAreClearErrors) {
  auto message = checkpoint_error([&] { load_checkpoint(dir_ / "none.torch"); });
  EXPECT_NE(message.find("no such file"), std::string::npos) << message;

  std::ofstream(dir_ / "empty.torch").close();
  message = checkpoint_error([&] { load_checkpoint(dir_ / "empty.torch"); });
  EXPECT_NE(message.find("is empty"), std::string::npos) << message;

  StateDict state = make_state_dict();
  state.insert("model", torch::ones({100}));
  save_checkpoint(dir_ / "full.torch", state);
  auto size = fs::file_size(dir_ / "full.torch");
  fs::copy_file(dir_ / "full.torch", dir_ / "cut.torch");
  fs::resize_file(dir_ / "cut.torch", size / 2);
  message = checkpoint_error([&] { load_checkpoint(dir_ / "cut.torch"); });
  EXPECT_NE(message.find("cut.torch"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;

  std::ofstream(dir_ / "text.torch") << "this is not a checkpoint\n";
  message = checkpoint_error([&] { load_checkpoint(dir_ / "text.torch"); });
  EXPECT_NE(message.find("text.torch"), std::string::npos) << message;

  message = checkpoint_error([&] { load_checkpoint(dir_ / "full.torch", {"model", "iteration"}); });
  EXPECT_NE(message.find("not a Largo checkpoint"), std::string::npos) << message;
}

TEST_F(CheckpointFileTest, FailedSaveKeepsThePreviousFile) {
  StateDict state = make_state_dict();
  state.insert("iteration", int64_t{1});
  save_checkpoint(dir_ / "c.torch", state);
  // A destination whose directory cannot be created: the write fails, nothing changes.
  std::ofstream(dir_ / "blocker") << "x";
  EXPECT_THROW(save_checkpoint(dir_ / "blocker" / "c.torch", state), largo::Error);
  EXPECT_EQ(load_checkpoint(dir_ / "c.torch").at("iteration").toInt(), 1);
}

TEST_F(CheckpointFileTest, MismatchedModelNamesTheTensors) {
  TinyNet small(3);
  TinyNet large(5);
  StateDict state = model_state_dict(*small);
  auto message = checkpoint_error([&] { load_model_state_dict(*large, state); });
  EXPECT_NE(message.find("fc.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("does not match"), std::string::npos) << message;
  // Nothing was modified by the failed load.
  TinyNet fresh(5);
  state = model_state_dict(*large);
  ASSERT_EQ(state.erase("bn.running_mean"), 1u);
  message = checkpoint_error([&] { load_model_state_dict(*fresh, state); });
  EXPECT_NE(message.find("missing [bn.running_mean]"), std::string::npos) << message;
}

} // namespace
} // namespace largo::checkpoint::checkpoint_file_test
