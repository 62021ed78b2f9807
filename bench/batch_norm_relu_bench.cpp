// Largo's fused BatchNorm + ReLU (+ residual add) kernels against ATen's unfused sequence
// (at::batch_norm, += residual, relu_: cuDNN's channels-last BatchNorm on a GPU) in one run:
// ResNet-50's BatchNorm shapes at batch BATCH in bfloat16 channels-last, training forward and
// backward (the gradients of input, weight, bias and residual), each side timed over REPEATS
// calls after a warm-up, ROUNDS times, which side goes first alternating by round; prints the
// median milliseconds per call with their ranges, and ATen / fused of the medians. Issue 43 chooses
// between these kernels and cuDNN's by this measurement. Without a CUDA device (or a build without
// the kernels) it says so and exits 0.
//
// Usage: batch_norm_relu_bench [BATCH=256] [REPEATS=20] [ROUNDS=3]
#include <largo/kernels/batch_norm_relu.h>

#include <torch/torch.h>

#include "cuda_rounds.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

struct Shape {
  int64_t channels;
  int64_t size; // H = W
  bool residual;
};

// ResNet-50's BatchNorms (batch aside): the stem's, then each stage's first 1x1/3x3 (ReLU) and
// its expanding 1x1 (add + ReLU).
const std::vector<Shape> kShapes = {
    {64, 112, false},
    {64, 56, false},
    {256, 56, true},
    {128, 28, false},
    {512, 28, true},
    {256, 14, false},
    {1024, 14, true},
    {512, 7, false},
    {2048, 7, true}};

struct Tensors {
  at::Tensor input;
  at::Tensor residual;
  at::Tensor weight;
  at::Tensor bias;
  at::Tensor running_mean;
  at::Tensor running_var;
  at::Tensor grad_output;
};

Tensors make_tensors(int64_t batch, const Shape& shape) {
  const auto on_gpu = torch::device(torch::kCUDA);
  const auto activations = [&] {
    return torch::randn({batch, shape.channels, shape.size, shape.size}, on_gpu)
        .to(at::kBFloat16)
        .contiguous(at::MemoryFormat::ChannelsLast);
  };
  Tensors tensors;
  tensors.input = activations().requires_grad_();
  if (shape.residual) {
    tensors.residual = activations().requires_grad_();
  }
  tensors.weight = torch::ones({shape.channels}, on_gpu).requires_grad_();
  tensors.bias = torch::zeros({shape.channels}, on_gpu).requires_grad_();
  tensors.running_mean = torch::zeros({shape.channels}, on_gpu);
  tensors.running_var = torch::ones({shape.channels}, on_gpu);
  tensors.grad_output = activations();
  return tensors;
}

// One training step of the block's tail: forward, then every gradient.
void step(const Tensors& t, bool fused) {
  at::Tensor output;
  if (fused) {
    output = t.residual.defined()
                 ? largo::kernels::batch_norm_add_relu(
                       t.input,
                       t.residual,
                       t.weight,
                       t.bias,
                       t.running_mean,
                       t.running_var,
                       true,
                       0.1,
                       1e-5)
                 : largo::kernels::batch_norm_relu(
                       t.input, t.weight, t.bias, t.running_mean, t.running_var, true, 0.1, 1e-5);
  } else {
    output = at::batch_norm(
        t.input,
        t.weight,
        t.bias,
        t.running_mean,
        t.running_var,
        true,
        0.1,
        1e-5,
        at::globalContext().userEnabledCuDNN());
    if (t.residual.defined()) {
      output += t.residual; // as the trunks' blocks (models/resnet.cpp)
    }
    output.relu_();
  }
  std::vector<at::Tensor> leaves = {t.input, t.weight, t.bias};
  if (t.residual.defined()) {
    leaves.push_back(t.residual);
  }
  torch::autograd::grad({output}, leaves, {t.grad_output});
}

// Milliseconds per step over `repeats` steps.
double time_steps(const Tensors& tensors, bool fused, int repeats) {
  return largo::bench::cuda_milliseconds_per_step([&] { step(tensors, fused); }, repeats);
}

using largo::bench::median;
using largo::bench::median_and_range;

} // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::stoll(argv[1]) : 256;
  const int repeats = argc > 2 ? std::stoi(argv[2]) : 20;
  const int rounds = argc > 3 ? std::stoi(argv[3]) : 3;
  if (!torch::cuda::is_available() || !largo::kernels::cuda_kernels_compiled()) {
    std::printf(
        "batch_norm_relu_bench: %s; nothing measured\n",
        torch::cuda::is_available() ? "this build has no CUDA kernels" : "no CUDA device");
    return 0;
  }
  std::printf(
      "batch_norm_relu_bench: batch %lld, bfloat16 channels-last, training forward + backward, "
      "median of %d rounds of %d steps\n",
      static_cast<long long>(batch),
      rounds,
      repeats);
  std::printf(
      "%-22s %-9s %-22s %-22s %12s\n",
      "shape [C, H, W]",
      "op",
      "ATen ms",
      "fused ms",
      "ATen / fused");
  double aten_total = 0.0;
  double fused_total = 0.0;
  for (const Shape& shape : kShapes) {
    const Tensors tensors = make_tensors(batch, shape);
    if (!largo::kernels::uses_fused_batch_norm(
            tensors.input,
            tensors.residual,
            tensors.weight,
            tensors.bias,
            tensors.running_mean,
            tensors.running_var)) {
      std::printf("batch_norm_relu_bench: the fused kernels refuse these tensors\n");
      return 1;
    }
    time_steps(tensors, false, 3); // warm-up: cuDNN's plans, the allocator's blocks
    time_steps(tensors, true, 3);
    std::vector<double> aten;
    std::vector<double> fused;
    for (int round = 0; round < rounds; ++round) {
      for (const bool fused_side : {round % 2 == 1, round % 2 == 0}) {
        (fused_side ? fused : aten).push_back(time_steps(tensors, fused_side, repeats));
      }
    }
    const double aten_ms = median(aten);
    const double fused_ms = median(fused);
    aten_total += aten_ms;
    fused_total += fused_ms;
    char sizes[32];
    std::snprintf(
        sizes,
        sizeof sizes,
        "[%lld, %lld, %lld]",
        static_cast<long long>(shape.channels),
        static_cast<long long>(shape.size),
        static_cast<long long>(shape.size));
    std::printf(
        "%-22s %-9s %-22s %-22s %11.3fx\n",
        sizes,
        shape.residual ? "add+relu" : "relu",
        median_and_range(aten).c_str(),
        median_and_range(fused).c_str(),
        aten_ms / fused_ms);
  }
  std::printf(
      "%-22s %-9s %-22.3f %-22.3f %11.3fx\n",
      "sum of the medians",
      "",
      aten_total,
      fused_total,
      aten_total / fused_total);
  return 0;
}
