// Activation checkpointing on the CPU: peak activation memory and step time of one model at
// one number of splits. bench/activation_checkpoint_reference.py runs the same model and
// batch with PyTorch's torch.utils.checkpoint.checkpoint_sequential, and
// bench/run_activation_checkpoint.sh runs both side by side over splits 0..4 and prints the
// ratios.
//
// Usage: activation_checkpoint_bench MODEL --splits N [--cut count|activation] [--batch B]
//                                    [--image S] [--threads T] [--warmup W] [--steps K]
//   MODEL   resnet50 (ImageNet stem, [B, 3, S, S]) or vit (6 layers, hidden 192, 3 heads,
//           MLP 768, patch 8, class token)
//   splits  0: the plain model; N >= 1: the trunk cut into N segments, all but the last
//           checkpointed (1 checkpoints nothing)
//   cut     count: PyTorch's checkpoint_sequential cut (equal block counts, the last segment
//           takes the rest); activation: the trainer's cut (balanced measured activation bytes)
//
// A step is zero_grad (gradients kept allocated, zeroed) -> forward -> cross-entropy ->
// backward: the optimizer is left out, so the recompute's share of the step is not diluted.
// Timing: warm-up steps, then timed steps (wall clock and process CPU time). Memory: one
// more step measured with the counting CPU allocator (largo/core/memory_tracker.h, installed
// at start-up, as the trainer's activation-byte probe needs it too; its bookkeeping is a
// lock and a hash-map update per allocation, a few thousand per step): the peak bytes
// allocated during the step above those live before it, i.e. the activations autograd
// holds plus the step's temporaries (not the gradients, which stay allocated).
// Prints one JSON line.
#include <largo/core/malloc_tuning.h>
#include <largo/core/memory_tracker.h>
#include <largo/models/model_factory.h>
#include <largo/models/parameter_count.h>
#include <largo/parallel/activation_checkpointing/activation_checkpoint.h>
#include <largo/parallel/activation_checkpointing/checkpointed_trunk.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model;
  int64_t splits = 0;
  std::string cut = "count";
  int64_t batch = 0; // 0: the model's default below
  int64_t image = 0;
  int threads = 2;
  int warmup_steps = 1;
  int steps = 2;
};

BenchOptions parse(int argc, char** argv) {
  if (argc < 2) {
    throw std::invalid_argument(
        "usage: activation_checkpoint_bench resnet50|vit --splits N [--cut count|activation] "
        "[--batch B] [--image S] [--threads T] [--warmup W] [--steps K]");
  }
  BenchOptions options;
  options.model = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      throw std::invalid_argument(flag + " needs a value");
    }
    const std::string value = argv[++i];
    if (flag == "--splits") {
      options.splits = std::stoll(value);
    } else if (flag == "--cut") {
      options.cut = value;
    } else if (flag == "--batch") {
      options.batch = std::stoll(value);
    } else if (flag == "--image") {
      options.image = std::stoll(value);
    } else if (flag == "--threads") {
      options.threads = std::stoi(value);
    } else if (flag == "--warmup") {
      options.warmup_steps = std::stoi(value);
    } else if (flag == "--steps") {
      options.steps = std::stoi(value);
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  if (options.cut != "count" && options.cut != "activation") {
    throw std::invalid_argument("--cut must be count or activation, not " + options.cut);
  }
  // Keep in sync with DEFAULTS in activation_checkpoint_reference.py. The activations must
  // outweigh what does not grow with the batch: ResNet-50's backward allocates ~85 MB of
  // weight-sized temporaries in its last stage (oneDNN), so at 64x64 x 8 (56 MB of
  // activations) checkpointing could not save much; at 112x112 x 8 they are 173 MB. A step
  // then takes a few seconds on the 2-core dev machine (whose libtorch does matrix products
  // with a generic BLAS, so the ViT stays small).
  const bool resnet = options.model == "resnet50";
  if (options.batch == 0) {
    options.batch = 8;
  }
  if (options.image == 0) {
    options.image = resnet ? 112 : 48;
  }
  return options;
}

} // namespace

int main(int argc, char** argv) try {
  largo::tune_malloc_for_tensors(); // as the trainer does
  largo::install_cpu_memory_counter();
  const BenchOptions options = parse(argc, argv);
  torch::set_num_threads(options.threads);
  torch::manual_seed(0);

  largo::models::ModelOptions model_options;
  if (options.model == "resnet50") {
    model_options.trunk_name = "resnet";
    model_options.resnet.depth = 50;
    model_options.resnet.stem = "imagenet";
  } else if (options.model == "vit") {
    model_options.trunk_name = "vision_transformer";
    model_options.vit.patch_size = 8;
    model_options.vit.num_layers = 6;
    model_options.vit.num_heads = 3;
    model_options.vit.hidden_dim = 192;
    model_options.vit.mlp_dim = 768;
  } else {
    throw std::invalid_argument("unknown model " + options.model + "; use resnet50 or vit");
  }
  model_options.in_channels = 3;
  model_options.image_size = options.image;
  model_options.num_classes = 10;

  at::Tensor images = torch::randn({options.batch, 3, options.image, options.image});
  at::Tensor labels = torch::randint(0, 10, {options.batch}, torch::kLong);
  largo::models::TrunkHeadModel model = largo::models::build_model(model_options);
  model->train();

  std::optional<largo::parallel::CheckpointedTrunk> trunk;
  if (options.splits > 0) {
    const std::vector<int64_t> sample_shape{3, options.image, options.image};
    largo::parallel::TrunkCheckpointingOptions plan_options(options.splits);
    plan_options.cost(
        options.cut == "count" ? largo::parallel::SegmentCost::kBlockCount
                               : largo::parallel::SegmentCost::kActivationBytes);
    trunk = largo::parallel::CheckpointedTrunk::plan(model, plan_options, sample_shape);
  }

  float last_loss = 0.0f;
  auto one_step = [&] {
    model->zero_grad(/*set_to_none=*/false);
    at::Tensor logits = trunk ? trunk->forward(images) : model->forward(images);
    at::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
    last_loss = loss.item<float>();
    loss.backward();
  };

  for (int i = 0; i < options.warmup_steps; ++i) {
    one_step(); // first-touch allocations, oneDNN primitives, the gradients
  }
  const auto start = Clock::now();
  const std::clock_t cpu_start = std::clock(); // CPU time of all threads of the process
  for (int i = 0; i < options.steps; ++i) {
    one_step();
  }
  const double ms_per_step =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count() / options.steps;
  const double cpu_ms_per_step =
      1000.0 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / options.steps;

  largo::MemoryTracker tracker(torch::kCPU);
  tracker.start_window();
  one_step();
  const int64_t peak_activation_bytes = tracker.window_peak_bytes();

  nlohmann::json result = {
      {"impl", options.cut == "count" ? "largo" : "largo_balanced"},
      {"model", options.model},
      {"splits", options.splits},
      {"batch", options.batch},
      {"image", options.image},
      {"threads", options.threads},
      {"steps", options.steps},
      {"num_parameters", largo::models::count_parameters(*model)},
      {"num_blocks", model->num_trunk_blocks()},
      {"boundaries", trunk ? trunk->boundaries() : std::vector<int64_t>{}},
      {"peak_activation_bytes", peak_activation_bytes},
      {"ms_per_step", ms_per_step},
      {"cpu_ms_per_step", cpu_ms_per_step},
      {"loss", last_loss}};
  std::cout << result.dump() << std::endl;
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "activation_checkpoint_bench: %s\n", error.what());
  return 1;
}
