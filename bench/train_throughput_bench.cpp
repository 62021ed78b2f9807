// CPU training throughput of a Largo model: the same step the trainer runs (zero_grad ->
// forward -> cross-entropy -> loss.item() -> backward -> SGD step), on one fixed in-memory
// batch so that only the model, autograd and the optimizer are measured (no data loading).
// bench/train_throughput_reference.py runs the same model, batch, optimizer and threads in
// PyTorch; bench/run_train_throughput.sh runs both side by side and prints the ratio.
//
// Usage: train_throughput_bench MODEL [--batch N] [--threads T] [--warmup W] [--steps S]
//                               [--phases]
//   MODEL: small_cnn (Fashion-MNIST shape [N, 1, 28, 28], the default job's model) or
//          resnet18 (cifar stem, [N, 3, 32, 32]).
//   --phases also times each phase of the step separately (adds timer reads between them).
// Prints one JSON line: model, batch, threads, steps, ms_per_step (wall clock),
// cpu_ms_per_step (CPU time of all threads: less sensitive to other load on the machine),
// images_per_sec (and wall ms per phase with --phases).
#include <largo/core/malloc_tuning.h>
#include <largo/models/model_factory.h>
#include <largo/models/parameter_count.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <stdexcept>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct BenchOptions {
  std::string model = "small_cnn";
  int64_t batch = 0; // 0: the model's default below
  int threads = 2;
  int warmup_steps = 0; // 0: the model's default below
  int steps = 0;        // 0: the model's default below
  bool phases = false;
};

BenchOptions parse(int argc, char** argv) {
  BenchOptions options;
  if (argc < 2) {
    throw std::invalid_argument("usage: train_throughput_bench small_cnn|resnet18 [--batch N] "
                                "[--threads T] [--warmup W] [--steps S] [--phases]");
  }
  options.model = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) {
        throw std::invalid_argument(flag + " needs a value");
      }
      return std::stoll(argv[++i]);
    };
    if (flag == "--batch") {
      options.batch = value();
    } else if (flag == "--threads") {
      options.threads = static_cast<int>(value());
    } else if (flag == "--warmup") {
      options.warmup_steps = static_cast<int>(value());
    } else if (flag == "--steps") {
      options.steps = static_cast<int>(value());
    } else if (flag == "--phases") {
      options.phases = true;
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  // Defaults chosen so one run takes a few seconds on the 2-core dev machine.
  const bool small = options.model == "small_cnn";
  if (options.batch == 0) {
    options.batch = small ? 128 : 16;
  }
  if (options.warmup_steps == 0) {
    options.warmup_steps = small ? 10 : 2;
  }
  if (options.steps == 0) {
    options.steps = small ? 100 : 3;
  }
  return options;
}

} // namespace

int main(int argc, char** argv) try {
  largo::tune_malloc_for_tensors(); // as the trainer and the `largo` program do
  const BenchOptions options = parse(argc, argv);
  torch::set_num_threads(options.threads);
  torch::manual_seed(0);

  largo::models::ModelOptions model_options;
  std::vector<int64_t> image_shape; // [batch, channels, h, w]
  if (options.model == "small_cnn") {
    model_options.trunk_name = "small_cnn";
    model_options.in_channels = 1;
    model_options.image_size = 28;
  } else if (options.model == "resnet18") {
    model_options.trunk_name = "resnet";
    model_options.resnet.depth = 18;
    model_options.resnet.stem = "cifar";
    model_options.in_channels = 3;
    model_options.image_size = 32;
  } else {
    throw std::invalid_argument("unknown model " + options.model + "; use small_cnn or resnet18");
  }
  model_options.num_classes = 10;
  image_shape = {
      options.batch, model_options.in_channels, model_options.image_size, model_options.image_size};

  // The same tensors as the reference script draws (same generator, seed and order).
  at::Tensor images = torch::randn(image_shape); // [batch, channels, h, w]
  at::Tensor labels = torch::randint(0, 10, {options.batch}, torch::kLong); // [batch]

  largo::models::TrunkHeadModel model = largo::models::build_model(model_options);
  model->train();

  // The default job's optimizer: SGD, Nesterov momentum 0.9, weight decay 5e-4 except on
  // BatchNorm parameters (VISSL's regularize_bn: False).
  largo::optim::ParamGroupOptions group_options;
  group_options.lr = 0.05;
  group_options.weight_decay = 5e-4;
  largo::optim::SGDOptions sgd_options;
  sgd_options.momentum = 0.9;
  sgd_options.nesterov = true;
  largo::optim::SGD optimizer(largo::optim::build_param_groups(*model, group_options), sgd_options);

  double forward_ms = 0.0, backward_ms = 0.0, step_ms = 0.0;
  float last_loss = 0.0f;
  auto one_step = [&](bool time_phases) {
    auto start = Clock::now();
    optimizer.zero_grad();
    at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
    last_loss = loss.item<float>(); // the trainer reads every loss (NaN check, logging)
    if (time_phases) {
      forward_ms += ms_since(start);
      start = Clock::now();
    }
    loss.backward();
    if (time_phases) {
      backward_ms += ms_since(start);
      start = Clock::now();
    }
    optimizer.step();
    if (time_phases) {
      step_ms += ms_since(start);
    }
  };

  for (int i = 0; i < options.warmup_steps; ++i) {
    one_step(false); // first-touch allocations, oneDNN primitive creation
  }
  const auto start = Clock::now();
  const std::clock_t cpu_start = std::clock(); // CPU time of all threads of the process
  for (int i = 0; i < options.steps; ++i) {
    one_step(options.phases);
  }
  const double ms_per_step = ms_since(start) / options.steps;
  const double cpu_ms_per_step =
      1000.0 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / options.steps;

  nlohmann::json result = {
      {"impl", "largo"},
      {"model", options.model},
      {"batch", options.batch},
      {"threads", options.threads},
      {"steps", options.steps},
      {"num_parameters", largo::models::count_parameters(*model)},
      {"ms_per_step", ms_per_step},
      {"cpu_ms_per_step", cpu_ms_per_step},
      {"images_per_sec", options.batch * 1000.0 / ms_per_step},
      {"final_loss", last_loss}};
  if (options.phases) {
    result["forward_ms"] = forward_ms / options.steps;
    result["backward_ms"] = backward_ms / options.steps;
    result["step_ms"] = step_ms / options.steps;
  }
  std::cout << result.dump() << std::endl;
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "train_throughput_bench: %s\n", error.what());
  return 1;
}
