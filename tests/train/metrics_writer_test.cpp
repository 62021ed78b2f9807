// Tests for MetricsWriter: one valid JSON object per line, flushed at once, appended
// across writer instances (a resumed run continues the same file).
#include "largo/train/metrics_writer.h"

#include "largo/core/error.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using largo::train::MetricsWriter;
using nlohmann::json;

namespace metrics_writer_test {
namespace {

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  return lines;
}

class MetricsWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           (std::string("largo_metrics_") + info->name() + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override {
    fs::remove_all(dir_);
  }
  fs::path dir_;
};


TEST_F(MetricsWriterTest, EachWriteIsOneJsonLineOnDiskAtOnce) {
  const fs::path path = dir_ / "run" / "metrics.jsonl"; // parent directory created
  MetricsWriter writer(path);
  EXPECT_EQ(writer.path(), path);
  const json train = {
      {"phase", "train"},
      {"epoch", 0},
      {"iteration", 10},
      {"loss", 0.5},
      {"lr", 0.1},
      {"images_per_sec", 812.25},
      {"wall_time", 1.7e9}};
  writer.write(train);
  // Read while the writer is still open: the line must already be in the file.
  std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(json::parse(lines[0]), train);

  // A string with a newline must not split the record.
  const json test = {
      {"phase", "test"}, {"epoch", 0}, {"top1", 91.5}, {"top5", 99.75}, {"note", "two\nlines"}};
  writer.write(test);
  lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(json::parse(lines[0]), train);
  EXPECT_EQ(json::parse(lines[1]), test);
}

TEST_F(MetricsWriterTest, AppendsAcrossWriters) {
  const fs::path path = dir_ / "metrics.jsonl";
  {
    MetricsWriter writer(path);
    writer.write({{"phase", "train"}, {"iteration", 1}});
    writer.write({{"phase", "train"}, {"iteration", 2}});
  }
  {
    MetricsWriter resumed(path); // a resumed run: must not truncate
    resumed.write({{"phase", "train"}, {"iteration", 3}});
  }
  const std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < lines.size(); ++i) {
    const json event = json::parse(lines[i]);
    ASSERT_TRUE(event.is_object()) << lines[i];
    EXPECT_EQ(event["iteration"], static_cast<int>(i) + 1);
  }
}

TEST_F(MetricsWriterTest, NonFiniteNumbersBecomeNull) {
  const fs::path path = dir_ / "metrics.jsonl";
  MetricsWriter writer(path);
  writer.write(
      {{"loss", std::numeric_limits<double>::quiet_NaN()},
       {"lr", std::numeric_limits<double>::infinity()}});
  const std::vector<std::string> lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  const json event = json::parse(lines[0]); // would throw on a bare NaN
  EXPECT_TRUE(event["loss"].is_null());
  EXPECT_TRUE(event["lr"].is_null());
}

TEST_F(MetricsWriterTest, RejectsNonObjectsAndUnwritablePaths) {
  MetricsWriter writer(dir_ / "metrics.jsonl");
  EXPECT_THROW(writer.write(json::array({1, 2})), largo::Error);
  EXPECT_THROW(writer.write(json(3.5)), largo::Error);
  EXPECT_TRUE(read_lines(dir_ / "metrics.jsonl").empty());

  // The path names a directory, which cannot be opened as a file.
  fs::create_directories(dir_ / "a_directory");
  EXPECT_THROW(MetricsWriter{dir_ / "a_directory"}, largo::Error);
}

} // namespace
} // namespace metrics_writer_test
