// A checkpoint written tensor by tensor reads back like one written by torch::pickle_save,
// in C++ and with Python's torch.load.
#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/streaming_checkpoint.h>
#include <largo/core/error.h>

#include <gtest/gtest.h>

#include <filesystem>

namespace largo::checkpoint::streaming_checkpoint_test {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("largo_streaming_" + name);
}

TEST(StreamingCheckpointTest, ReadsBackWithProducersCalledOnceInOrder) {
  const fs::path path = temp_path("roundtrip.torch");
  StreamingCheckpoint writer;
  std::vector<std::string> calls;
  auto state = make_state_dict();
  auto inner = make_state_dict();
  inner.insert("weight", writer.defer(at::kFloat, {3, 4}, [&] {
    calls.push_back("weight");
    return at::arange(12, at::kFloat).view({3, 4});
  }));
  inner.insert("steps", writer.defer(at::kLong, {}, [&] {
    calls.push_back("steps");
    return at::scalar_tensor(7, at::kLong);
  }));
  state.insert("model", inner);
  state.insert("plain", at::full({2}, 1.5, at::kDouble)); // an ordinary tensor alongside
  state.insert("epoch", int64_t{3});
  writer.save(path, state);
  EXPECT_EQ(calls, (std::vector<std::string>{"weight", "steps"}));

  auto loaded = load_checkpoint(path);
  auto model = loaded.at("model").toGenericDict();
  EXPECT_TRUE(model.at("weight").toTensor().equal(at::arange(12, at::kFloat).view({3, 4})));
  EXPECT_EQ(model.at("steps").toTensor().item<int64_t>(), 7);
  EXPECT_TRUE(loaded.at("plain").toTensor().equal(at::full({2}, 1.5, at::kDouble)));
  EXPECT_EQ(loaded.at("epoch").toInt(), 3);

  if (fs::exists(LARGO_PYTHON)) {
    const std::string command = fmt::format(
        LARGO_PYTHON
        " -c \"import torch; d = torch.load('{}'); "
        "assert d['model']['weight'].tolist() == torch.arange(12.).view(3, 4).tolist(); "
        "assert int(d['model']['steps']) == 7 and d['epoch'] == 3\"",
        path.string());
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
  }
  fs::remove(path);
}

TEST(StreamingCheckpointTest, AWrongProducedShapeFailsAndLeavesNoFile) {
  const fs::path path = temp_path("wrong.torch");
  fs::remove(path);
  StreamingCheckpoint writer;
  auto state = make_state_dict();
  state.insert("x", writer.defer(at::kFloat, {4}, [] { return at::zeros({5}); }));
  try {
    writer.save(path, state);
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("announced as Float [4]"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path));
}

} // namespace
} // namespace largo::checkpoint::streaming_checkpoint_test
