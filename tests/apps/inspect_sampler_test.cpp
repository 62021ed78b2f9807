// `largo inspect sampler` prints the indices PyTorch's DistributedSampler and VISSL's
// StatefulDistributedSampler yield, checked against the baselines that
// tests/reference/gen_sampler_baselines.py recorded in Python. Each program run costs about a
// second (loading libtorch), so only one recorded case per dataset size and world size is run,
// among those that pad, drop or run past the end, for its last rank (which sees the padding or
// the dropped tail); tests/data/sampler_test.cpp checks every case and rank through the
// library.
#include "apps/program_runner.h"
#include "test_paths.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

namespace largo::testing::inspect_sampler_test {
namespace {

const nlohmann::json& baselines() {
  static const nlohmann::json data = [] {
    const std::string path =
        std::string(largo::test_paths::data_dir()) + "/data/baselines/sampler_baselines.json";
    std::ifstream in(path);
    if (!in) {
      throw std::runtime_error("cannot open " + path +
                               "; run tests/reference/gen_sampler_baselines.py");
    }
    return nlohmann::json::parse(in);
  }();
  return data;
}

// The program's one line of output as numbers; fails the test unless it is exactly that.
std::vector<int64_t> printed_indices(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {largo_program(), "inspect", "sampler"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto run = run_program(argv);
  EXPECT_TRUE(run.succeeded()) << run.status() << "\n" << run.output;
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output.substr(0, 300);
  std::istringstream in(run.output);
  std::vector<int64_t> indices;
  int64_t value = 0;
  while (in >> value) {
    indices.push_back(value);
  }
  EXPECT_TRUE(in.eof()) << "not a list of integers: " << run.output.substr(0, 300);
  return indices;
}

// Compares with a baseline entry: the full list, or head, tail and checksum.
void expect_matches(const std::vector<int64_t>& actual, const nlohmann::json& expected,
                    const std::string& what) {
  ASSERT_EQ(actual.size(), expected.at("length").get<size_t>()) << what;
  if (expected.contains("values")) {
    EXPECT_EQ(actual, expected.at("values").get<std::vector<int64_t>>()) << what;
    return;
  }
  const auto head = expected.at("head").get<std::vector<int64_t>>();
  const auto tail = expected.at("tail").get<std::vector<int64_t>>();
  EXPECT_EQ(std::vector<int64_t>(actual.begin(), actual.begin() + head.size()), head) << what;
  EXPECT_EQ(std::vector<int64_t>(actual.end() - tail.size(), actual.end()), tail) << what;
  int64_t checksum = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    checksum += static_cast<int64_t>(i + 1) * actual[i];
  }
  EXPECT_EQ(checksum, expected.at("checksum").get<int64_t>()) << what;
}

// Whether a recorded case is one the program is run for (see the top); `seen` holds the
// (dataset size, world size) pairs already run.
bool worth_a_run(const nlohmann::json& entry, std::set<std::pair<int64_t, int64_t>>& seen) {
  const auto size = entry.at("dataset_size").get<int64_t>();
  const auto replicas = entry.at("num_replicas").get<int64_t>();
  const bool past_the_end = entry.contains("start_iter") &&
      entry.at("start_iter").get<int64_t>() * entry.at("batch_size").get<int64_t>() >=
          entry.at("num_samples").get<int64_t>() && entry.at("num_samples").get<int64_t>() > 0;
  return entry.at("rank").get<int64_t>() == replicas - 1 &&
      (size % replicas != 0 || past_the_end) && seen.insert({size, replicas}).second;
}

std::string text(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

TEST(InspectSamplerTest, PrintsPyTorchsDistributedSamplerOrder) {
  int checked = 0;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const auto& entry : baselines().at("distributed_sampler")) {
    if (!worth_a_run(entry, seen)) {
      continue;
    }
    std::vector<std::string> flags = {
        "--size", text(entry.at("dataset_size")), "--world_size", text(entry.at("num_replicas")),
        "--rank", text(entry.at("rank")), "--epoch", text(entry.at("epoch")),
        "--seed", text(entry.at("seed")), "--shuffle", entry.at("shuffle").get<bool>() ? "1" : "0"};
    if (entry.at("drop_last").get<bool>()) {
      flags.push_back("--drop_last");
    }
    expect_matches(printed_indices(flags), entry, fmt::format("{}", fmt::join(flags, " ")));
    ++checked;
  }
  EXPECT_GE(checked, 4); // sizes 10, 11, 3 and 60001, not divisible by the world size
}

TEST(InspectSamplerTest, PrintsVisslsStatefulSamplerOrderWithStartIter) {
  int checked = 0;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const auto& entry : baselines().at("stateful_distributed_sampler")) {
    if (!worth_a_run(entry, seen)) {
      continue;
    }
    std::vector<std::string> flags = {
        "--stateful", "--size", text(entry.at("dataset_size")),
        "--world_size", text(entry.at("num_replicas")), "--rank", text(entry.at("rank")),
        "--epoch", text(entry.at("epoch")), "--seed", text(entry.at("seed")),
        "--batch_size", text(entry.at("batch_size")), "--start_iter", text(entry.at("start_iter"))};
    expect_matches(printed_indices(flags), entry, fmt::format("{}", fmt::join(flags, " ")));
    ++checked;
  }
  EXPECT_GE(checked, 6); // sizes 10, 11, 3, 1003, 60001; 10 on 2 ranks resumed past the end
}

TEST(InspectSamplerTest, BadArgumentsGiveClearErrors) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--world_size", "2"}, "--size is required"},
      {{"--size", "10", "--world_size", "2", "--rank", "2"}, "--rank = 2 with --world_size = 2"},
      {{"--size", "10", "--stateful", "--shuffle", "0"}, "always shuffles"},
      {{"--size", "10", "--start_iter", "1"}, "--batch_size and --start_iter belong to --stateful"},
      {{"--size", "10", "--stateful", "--start_iter", "1"}, "give --batch_size too"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {largo_program(), "inspect", "sampler"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    auto run = run_program(argv);
    EXPECT_TRUE(run.exited_with(2)) << run.status() << "\n" << run.output;
    EXPECT_NE(run.output.find(c.message), std::string::npos)
        << "expected '" << c.message << "' in:\n" << run.output;
  }
}

} // namespace
} // namespace largo::testing::inspect_sampler_test
