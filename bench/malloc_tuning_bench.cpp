// Measures what CPU allocator tuning does to a libtorch training step: a conv stack
// forward + backward + SGD step on a fixed batch, timed per step. Run it three ways
// (bench/run_malloc_tuning_bench.sh does): Largo's mallopt tuning (default), untuned
// glibc (LARGO_MALLOC_TUNING=0) and jemalloc (LD_PRELOAD). Prints one JSON line.
#include <largo/core/malloc_tuning.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  const bool tuned = largo::tune_malloc_for_tensors();
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 30;
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  torch::nn::Sequential net(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 3).padding(1)), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 64, 3).padding(1)), torch::nn::ReLU(),
      torch::nn::MaxPool2d(2),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 3).padding(1)), torch::nn::ReLU(),
      torch::nn::AdaptiveAvgPool2d(1), torch::nn::Flatten(), torch::nn::Linear(128, 10));
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  at::Tensor images = torch::randn({64, 3, 32, 32}); // [batch, channels, h, w]
  at::Tensor labels = torch::randint(0, 10, {64}, torch::kLong);

  auto one_step = [&] {
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(net->forward(images), labels);
    loss.backward();
    optimizer.step();
  };
  one_step(); // warm-up: first-touch allocations, oneDNN primitive creation
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    one_step();
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / steps;
  const char* preload = std::getenv("LD_PRELOAD");
  std::printf("{\"mallopt_tuned\": %s, \"ld_preload\": \"%s\", \"threads\": %d, \"ms_per_step\": %.3f}\n",
              tuned ? "true" : "false", preload ? preload : "", threads, ms);
  return 0;
}
