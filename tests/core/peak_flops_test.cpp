// peak_flops measures a CPU's matrix-multiply rate once and then reads it from its cache; a
// cache that is not JSON is measured over and rewritten, one that cannot be written is left.
#include <largo/core/peak_flops.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

namespace largo::peak_flops_test {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("largo_peak_flops_" + name);
  fs::remove_all(dir);
  return dir;
}

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file);
  return nlohmann::json::parse(in);
}

TEST(PeakFlops, IsMeasuredOnceThenReadFromTheCache) {
  const fs::path cache = fresh_dir("once") / "nested" / "peak_flops.json";
  const PeakFlops measured = peak_flops(at::kCPU, at::kFloat, 1, cache);
  EXPECT_FALSE(measured.cached);
  EXPECT_GT(measured.flops_per_sec, 0.0);
  EXPECT_EQ(measured.key, peak_flops_key(at::kCPU, at::kFloat, 1));
  EXPECT_NE(measured.key.find("Float"), std::string::npos) << measured.key;
  EXPECT_NE(
      measured.key.find(std::to_string(at::get_num_threads()) + " threads x 1 rank(s)"),
      std::string::npos)
      << measured.key;
  EXPECT_EQ(read_json(cache).at(measured.key).get<double>(), measured.flops_per_sec);

  const PeakFlops again = peak_flops(at::kCPU, at::kFloat, 1, cache);
  EXPECT_TRUE(again.cached);
  EXPECT_EQ(again.flops_per_sec, measured.flops_per_sec);
  // Another dtype or another count of ranks sharing the machine is another peak.
  EXPECT_FALSE(peak_flops(at::kCPU, at::kBFloat16, 1, cache).cached);
  EXPECT_FALSE(peak_flops(at::kCPU, at::kFloat, 2, cache).cached);
  EXPECT_EQ(read_json(cache).size(), 3u);
  fs::remove_all(cache.parent_path().parent_path());
}

// A run measures after seeding its generators: whether it measures or reads the cache must
// not change what it draws next (a restarted run read the cache its first attempt wrote, and
// its dropout masks differed from the uninterrupted run's).
TEST(PeakFlops, MeasuringDrawsNothingFromTheGlobalGenerator) {
  const fs::path cache = fresh_dir("draws") / "peak_flops.json";
  torch::manual_seed(11);
  const at::Tensor expected = torch::rand({4});
  torch::manual_seed(11);
  ASSERT_FALSE(peak_flops(at::kCPU, at::kFloat, 1, cache).cached);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
  fs::remove_all(cache.parent_path());
}

TEST(PeakFlops, AValueInTheCacheIsWhatARunReads) {
  const fs::path dir = fresh_dir("value");
  fs::create_directories(dir);
  const fs::path cache = dir / "peak_flops.json";
  std::ofstream(cache) << nlohmann::json{{peak_flops_key(at::kCPU, at::kFloat, 1), 1.5e9}}.dump();
  const PeakFlops peak = peak_flops(at::kCPU, at::kFloat, 1, cache);
  EXPECT_TRUE(peak.cached);
  EXPECT_EQ(peak.flops_per_sec, 1.5e9);
  fs::remove_all(dir);
}

TEST(PeakFlops, AnUnreadableCacheIsMeasuredOverAndAnUnwritableOneLeft) {
  const fs::path dir = fresh_dir("unreadable");
  fs::create_directories(dir);
  const fs::path cache = dir / "peak_flops.json";
  std::ofstream(cache) << "{\"torn\": ";
  const PeakFlops peak = peak_flops(at::kCPU, at::kFloat, 1, cache);
  EXPECT_FALSE(peak.cached);
  EXPECT_EQ(read_json(cache).at(peak.key).get<double>(), peak.flops_per_sec); // rewritten

  const fs::path directory_in_the_way = dir / "a_directory.json";
  fs::create_directories(directory_in_the_way);
  const PeakFlops unwritten = peak_flops(at::kCPU, at::kFloat, 1, directory_in_the_way);
  EXPECT_GT(unwritten.flops_per_sec, 0.0);
  EXPECT_TRUE(fs::is_directory(directory_in_the_way));
  fs::remove_all(dir);
}

TEST(PeakFlops, TheCacheFileFollowsTheEnvironment) {
  const char* saved = std::getenv("LARGO_CACHE_DIR");
  const std::string restore = saved != nullptr ? saved : "";
  setenv("LARGO_CACHE_DIR", "/some/where", 1);
  EXPECT_EQ(default_peak_flops_cache(), fs::path("/some/where/peak_flops.json"));
  unsetenv("LARGO_CACHE_DIR");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if ((xdg == nullptr || *xdg == '\0') && home != nullptr && *home != '\0') {
    EXPECT_EQ(default_peak_flops_cache(), fs::path(home) / ".cache" / "largo" / "peak_flops.json");
  }
  if (saved != nullptr) {
    setenv("LARGO_CACHE_DIR", restore.c_str(), 1);
  }
}

} // namespace
} // namespace largo::peak_flops_test
