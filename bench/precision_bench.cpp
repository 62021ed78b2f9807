// Mixed-precision training throughput and memory of a Largo model: the trainer's step
// (zero_grad -> MixedPrecision::forward -> cross-entropy -> loss.item() -> backward ->
// unscale_ -> step) on one fixed in-memory batch, in one precision per run.
// bench/precision_reference.py runs the same model, batch, optimizer and precision in
// PyTorch (torch.autocast, GradScaler, and Apex's O2 recipe written out by hand);
// bench/run_precision_bench.sh runs both side by side and prints the ratios.
//
// Usage: precision_bench MODEL [--precision P] [--device cpu|cuda] [--batch N] [--threads T]
//                        [--warmup W] [--steps S] [--memory] [--channels-last]
//                        [--profile PATH] [--profile-steps K] [--no-finite-check]
//   MODEL: small_cnn ([N, 1, 28, 28]), resnet18 (cifar stem, [N, 3, 32, 32]), resnet50
//          (imagenet stem, [N, 3, 224, 224], 1000 classes) or vit_b16 (ViT-B/16 at 224 with
//          qkv biases, as torchvision's vit_b_16, 1000 classes); the last two are meant for
//          --device cuda.
//   --channels-last: the model's 4-d weights and the images in channels-last memory format
//      (NHWC: what cuDNN's tensor-core convolutions read without a transpose).
//   P: fp32 | tf32 | o1_bf16 | o2_bf16 | o1_fp16 | o2_fp16  (Apex opt level + dtype; fp16 is
//      loss-scaled dynamically; fp32 turns TF32 off for matmuls and cuDNN, tf32 turns it on).
//   --memory (CPU): after the timed steps, one more step measured with /proc/self/status:
//      VmRSS at the start of the step (after zero_grad freed the gradients) is the base;
//      peak RSS (VmHWM, reset through /proc/self/clear_refs) above it after the forward
//      (activations kept for backward + the forward's temporaries) and after the whole step
//      (+ gradients, master gradients, backward temporaries). Meaningful only when glibc
//      returns freed blocks at once: run_precision_bench.sh sets LARGO_MALLOC_TUNING=0 and
//      GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536 for both sides. Parameter, master,
//      gradient and optimizer-state bytes are summed from the tensors themselves.
//   --profile PATH: after the timed steps, K more (default 3) under libtorch's Kineto profiler
//      (host and, on CUDA, the GPU's kernels, copies and launches), written to PATH as a Chrome
//      trace; precision_reference.py --profile writes PyTorch's, and
//      bench/kernel_profile_table.py compares the two (LARGO_GPU_BENCH_PROFILE in
//      bench/run_gpu_train_bench.sh, scripts/gpu_check.sh --profile).
//   --no-finite-check: without loss scaling, skip the inf/NaN check of the gradients before
//      the step (HOOKS.CHECK_NAN = false in `largo train`): one pass over the gradients and a
//      host sync per step that PyTorch's loop in precision_reference.py does not do.
// Prints one JSON line.
#include <largo/core/malloc_tuning.h>
#include <largo/core/memory_tracker.h>
#include <largo/models/flop_count.h>
#include <largo/models/model_factory.h>
#include <largo/models/parameter_count.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/precision/mixed_precision.h>
#include <largo/precision/tf32.h>

#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model = "small_cnn";
  std::string precision = "fp32";
  std::string device = "cpu";
  int64_t batch = 0; // 0: the model's default below
  int threads = 2;
  int warmup_steps = 0;
  int steps = 0;
  bool memory = false;
  bool channels_last = false;
  std::string profile_path; // empty: no profile
  int profile_steps = 3;
  bool finite_check = true;
};

BenchOptions parse(int argc, char** argv) {
  BenchOptions options;
  if (argc < 2) {
    throw std::invalid_argument(
        "usage: precision_bench small_cnn|resnet18|resnet50|vit_b16 [--precision fp32|tf32|o1_bf16|"
        "o2_bf16|o1_fp16|o2_fp16] [--device cpu|cuda] [--batch N] [--threads T] [--warmup W] "
        "[--steps S] [--memory] [--channels-last] [--profile PATH] [--profile-steps K] "
        "[--no-finite-check]");
  }
  options.model = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    auto text = [&]() -> std::string {
      if (i + 1 >= argc) {
        throw std::invalid_argument(flag + " needs a value");
      }
      return argv[++i];
    };
    if (flag == "--precision") {
      options.precision = text();
    } else if (flag == "--device") {
      options.device = text();
    } else if (flag == "--batch") {
      options.batch = std::stoll(text());
    } else if (flag == "--threads") {
      options.threads = std::stoi(text());
    } else if (flag == "--warmup") {
      options.warmup_steps = std::stoi(text());
    } else if (flag == "--steps") {
      options.steps = std::stoi(text());
    } else if (flag == "--memory") {
      options.memory = true;
    } else if (flag == "--channels-last") {
      options.channels_last = true;
    } else if (flag == "--no-finite-check") {
      options.finite_check = false;
    } else if (flag == "--profile") {
      options.profile_path = text();
    } else if (flag == "--profile-steps") {
      options.profile_steps = std::stoi(text());
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  // Defaults: a few seconds per run on the 2-core dev machine (bfloat16 convolutions are
  // several times slower than float32 ones on a CPU without native bfloat16), and a
  // steady measurement on a GPU.
  const bool cuda = options.device == "cuda";
  const bool small = options.model == "small_cnn";
  if (options.batch == 0) {
    options.batch = cuda ? (small ? 512 : 128) : (small ? 128 : 16);
  }
  if (options.warmup_steps == 0) {
    options.warmup_steps = cuda ? 10 : (small ? 3 : 1);
  }
  if (options.steps == 0) {
    options.steps = cuda ? 50 : (small ? 10 : 2);
  }
  return options;
}

// The opt-level part of P as an Apex AMP_ARGS setting.
largo::precision::PrecisionPolicy policy_for(const std::string& precision) {
  largo::precision::PrecisionPolicyOptions options;
  if (precision == "fp32" || precision == "tf32") {
    return largo::precision::resolve_precision_policy(options);
  }
  const auto underscore = precision.find('_');
  if (underscore == std::string::npos) {
    throw std::invalid_argument("unknown precision " + precision);
  }
  const std::string level = precision.substr(0, underscore);
  const std::string dtype = precision.substr(underscore + 1);
  if ((level != "o1" && level != "o2") || (dtype != "bf16" && dtype != "fp16")) {
    throw std::invalid_argument("unknown precision " + precision);
  }
  options.use_amp = true;
  options.opt_level = level == "o1" ? "O1" : "O2";
  options.dtype = dtype == "bf16" ? "bfloat16" : "float16";
  return largo::precision::resolve_precision_policy(options);
}

// kB from a "Name:   123 kB" line of /proc/self/status.
int64_t status_kb(const std::string& name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(name + ":", 0) == 0) {
      return std::stoll(line.substr(name.size() + 1));
    }
  }
  throw std::runtime_error("no " + name + " in /proc/self/status");
}

void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5"; // VmHWM := VmRSS
}

int64_t tensor_bytes(const at::Tensor& tensor) {
  return tensor.defined() ? static_cast<int64_t>(tensor.numel() * tensor.element_size()) : 0;
}

// Runs `steps` under the Kineto profiler (what torch.profiler.profile drives in Python) and
// saves its Chrome trace to `path`. profiler_kineto.h is libtorch's internal C++ API (as of
// 2.11), used only here: a benchmark, not the library.
template <typename Steps>
void write_kineto_trace(const std::string& path, bool cuda, Steps&& steps) {
  namespace impl = torch::profiler::impl;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (cuda) {
    activities.insert(impl::ActivityType::CUDA);
  }
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  steps();
  torch::autograd::profiler::disableProfiler()->save(path);
}

} // namespace

int main(int argc, char** argv) try {
  largo::tune_malloc_for_tensors(); // as the trainer does (LARGO_MALLOC_TUNING=0 skips it)
  const BenchOptions options = parse(argc, argv);
  torch::set_num_threads(options.threads);
  torch::manual_seed(0);
  const bool cuda = options.device == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    throw std::runtime_error("--device cuda: no CUDA device is visible");
  }
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  // fp32 means true float32 (TF32 off everywhere); tf32 turns it on for matmuls and cuDNN.
  largo::precision::apply_tf32({options.precision == "tf32", options.precision == "tf32"});

  largo::models::ModelOptions model_options;
  int64_t num_classes = 10;
  if (options.model == "small_cnn") {
    model_options.trunk_name = "small_cnn";
    model_options.in_channels = 1;
    model_options.image_size = 28;
  } else if (options.model == "resnet18" || options.model == "resnet50") {
    const bool imagenet = options.model == "resnet50";
    model_options.trunk_name = "resnet";
    model_options.resnet.depth = imagenet ? 50 : 18;
    model_options.resnet.stem = imagenet ? "imagenet" : "cifar";
    model_options.in_channels = 3;
    model_options.image_size = imagenet ? 224 : 32;
    num_classes = imagenet ? 1000 : 10;
  } else if (options.model == "vit_b16") {
    model_options.trunk_name = "vision_transformer";
    model_options.vit.qkv_bias = true; // torchvision's vit_b_16 has them (VISSL's default not)
    model_options.in_channels = 3;
    model_options.image_size = 224;
    num_classes = 1000;
  } else {
    throw std::invalid_argument(
        "unknown model " + options.model + "; use small_cnn, resnet18, resnet50 or vit_b16");
  }
  model_options.num_classes = num_classes;

  // The same tensors as the reference script draws (same generator, seed and order).
  at::Tensor images = torch::randn({options.batch, model_options.in_channels,
                                    model_options.image_size, model_options.image_size})
                          .to(device); // [batch, channels, h, w]
  at::Tensor labels =
      torch::randint(0, num_classes, {options.batch}, torch::kLong).to(device); // [batch]

  largo::models::TrunkHeadModel model = largo::models::build_model(model_options);
  model->to(device);
  if (options.channels_last) {
    for (auto& param : model->parameters()) {
      if (param.dim() == 4) {
        param.set_data(param.contiguous(at::MemoryFormat::ChannelsLast));
      }
    }
    images = images.contiguous(at::MemoryFormat::ChannelsLast);
  }
  model->train();
  largo::precision::MixedPrecision precision(
      policy_for(options.precision), *model, device, {}, options.finite_check);

  // The default job's optimizer: SGD, Nesterov momentum 0.9, weight decay 5e-4 except on
  // BatchNorm parameters; under O2 it updates the float32 masters.
  largo::optim::ParamGroupOptions group_options;
  group_options.lr = 0.05;
  group_options.weight_decay = 5e-4;
  auto groups = largo::optim::build_param_groups(*model, group_options);
  std::vector<at::Tensor> optimizer_params;
  for (auto& group : groups) {
    for (size_t i = 0; i < group.params.size(); ++i) {
      group.params[i] = precision.optimizer_param(group.names[i], group.params[i]);
      optimizer_params.push_back(group.params[i]);
    }
  }
  largo::optim::SGDOptions sgd_options;
  sgd_options.momentum = 0.9;
  sgd_options.nesterov = true;
  largo::optim::SGD optimizer(std::move(groups), sgd_options);

  float last_loss = 0.0f;
  int64_t forward_peak_kb = 0;
  int64_t step_peak_kb = 0;
  int64_t grad_bytes = 0;
  auto one_step = [&](bool measure_memory) {
    optimizer.zero_grad();
    int64_t base_kb = 0;
    if (measure_memory) {
      base_kb = status_kb("VmRSS");
      reset_peak_rss();
    }
    at::Tensor logits =
        precision.forward([&](const at::Tensor& x) { return model->forward(x); }, images);
    at::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
    last_loss = loss.item<float>(); // the trainer reads every loss (NaN check, logging)
    if (measure_memory) {
      forward_peak_kb = status_kb("VmHWM") - base_kb;
    }
    precision.backward(loss);
    precision.unscale_(optimizer_params);
    if (measure_memory) {
      // Model gradients (float32 parameters under O2 keep theirs), plus the masters' own.
      grad_bytes = 0;
      auto model_params = model->parameters();
      for (const auto& param : model_params) {
        grad_bytes += tensor_bytes(param.grad());
      }
      for (const auto& param : optimizer_params) {
        const bool is_model_param = std::any_of(model_params.begin(), model_params.end(),
                                                [&](const at::Tensor& p) { return p.is_same(param); });
        if (!is_model_param) {
          grad_bytes += tensor_bytes(param.grad());
        }
      }
    }
    precision.step([&] { optimizer.step(); });
    if (measure_memory) {
      step_peak_kb = status_kb("VmHWM") - base_kb;
    }
  };
  auto synchronize = [&] {
    if (cuda) {
      torch::cuda::synchronize();
    }
  };

  for (int i = 0; i < options.warmup_steps; ++i) {
    one_step(false); // first-touch allocations, oneDNN/cuDNN primitive creation
  }
  synchronize();
  // CUDA: the allocator's peak over the timed steps (everything live: model, optimizer
  // state, activations), as torch.cuda.max_memory_allocated() after a reset.
  std::optional<largo::MemoryTracker> cuda_memory;
  if (cuda) {
    cuda_memory.emplace(device);
    cuda_memory->start_window();
  }
  const auto start = Clock::now();
  const std::clock_t cpu_start = std::clock();
  for (int i = 0; i < options.steps; ++i) {
    one_step(false);
  }
  synchronize();
  const double ms_per_step =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count() / options.steps;
  const double cpu_ms_per_step =
      1000.0 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / options.steps;

  nlohmann::json result = {
      {"impl", "largo"},
      {"model", options.model},
      {"precision", options.precision},
      {"device", options.device},
      {"batch", options.batch},
      {"threads", options.threads},
      {"steps", options.steps},
      {"num_parameters", largo::models::count_parameters(*model)},
      {"ms_per_step", ms_per_step},
      {"cpu_ms_per_step", cpu_ms_per_step},
      {"images_per_sec", options.batch * 1000.0 / ms_per_step},
      {"channels_last", options.channels_last},
      {"finite_check", options.finite_check},
      {"training_flops_per_image", largo::models::training_flops_per_sample(model_options)},
      {"final_loss", last_loss},
      {"skipped_steps", precision.skipped_steps()}};
  if (cuda_memory) {
    result["cuda_peak_allocated_bytes"] = cuda_memory->peak_bytes();
  }
  if (options.memory && !cuda) {
    one_step(true);
    int64_t param_bytes = 0;
    for (const auto& param : model->parameters()) {
      param_bytes += tensor_bytes(param);
    }
    for (const auto& buffer : model->buffers()) {
      param_bytes += tensor_bytes(buffer);
    }
    const auto* masters = precision.master_weights();
    result["param_bytes"] = param_bytes;
    result["master_bytes"] = masters ? masters->copy_bytes() : 0;
    result["grad_bytes"] = grad_bytes;
    result["optimizer_state_bytes"] = optimizer.state_bytes();
    result["forward_peak_bytes"] = forward_peak_kb * 1024;
    result["step_peak_bytes"] = step_peak_kb * 1024;
  }
  if (!options.profile_path.empty()) {
    write_kineto_trace(options.profile_path, cuda, [&] {
      for (int i = 0; i < options.profile_steps; ++i) {
        one_step(false);
      }
      synchronize();
    });
    result["profile"] = options.profile_path;
    result["profile_steps"] = options.profile_steps;
  }
  std::cout << result.dump() << std::endl;
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "precision_bench: %s\n", error.what());
  return 1;
}
