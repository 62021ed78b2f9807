// CPU training throughput of a Largo model: the same step the trainer runs (zero_grad ->
// forward -> cross-entropy -> loss.item() -> backward -> SGD step), on one fixed in-memory
// batch so that only the model, autograd and the optimizer are measured (no data loading).
// bench/train_throughput_reference.py runs the same model, batch, optimizer and threads in
// PyTorch; bench/run_train_throughput.sh runs both side by side and prints the ratio.
//
// Usage: train_throughput_bench MODEL [--batch N] [--threads T] [--warmup W] [--steps S]
//                               [--precision float32|bfloat16] [--foreach] [--phases]
//   MODEL (defaults in model_spec below; bench/train_throughput_reference.py mirrors them):
//     small_cnn  the default job's model, [N, 1, 28, 28]
//     resnet18   cifar stem, [N, 3, 32, 32]
//     resnet50   imagenet stem, [N, 3, 224, 224], small batch
//     vit        32x32 images in 4x4 patches (65 tokens), 6 layers of width 384 (6 heads,
//                MLP 1536): ViT-S's width on CIFAR-sized images
//     mlp        [N, 3, 32, 32] flattened, 3 hidden layers of 2048
//   --precision bfloat16 runs forward and loss under bfloat16 autocast (PyTorch AMP; the
//     trainer's MODEL.AMP_PARAMS AMP_TYPE pytorch with bfloat16); weights stay float32.
//   --foreach forces SGD's _foreach path (torch.optim's ops, bit for bit) instead of its
//     fused pass (which rounds differently: see include/largo/optim/sgd.h).
//   --phases also times each phase of the step separately (adds timer reads between them).
// Prints one JSON line: model, batch, threads, steps, ms_per_step (wall clock),
// cpu_ms_per_step (CPU time of all threads: less sensitive to other load on the machine),
// images_per_sec, flops_per_sample (training, largo::models::training_flops_per_sample),
// final_loss (and wall ms per phase with --phases).
#include <largo/core/malloc_tuning.h>
#include <largo/models/flop_count.h>
#include <largo/models/model_factory.h>
#include <largo/models/parameter_count.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/precision/autocast.h>

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
  bool bfloat16 = false;
  bool foreach = false;
  bool phases = false;
};

// A benchmark model: its options, input and default step counts (chosen so that one run
// takes a few seconds on the 2-core dev machine).
struct ModelSpec {
  largo::models::ModelOptions options;
  int64_t batch = 0;
  int warmup_steps = 0;
  int steps = 0;
};

ModelSpec model_spec(const std::string& name) {
  ModelSpec spec;
  auto& o = spec.options;
  o.num_classes = 10;
  o.in_channels = 3;
  o.image_size = 32;
  if (name == "small_cnn") {
    o.trunk_name = "small_cnn";
    o.in_channels = 1;
    o.image_size = 28;
    spec = {o, 128, 10, 100};
  } else if (name == "resnet18") {
    o.trunk_name = "resnet";
    o.resnet.depth = 18;
    o.resnet.stem = "cifar";
    spec = {o, 16, 2, 3};
  } else if (name == "resnet50") {
    o.trunk_name = "resnet";
    o.resnet.depth = 50;
    o.image_size = 224;
    spec = {o, 8, 1, 2};
  } else if (name == "vit") {
    o.trunk_name = "vision_transformer";
    o.vit.patch_size = 4;
    o.vit.num_layers = 6;
    o.vit.num_heads = 6;
    o.vit.hidden_dim = 384;
    o.vit.mlp_dim = 1536;
    spec = {o, 32, 2, 4};
  } else if (name == "mlp") {
    o.trunk_name = "mlp";
    o.mlp.hidden_dims = {2048, 2048, 2048};
    spec = {o, 256, 3, 15};
  } else {
    throw std::invalid_argument(
        "unknown model " + name + "; use small_cnn, resnet18, resnet50, vit or mlp");
  }
  return spec;
}

BenchOptions parse(int argc, char** argv) {
  BenchOptions options;
  if (argc < 2) {
    throw std::invalid_argument(
        "usage: train_throughput_bench small_cnn|resnet18|resnet50|vit|mlp [--batch N] "
        "[--threads T] [--warmup W] [--steps S] [--precision float32|bfloat16] [--foreach] "
        "[--phases]");
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
    } else if (flag == "--precision") {
      const std::string precision = i + 1 < argc ? argv[++i] : "";
      if (precision != "float32" && precision != "bfloat16") {
        throw std::invalid_argument("--precision must be float32 or bfloat16");
      }
      options.bfloat16 = precision == "bfloat16";
    } else if (flag == "--foreach") {
      options.foreach = true;
    } else if (flag == "--phases") {
      options.phases = true;
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  const ModelSpec spec = model_spec(options.model); // throws for an unknown model
  options.batch = options.batch > 0 ? options.batch : spec.batch;
  options.warmup_steps = options.warmup_steps > 0 ? options.warmup_steps : spec.warmup_steps;
  options.steps = options.steps > 0 ? options.steps : spec.steps;
  return options;
}

} // namespace

int main(int argc, char** argv) try {
  largo::tune_malloc_for_tensors(); // as the trainer and the `largo` program do
  const BenchOptions options = parse(argc, argv);
  torch::set_num_threads(options.threads);
  torch::manual_seed(0);

  const largo::models::ModelOptions model_options = model_spec(options.model).options;
  const std::vector<int64_t> image_shape = {
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
  sgd_options.fused = !options.foreach;
  largo::optim::SGD optimizer(largo::optim::build_param_groups(*model, group_options), sgd_options);

  double forward_ms = 0.0, backward_ms = 0.0, step_ms = 0.0;
  float last_loss = 0.0f;
  auto one_step = [&](bool time_phases) {
    auto start = Clock::now();
    optimizer.zero_grad();
    at::Tensor loss;
    {
      // Disabled (a no-op) in float32; bfloat16 autocast around forward and loss, as
      // PyTorch's `with torch.autocast("cpu", torch.bfloat16)`.
      largo::precision::AutocastGuard autocast(c10::kCPU, at::kBFloat16, options.bfloat16);
      loss = torch::nn::functional::cross_entropy(model->forward(images), labels);
    }
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
      {"precision", options.bfloat16 ? "bfloat16" : "float32"},
      {"optimizer_pass", options.foreach ? "foreach" : "fused"},
      {"batch", options.batch},
      {"threads", options.threads},
      {"steps", options.steps},
      {"num_parameters", largo::models::count_parameters(*model)},
      {"ms_per_step", ms_per_step},
      {"cpu_ms_per_step", cpu_ms_per_step},
      {"images_per_sec", options.batch * 1000.0 / ms_per_step},
      {"flops_per_sample", largo::models::training_flops_per_sample(model_options)},
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
