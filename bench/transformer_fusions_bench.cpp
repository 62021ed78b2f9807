// Largo's fused bias + GELU and residual add + LayerNorm kernels against ATen's unfused
// sequences in one run, on ViT-B/16's shapes: BATCH images of 197 tokens, hidden 768, MLP 3072,
// bfloat16 activations and float32 parameters (what autocast gives):
//   bias_gelu       at::gelu(h + b.to(bf16))        h [BATCH, 197, 3072]
//   add_layer_norm  s = x + r; at::layer_norm(s)    x, r [BATCH, 197, 768], bfloat16
//   add_layer_norm  (autocast)                      x bfloat16, r float32 (a ViT's stream under
//                                                    autocast), the output float32
// training forward and backward (every gradient; both outputs of add_layer_norm receive one),
// each side timed over REPEATS calls after a warm-up, ROUNDS times, which side goes first
// alternating by round; prints the median milliseconds per call with their ranges, and
// ATen / fused of the medians. Without a CUDA device (or a build without the kernels) it says
// so and exits 0.
//
// Usage: transformer_fusions_bench [BATCH=128] [REPEATS=20] [ROUNDS=5]
#include <largo/kernels/add_layer_norm.h>
#include <largo/kernels/batch_norm_relu.h> // cuda_kernels_compiled
#include <largo/kernels/bias_gelu.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "cuda_rounds.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr int64_t kTokens = 197;
constexpr int64_t kHidden = 768;
constexpr int64_t kMlp = 3072;
constexpr double kEps = 1e-6;

struct Op {
  std::string name;
  std::function<bool()> fused_applies;
  std::function<void(bool fused)> step; // forward + backward of one side
};

Op bias_gelu_op(int64_t batch) {
  const auto on_gpu = torch::device(torch::kCUDA);
  const at::Tensor input =
      torch::randn({batch, kTokens, kMlp}, on_gpu).to(at::kBFloat16).requires_grad_();
  const at::Tensor bias = torch::randn({kMlp}, on_gpu).requires_grad_();
  const at::Tensor dy = torch::randn({batch, kTokens, kMlp}, on_gpu).to(at::kBFloat16);
  return {
      "bias_gelu [B,197,3072]",
      [=] { return largo::kernels::uses_fused_bias_gelu(input, bias); },
      [=](bool fused) {
        const at::Tensor output = fused ? largo::kernels::bias_gelu(input, bias)
                                        : at::gelu(input + bias.to(at::kBFloat16));
        torch::autograd::grad({output}, {input, bias}, {dy});
      }};
}

// x + residual then LayerNorm; `autocast`: under bfloat16 autocast with a float32 residual.
Op add_layer_norm_op(int64_t batch, bool autocast) {
  const auto on_gpu = torch::device(torch::kCUDA);
  const at::ScalarType residual_dtype = autocast ? at::kFloat : at::kBFloat16;
  const at::Tensor x =
      torch::randn({batch, kTokens, kHidden}, on_gpu).to(at::kBFloat16).requires_grad_();
  const at::Tensor residual =
      torch::randn({batch, kTokens, kHidden}, on_gpu).to(residual_dtype).requires_grad_();
  const at::Tensor weight = torch::ones({kHidden}, on_gpu).requires_grad_();
  const at::Tensor bias = torch::zeros({kHidden}, on_gpu).requires_grad_();
  const at::Tensor dsum = torch::randn({batch, kTokens, kHidden}, on_gpu).to(residual_dtype);
  const at::Tensor dy =
      torch::randn({batch, kTokens, kHidden}, on_gpu).to(autocast ? at::kFloat : at::kBFloat16);
  const auto with_autocast = [autocast](const std::function<void()>& body) {
    const bool was_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
    const at::ScalarType old_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, autocast);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    body();
    at::autocast::set_autocast_enabled(at::kCUDA, was_enabled);
    at::autocast::set_autocast_dtype(at::kCUDA, old_dtype);
  };
  return {
      autocast ? "add_layer_norm autocast" : "add_layer_norm [B,197,768]",
      [=] {
        bool applies = false;
        with_autocast([&] {
          applies = largo::kernels::uses_fused_add_layer_norm(x, residual, weight, bias);
        });
        return applies;
      },
      [=](bool fused) {
        at::Tensor sum;
        at::Tensor output;
        with_autocast([&] {
          if (fused) {
            const auto result = largo::kernels::add_layer_norm(x, residual, weight, bias, kEps);
            sum = result.sum;
            output = result.output;
          } else {
            sum = x + residual;
            output = at::layer_norm(sum, {kHidden}, weight, bias, kEps);
          }
        });
        torch::autograd::grad({sum, output}, {x, residual, weight, bias}, {dsum, dy});
      }};
}

// Milliseconds per step over `repeats` steps.
double time_steps(const Op& op, bool fused, int repeats) {
  return largo::bench::cuda_milliseconds_per_step([&] { op.step(fused); }, repeats);
}

using largo::bench::median;
using largo::bench::median_and_range;

} // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::stoll(argv[1]) : 128;
  const int repeats = argc > 2 ? std::stoi(argv[2]) : 20;
  const int rounds = argc > 3 ? std::stoi(argv[3]) : 5;
  if (!torch::cuda::is_available() || !largo::kernels::cuda_kernels_compiled()) {
    std::printf(
        "transformer_fusions_bench: %s; nothing measured\n",
        torch::cuda::is_available() ? "this build has no CUDA kernels" : "no CUDA device");
    return 0;
  }
  std::printf(
      "transformer_fusions_bench: ViT-B/16, batch %lld x 197 tokens, bfloat16, training forward "
      "+ backward, median of %d rounds of %d steps\n",
      static_cast<long long>(batch),
      rounds,
      repeats);
  std::printf("%-28s %-22s %-22s %12s\n", "op", "ATen ms", "fused ms", "ATen / fused");
  for (const Op& op :
       {bias_gelu_op(batch), add_layer_norm_op(batch, false), add_layer_norm_op(batch, true)}) {
    if (!op.fused_applies()) {
      std::printf("transformer_fusions_bench: the fused kernels refuse %s\n", op.name.c_str());
      return 1;
    }
    time_steps(op, false, 3); // warm-up: the allocator's blocks
    time_steps(op, true, 3);
    std::vector<double> aten;
    std::vector<double> fused;
    for (int round = 0; round < rounds; ++round) {
      for (const bool fused_side : {round % 2 == 1, round % 2 == 0}) {
        (fused_side ? fused : aten).push_back(time_steps(op, fused_side, repeats));
      }
    }
    std::printf(
        "%-28s %-22s %-22s %11.3fx\n",
        op.name.c_str(),
        median_and_range(aten).c_str(),
        median_and_range(fused).c_str(),
        median(aten) / median(fused));
  }
  return 0;
}
