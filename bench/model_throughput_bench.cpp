// Training throughput of a zoo model: images/s of forward + backward + SGD step on random
// data, after warm-up. Used to size the default job's model (small_cnn) for 2-core CPUs.
//
//   model_throughput_bench [trunk=small_cnn] [batch=128] [threads=2] [steps=40]
//                          [channels=1] [image_size=28] [channels_last=1]
#include <largo/core/malloc_tuning.h>
#include <largo/models/model_factory.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  auto arg = [&](int index, const char* fallback) {
    return std::string(argc > index ? argv[index] : fallback);
  };
  largo::models::ModelOptions options;
  options.trunk_name = arg(1, "small_cnn");
  const int64_t batch = std::stoll(arg(2, "128"));
  const int threads = std::stoi(arg(3, "2"));
  const int steps = std::stoi(arg(4, "40"));
  options.in_channels = std::stoll(arg(5, "1"));
  options.image_size = std::stoll(arg(6, "28"));
  options.small_cnn.channels_last = arg(7, "1") == "1";
  options.num_classes = 10;
  options.resnet.depth = 18;
  options.resnet.stem = "cifar";
  options.vit.patch_size = 4;
  options.vit.num_layers = 4;
  options.vit.num_heads = 4;
  options.vit.hidden_dim = 128;
  options.vit.mlp_dim = 256;

  largo::tune_malloc_for_tensors();
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  auto model = largo::models::build_model(options);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  at::Tensor images =
      torch::randn({batch, options.in_channels, options.image_size, options.image_size});
  at::Tensor labels = torch::randint(0, options.num_classes, {batch});

  auto step = [&] {
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(images), labels).backward();
    optimizer.step();
  };
  for (int i = 0; i < 5; ++i) {
    step();
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    step();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%s: %lld params, batch %lld, %d threads, channels_last %d: %.0f images/s (%.2f ms/step)\n",
      options.trunk_name.c_str(),
      static_cast<long long>(largo::models::count_parameters(*model)),
      static_cast<long long>(batch),
      threads,
      options.small_cnn.channels_last ? 1 : 0,
      static_cast<double>(batch) * steps / seconds,
      1000.0 * seconds / steps);
  return 0;
}
