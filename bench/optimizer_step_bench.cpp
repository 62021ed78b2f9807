// Optimizer step time over ResNet-50's parameters (25.6 M float32 values in 161 tensors,
// built by Largo's model zoo, grouped with VISSL's rules: BatchNorm and biases undecayed),
// Largo's side. bench/optimizer_step_reference.py times PyTorch on the same parameters
// (this program's --describe output) and bench/run_optimizer_step_bench.sh runs both side
// by side and prints the ratios.
//
// Usage: optimizer_step_bench --describe
//        optimizer_step_bench OPTIMIZER [--path fused|foreach] [--threads T] [--warmup W]
//                             [--steps S]
//   OPTIMIZER: sgd (momentum 0.9), sgd_larc (the same inside LARC, clip mode), adamw, lamb.
//   --path foreach: Largo's _foreach path (what non-CPU devices use) instead of the fused
//   CPU pass.
// Only step() is timed. Parameters and gradients start from torch::manual_seed(0) randn
// draws in parameter order, exactly as the Python side draws them, and the gradients are
// restored (untimed) before every step because LARC rewrites them. Prints one JSON line:
// optimizer, impl, threads, steps, ms_per_step (median over the steps), mean_ms_per_step,
// num_parameters, num_tensors, checksum (sum of all parameters after the run, float64:
// the sides must agree to float32 rounding).
#include <largo/core/malloc_tuning.h>
#include <largo/models/model_factory.h>
#include <largo/optim/optimizer_factory.h>
#include <largo/optim/param_groups.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <stdexcept>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct Parameter {
  std::string name;
  std::vector<int64_t> shape;
  bool decayed = true;
};

// ResNet-50 (ImageNet stem, 1000 classes), named and grouped as the trainer does.
std::vector<Parameter> resnet50_parameters() {
  largo::models::ModelOptions options;
  options.trunk_name = "resnet";
  options.resnet.depth = 50;
  options.image_size = 224;
  options.num_classes = 1000;
  auto model = largo::models::build_model(options);
  largo::optim::ParamGroupOptions group_options; // VISSL's defaults: regularize_bn false
  std::vector<Parameter> parameters;
  for (const auto& group : largo::optim::build_param_groups(*model, group_options)) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      parameters.push_back(
          {group.names[i], group.params[i].sizes().vec(), group.weight_decay != 0.0});
    }
  }
  return parameters;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    throw std::invalid_argument(
        "usage: optimizer_step_bench --describe | sgd|sgd_larc|adamw|lamb [--path fused|foreach] "
        "[--threads T] [--warmup W] [--steps S]");
  }
  const std::string optimizer_name = argv[1];
  std::string path = "fused";
  int threads = 2, warmup = 2, steps = 10;
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      throw std::invalid_argument(flag + " needs a value");
    }
    const std::string value = argv[++i];
    if (flag == "--path") {
      path = value;
    } else if (flag == "--threads") {
      threads = std::stoi(value);
    } else if (flag == "--warmup") {
      warmup = std::stoi(value);
    } else if (flag == "--steps") {
      steps = std::stoi(value);
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  torch::set_num_threads(threads);
  const std::vector<Parameter> parameters = resnet50_parameters();
  if (optimizer_name == "--describe") {
    nlohmann::json out = nlohmann::json::array();
    for (const Parameter& p : parameters) {
      out.push_back({{"name", p.name}, {"shape", p.shape}, {"decayed", p.decayed}});
    }
    std::cout << out.dump() << "\n";
    return 0;
  }
  largo::tune_malloc_for_tensors(); // as the trainer does

  torch::manual_seed(0);
  std::vector<at::Tensor> params, grads;
  for (const Parameter& p : parameters) {
    params.push_back(torch::randn(p.shape).requires_grad_());
  }
  for (const Parameter& p : parameters) {
    grads.push_back(torch::randn(p.shape) * 0.01);
  }
  largo::optim::ParamGroup decayed, undecayed;
  decayed.name = "trunk";
  decayed.weight_decay = 1e-4;
  undecayed.name = "trunk_no_wd";
  for (size_t k = 0; k < parameters.size(); ++k) {
    auto& group = parameters[k].decayed ? decayed : undecayed;
    group.params.push_back(params[k]);
    group.names.push_back(parameters[k].name);
  }

  largo::optim::OptimizerSpec spec;
  spec.sgd.momentum = 0.9;
  spec.name = optimizer_name == "sgd_larc" ? "sgd" : optimizer_name;
  spec.use_larc = optimizer_name == "sgd_larc";
  spec.larc.trust_coefficient = 0.02;
  spec.larc.clip = true;
  if (path != "fused" && path != "foreach") {
    throw std::invalid_argument("--path must be fused or foreach, got " + path);
  }
  spec.sgd.fused = spec.adamw.fused = spec.lamb.fused = spec.larc.fused = path == "fused";
  auto optimizer = largo::optim::make_optimizer({decayed, undecayed}, spec);
  optimizer->set_lr(optimizer_name == "adamw" || optimizer_name == "lamb" ? 1e-3 : 0.1);

  std::vector<double> times_ms;
  for (int step = 0; step < warmup + steps; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (size_t k = 0; k < params.size(); ++k) {
        if (!params[k].grad().defined()) {
          params[k].mutable_grad() = grads[k].clone();
        } else {
          params[k].mutable_grad().copy_(grads[k]);
        }
      }
    }
    const auto start = Clock::now();
    optimizer->step();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (step >= warmup) {
      times_ms.push_back(ms);
    }
  }
  double checksum = 0.0, mean = 0.0;
  int64_t num_parameters = 0;
  for (const at::Tensor& p : params) {
    checksum += p.detach().to(torch::kFloat64).sum().item<double>();
    num_parameters += p.numel();
  }
  for (double t : times_ms) {
    mean += t / static_cast<double>(times_ms.size());
  }
  std::sort(times_ms.begin(), times_ms.end());
  nlohmann::json result = {
      {"optimizer", optimizer_name},
      {"impl", path == "fused" ? "largo" : "largo_foreach"},
      {"threads", threads},
      {"steps", steps},
      {"ms_per_step", times_ms[times_ms.size() / 2]},
      {"mean_ms_per_step", mean},
      {"num_parameters", num_parameters},
      {"num_tensors", params.size()},
      {"checksum", checksum}};
  std::cout << result.dump() << "\n";
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::cerr << "optimizer_step_bench: " << error.what() << "\n";
    return 1;
  }
}
