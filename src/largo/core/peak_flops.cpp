#include <largo/core/peak_flops.h>

#include <largo/core/atomic_file.h>
#include <largo/core/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <vector>

namespace largo {
namespace {

namespace fs = std::filesystem;

// The value of the first "<field>: value" line of a /proc text file, or "".
std::string proc_field(const fs::path& file, const std::string& field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) {
      continue;
    }
    std::string name = line.substr(0, colon);
    name.erase(name.find_last_not_of(" \t") + 1);
    if (name == field) {
      const size_t begin = line.find_first_not_of(" \t", colon + 1);
      return begin == std::string::npos ? "" : line.substr(begin);
    }
  }
  return "";
}

// The CPU's model name, or the CUDA device's (the NVIDIA driver's /proc entries, one per
// GPU, in bus order as CUDA numbers them by default), else the device's index.
std::string device_name(c10::Device device) {
  if (device.is_cpu()) {
    const std::string model = proc_field("/proc/cpuinfo", "model name");
    return "cpu " + (model.empty() ? std::string("(model unknown)") : model);
  }
  std::vector<fs::path> gpus;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator("/proc/driver/nvidia/gpus", error)) {
    gpus.push_back(entry.path() / "information");
  }
  std::sort(gpus.begin(), gpus.end());
  const size_t index = device.has_index() ? static_cast<size_t>(device.index()) : 0;
  const std::string model = index < gpus.size() ? proc_field(gpus[index], "Model") : "";
  return fmt::format("cuda:{} {}", index, model.empty() ? "(model unknown)" : model);
}

// Best FLOP/s of square products n x n x n in `dtype`: on a CUDA device 4096 and 8192 (10
// calls between synchronisations); on a CPU from 128 up, doubling until one call takes 20 ms
// or n reaches 2048, the best of 3 calls at each size.
double measure_peak(c10::Device device, at::ScalarType dtype) {
  const bool cuda = device.is_cuda();
  const int calls_per_timing = cuda ? 10 : 1; // a GPU queues them: timed together
  double best = 0.0;
  for (int64_t n = cuda ? 4096 : 128; n <= (cuda ? 8192 : 2048); n *= 2) {
    const auto options = at::TensorOptions(dtype).device(device);
    // Values in [0, 1) without drawing: a run measures after it seeded its generators, and
    // whether it measures (or reads the cache) must not change what it draws next.
    const at::Tensor values =
        at::arange(n * n, options.dtype(at::kFloat)).remainder(13).div(13).view({n, n});
    const at::Tensor left = values.to(dtype);
    const at::Tensor right = values.t().contiguous().to(dtype);
    at::Tensor product = at::empty({n, n}, options);
    at::mm_out(product, left, right); // warm-up: the library's kernels picked and loaded
    double seconds = 1e30;            // of one call, the best of 3 timings
    for (int timing = 0; timing < 3; ++timing) {
      if (cuda) {
        torch::cuda::synchronize(device.index());
      }
      const auto start = std::chrono::steady_clock::now();
      for (int call = 0; call < calls_per_timing; ++call) {
        at::mm_out(product, left, right);
      }
      if (cuda) {
        torch::cuda::synchronize(device.index());
      }
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
      seconds = std::min(seconds, elapsed.count() / calls_per_timing);
    }
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / seconds);
    if (!cuda && seconds >= 0.02) {
      break;
    }
  }
  return best;
}

nlohmann::json read_cache(const fs::path& file) {
  std::ifstream in(file);
  if (!in) {
    return nlohmann::json::object(); // none yet
  }
  try {
    nlohmann::json cache = nlohmann::json::parse(in);
    if (cache.is_object()) {
      return cache;
    }
  } catch (const std::exception&) { // not JSON, or not a readable file (a directory)
  }
  spdlog::warn(
      "peak FLOP/s cache {} is not a JSON object of peaks; measuring again and "
      "rewriting it",
      file.string());
  return nlohmann::json::object();
}

} // namespace

PeakFlops peak_flops(
    c10::Device device, at::ScalarType dtype, int ranks_on_machine, const fs::path& cache_file) {
  if (!device.is_cpu() && !device.is_cuda()) {
    throw Error(
        fmt::format("peak_flops: measured on a CPU or a CUDA device, not {}", device.str()));
  }
  PeakFlops peak;
  peak.key = peak_flops_key(device, dtype, ranks_on_machine);
  nlohmann::json cache = read_cache(cache_file);
  if (cache.contains(peak.key) && cache.at(peak.key).is_number()) {
    peak.flops_per_sec = cache.at(peak.key).get<double>();
    peak.cached = true;
    return peak;
  }
  peak.flops_per_sec = measure_peak(device, dtype);
  cache[peak.key] = peak.flops_per_sec;
  try {
    fs::create_directories(cache_file.parent_path());
    write_file_atomically(cache_file, cache.dump(2) + "\n");
  } catch (const std::exception& e) {
    spdlog::warn(
        "peak FLOP/s cache {} not written ({}); the next run measures again",
        cache_file.string(),
        e.what());
  }
  return peak;
}

std::string peak_flops_key(c10::Device device, at::ScalarType dtype, int ranks_on_machine) {
  return fmt::format(
      "{} | {} threads x {} rank(s) | {} | torch {}",
      device_name(device),
      at::get_num_threads(),
      ranks_on_machine,
      c10::toString(dtype),
      TORCH_VERSION);
}

fs::path default_peak_flops_cache() {
  if (const char* dir = std::getenv("LARGO_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return fs::path(dir) / "peak_flops.json";
  }
  if (const char* dir = std::getenv("XDG_CACHE_HOME"); dir != nullptr && *dir != '\0') {
    return fs::path(dir) / "largo" / "peak_flops.json";
  }
  const char* home = std::getenv("HOME");
  return fs::path(home != nullptr && *home != '\0' ? home : "/tmp") / ".cache" / "largo" /
         "peak_flops.json";
}

} // namespace largo
