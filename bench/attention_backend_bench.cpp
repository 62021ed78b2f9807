// Which of ATen's scaled-dot-product-attention backends is fastest at ViT-B/16's attention
// (issue 43, part 2: the backend is to be chosen by measurement at 197 tokens): BATCH images,
// 12 heads of 64, 197 tokens, bfloat16, q / k / v as the ViT's layer slices them from one qkv
// projection (models/vit.cpp: [3, b, heads, t, head_dim] views of a [b, t, 3 * 768] tensor),
// training forward and backward. The sides, in one run: ATen's default choice (its priority
// order as shipped: flash, memory-efficient, math, cuDNN), and each of flash, memory-efficient
// and cuDNN with only that backend enabled; the order of the sides rotates by round. Prints each
// side's median milliseconds per step with its range and default / side of the medians; a
// backend that refuses these inputs is listed as refused. Without a CUDA device it says so and
// exits 0.
//
// Usage: attention_backend_bench [BATCH=128] [REPEATS=20] [ROUNDS=5]
#include <ATen/Context.h>
#include <torch/torch.h>

#include "cuda_rounds.h"

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace {

constexpr int64_t kTokens = 197;
constexpr int64_t kHeads = 12;
constexpr int64_t kHeadDim = 64;

// The backends ATen may use; nullopt: its own choice.
struct Side {
  std::string name;
  std::optional<at::SDPBackend> only;
};

// ATen's enabled backends for a scope: all as shipped, or `only` one; restored after.
class EnabledBackends {
 public:
  explicit EnabledBackends(std::optional<at::SDPBackend> only) {
    auto& context = at::globalContext();
    saved_ = {
        context.userEnabledFlashSDP(),
        context.userEnabledMemEfficientSDP(),
        context.userEnabledMathSDP(),
        context.userEnabledCuDNNSDP()};
    if (only) {
      context.setSDPUseFlash(*only == at::SDPBackend::flash_attention);
      context.setSDPUseMemEfficient(*only == at::SDPBackend::efficient_attention);
      context.setSDPUseMath(false);
      context.setSDPUseCuDNN(*only == at::SDPBackend::cudnn_attention);
    }
  }
  ~EnabledBackends() {
    auto& context = at::globalContext();
    context.setSDPUseFlash(saved_[0]);
    context.setSDPUseMemEfficient(saved_[1]);
    context.setSDPUseMath(saved_[2]);
    context.setSDPUseCuDNN(saved_[3]);
  }
  EnabledBackends(const EnabledBackends&) = delete;
  EnabledBackends& operator=(const EnabledBackends&) = delete;

 private:
  std::vector<bool> saved_;
};

struct Inputs {
  at::Tensor qkv; // [b, t, 3 * heads * head_dim], the leaf the gradient reaches
  at::Tensor grad_output;
};

Inputs make_inputs(int64_t batch) {
  const auto on_gpu = torch::device(torch::kCUDA).dtype(at::kBFloat16);
  return {
      torch::randn({batch, kTokens, 3 * kHeads * kHeadDim}, on_gpu).requires_grad_(),
      torch::randn({batch, kHeads, kTokens, kHeadDim}, on_gpu)};
}

// One training forward and backward of the attention, as the ViT's layer calls it.
void attention_step(const Inputs& inputs) {
  const int64_t batch = inputs.qkv.size(0);
  const at::Tensor qkv =
      inputs.qkv.reshape({batch, kTokens, 3, kHeads, kHeadDim}).permute({2, 0, 3, 1, 4});
  const at::Tensor out = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]);
  torch::autograd::grad({out}, {inputs.qkv}, {inputs.grad_output});
}

// Whether the side's backends take these inputs (ATen throws when no enabled one does).
bool runs(const Side& side, const Inputs& inputs) {
  EnabledBackends enabled(side.only);
  try {
    attention_step(inputs);
    torch::cuda::synchronize();
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

double time_side(const Side& side, const Inputs& inputs, int repeats) {
  EnabledBackends enabled(side.only);
  return largo::bench::cuda_milliseconds_per_step([&] { attention_step(inputs); }, repeats);
}

} // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::stoll(argv[1]) : 128;
  const int repeats = argc > 2 ? std::stoi(argv[2]) : 20;
  const int rounds = argc > 3 ? std::stoi(argv[3]) : 5;
  if (!torch::cuda::is_available()) {
    std::printf("attention_backend_bench: no CUDA device; nothing measured\n");
    return 0;
  }
  std::printf(
      "attention_backend_bench: ViT-B/16 attention, batch %lld x 12 heads x 197 tokens x 64, "
      "bfloat16, training forward + backward, median of %d rounds of %d steps\n",
      static_cast<long long>(batch),
      rounds,
      repeats);
  const Inputs inputs = make_inputs(batch);
  std::vector<Side> sides;
  for (const Side& side : std::vector<Side>{
           {"ATen's default", std::nullopt},
           {"flash", at::SDPBackend::flash_attention},
           {"memory-efficient", at::SDPBackend::efficient_attention},
           {"cuDNN", at::SDPBackend::cudnn_attention}}) {
    if (runs(side, inputs)) {
      time_side(side, inputs, 3); // warm-up: the allocator's blocks, cuDNN's plan cache
      sides.push_back(side);
    } else {
      std::printf("%-20s refused these inputs\n", side.name.c_str());
    }
  }
  std::vector<std::vector<double>> times(sides.size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < sides.size(); ++i) {
      const size_t side = (i + static_cast<size_t>(round)) % sides.size(); // rotate the order
      times[side].push_back(time_side(sides[side], inputs, repeats));
    }
  }
  std::printf("%-20s %-22s %16s\n", "backend", "ms per step", "default / this");
  for (size_t i = 0; i < sides.size(); ++i) {
    std::printf(
        "%-20s %-22s %15.3fx\n",
        sides[i].name.c_str(),
        largo::bench::median_and_range(times[i]).c_str(),
        largo::bench::median(times[0]) / largo::bench::median(times[i]));
  }
  return 0;
}
