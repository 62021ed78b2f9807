// This machine's float32 and bfloat16 peaks for the two kernels that carry a training step's
// arithmetic: matrix multiply (at::mm: the BLAS for float32, oneDNN for bfloat16) and 2-D
// convolution (oneDNN, forward, channels-last and NCHW). Each is the best of a few shapes
// that a well-tuned library runs near its limit; bench/run_peak_bench.sh divides the models'
// achieved FLOP/s by them (model FLOP utilisation).
//
// Usage: peak_bench [--threads T] [--min-seconds S]
// Prints the machine report (include/largo/core/machine_report.h), one JSON line per kernel
// and shape, then {"peaks": {...}} with the best GFLOP/s of
// each of gemm_float32, gemm_bfloat16, conv_float32, conv_bfloat16.
#include <largo/core/machine_report.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

// Best seconds of one call, over repeats that add up to at least min_seconds (after one
// warm-up call, which also creates oneDNN's primitives).
template <typename Call>
double best_seconds(Call call, double min_seconds) {
  call();
  double best = 1e30, total = 0.0;
  for (int repeats = 0; repeats < 3 || total < min_seconds; ++repeats) {
    const auto start = Clock::now();
    call();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, seconds);
    total += seconds;
  }
  return best;
}

struct ConvShape {
  int64_t batch, channels, size, out_channels, kernel;
};

} // namespace

int main(int argc, char** argv) {
  int threads = 2;
  double min_seconds = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--threads") {
      threads = std::stoi(argv[i + 1]);
    } else if (flag == "--min-seconds") {
      min_seconds = std::stod(argv[i + 1]);
    }
  }
  torch::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  std::cout << nlohmann::json{{"machine", largo::describe_machine().summary()}}.dump() << std::endl;
  std::map<std::string, double> peaks;
  auto record = [&](const std::string& kind,
                    at::ScalarType dtype,
                    const std::string& shape,
                    double flops,
                    double seconds) {
    const std::string key = kind + "_" + (dtype == at::kFloat ? "float32" : "bfloat16");
    const double gflops = flops / seconds / 1e9;
    peaks[key] = std::max(peaks[key], gflops);
    std::cout
        << nlohmann::
               json{{"kernel", key}, {"shape", shape}, {"threads", threads}, {"gflops", gflops}}
                   .dump()
        << std::endl;
  };

  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    // Square GEMMs, and the tall-skinny shape of a Linear layer on a batch of tokens.
    for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{
             {1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096}, {8192, 1024, 1024}}) {
      at::Tensor a = torch::randn({m, k}).to(dtype);
      at::Tensor b = torch::randn({k, n}).to(dtype);
      at::Tensor c = torch::empty({m, n}, a.options());
      const double seconds = best_seconds([&] { at::mm_out(c, a, b); }, min_seconds);
      record("gemm", dtype, fmt::format("{}x{}x{}", m, k, n), 2.0 * m * k * n, seconds);
    }
    // ResNet's 3x3 convolutions (stage 1-3 at 224) and its 1x1 expansion.
    for (const ConvShape& s :
         {ConvShape{32, 64, 56, 64, 3},
          ConvShape{32, 128, 28, 128, 3},
          ConvShape{32, 256, 14, 256, 3},
          ConvShape{32, 256, 56, 64, 1}}) {
      for (const bool channels_last : {true, false}) {
        const auto format =
            channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
        at::Tensor x =
            torch::randn({s.batch, s.channels, s.size, s.size}).to(dtype).contiguous(format);
        at::Tensor w = torch::randn({s.out_channels, s.channels, s.kernel, s.kernel})
                           .to(dtype)
                           .contiguous(format);
        const double seconds =
            best_seconds([&] { at::conv2d(x, w, {}, 1, s.kernel / 2); }, min_seconds);
        const double flops =
            2.0 * s.batch * s.size * s.size * s.out_channels * s.channels * s.kernel * s.kernel;
        record(
            "conv",
            dtype,
            fmt::format(
                "{}x{}x{}x{} k{} -> {}{}",
                s.batch,
                s.channels,
                s.size,
                s.size,
                s.kernel,
                s.out_channels,
                channels_last ? " channels_last" : ""),
            flops,
            seconds);
      }
    }
  }
  std::cout << nlohmann::json{{"peaks", peaks}, {"threads", threads}}.dump() << std::endl;
  return 0;
}
