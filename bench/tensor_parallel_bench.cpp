// Tensor parallelism's memory and speed, Largo's side: a ViT (default ViT-S/16: 12 layers,
// hidden 384, 6 heads, MLP 1536, 224x224 images, 1000 classes) trained with AdamW in one
// process and split over the ranks of a tensor-parallel group
// (parallel::apply_tensor_parallel, with --sequence-parallel 1 sequence parallelism too), Gloo
// over 127.0.0.1. bench/run_tensor_parallel_bench.sh runs it at world sizes 1 and 2 (with and
// without sequence parallelism) and prints the ratios.
//
// Per rank, after W untimed and S timed steps (zero_grad -> forward -> cross-entropy ->
// backward -> step, the same batch on every rank: tensor parallelism splits the model, not
// the data):
//   model state (parallel::measure_model_state_bytes, after the last step, before zero_grad):
//     parameters, gradients, AdamW's state;
//   activation memory: the CPU allocator's peak during the last forward and backward, above
//     what was live when the forward began (the model state), minus the gradients that
//     backward allocates: the saved activations and the temporaries at the peak;
//   time per step (median of S) and images/s.
// Rank 0 prints one JSON line.
//
// Usage: tensor_parallel_bench [--layers N] [--hidden N] [--heads N] [--mlp N] [--image N]
//                              [--patch N] [--classes N] [--batch N] [--warmup W] [--steps S]
//                              [--threads T] [--sequence-parallel 0|1]
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set for more than one rank.)
#include <largo/comm/process_group.h>
#include <largo/comm/world_info.h>
#include <largo/core/malloc_tuning.h>
#include <largo/core/memory_tracker.h>
#include <largo/models/trunk_head_model.h>
#include <largo/models/vit.h>
#include <largo/optim/adamw.h>
#include <largo/parallel/estimate/memory_estimate.h>
#include <largo/parallel/tensor_parallel/tensor_parallel_plan.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  largo::models::VitOptions vit;
  int64_t image = 224;
  int64_t classes = 1000;
  int64_t batch = 8;
  int warmup = 1;
  int steps = 3;
  int threads = 1;
  bool sequence_parallel = false;
};

BenchOptions parse(int argc, char** argv) {
  BenchOptions o;
  o.vit.num_layers = 12;
  o.vit.hidden_dim = 384;
  o.vit.num_heads = 6;
  o.vit.mlp_dim = 1536;
  o.vit.patch_size = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t value = std::stoll(argv[i + 1]);
    if (flag == "--layers") {
      o.vit.num_layers = value;
    } else if (flag == "--hidden") {
      o.vit.hidden_dim = value;
    } else if (flag == "--heads") {
      o.vit.num_heads = value;
    } else if (flag == "--mlp") {
      o.vit.mlp_dim = value;
    } else if (flag == "--image") {
      o.image = value;
    } else if (flag == "--patch") {
      o.vit.patch_size = value;
    } else if (flag == "--classes") {
      o.classes = value;
    } else if (flag == "--batch") {
      o.batch = value;
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(value);
    } else if (flag == "--steps") {
      o.steps = static_cast<int>(value);
    } else if (flag == "--threads") {
      o.threads = static_cast<int>(value);
    } else if (flag == "--sequence-parallel") {
      o.sequence_parallel = value != 0;
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  if (argc % 2 == 0) {
    throw std::invalid_argument(std::string("flag ") + argv[argc - 1] + " has no value");
  }
  if (o.steps < 1 || o.warmup < 0) {
    throw std::invalid_argument("--steps must be >= 1 and --warmup >= 0");
  }
  o.vit.image_size = o.image;
  return o;
}

std::shared_ptr<largo::comm::ProcessGroup> make_group() {
  const auto world = largo::comm::world_from_environment();
  if (!world || world->world_size == 1) {
    return largo::comm::ProcessGroup::single_process();
  }
  largo::comm::ProcessGroupOptions options;
  options.rank = world->rank;
  options.world_size = world->world_size;
  options.master_addr = world->master_addr;
  options.master_port = world->master_port;
  options.gloo_threads = 1;
  return largo::comm::ProcessGroup::create(options);
}

nlohmann::json run(const BenchOptions& o, const std::shared_ptr<largo::comm::ProcessGroup>& group) {
  const torch::Device cpu(torch::kCPU);
  largo::MemoryTracker memory(cpu);
  torch::manual_seed(0); // every rank builds the same full model, then keeps its shards
  largo::models::Trunk trunk = largo::models::build_vit_trunk(o.vit, 3, o.image);
  const int64_t features = trunk.output_dim;
  largo::models::TrunkHeadModel model(
      std::move(trunk), torch::nn::Sequential(torch::nn::Linear(features, o.classes)));
  const int64_t full_parameters = [&] {
    int64_t count = 0;
    for (const auto& p : model->parameters()) {
      count += p.numel();
    }
    return count;
  }();
  if (group->world_size() > 1) {
    largo::parallel::TensorParallelPlanOptions plan;
    plan.sequence_parallel = o.sequence_parallel;
    largo::parallel::apply_tensor_parallel(*model, group, plan);
  }
  largo::optim::ParamGroup params;
  params.params = model->parameters();
  params.lr = 1e-4;
  params.weight_decay = 0.05;
  largo::optim::AdamW optimizer({params});

  torch::manual_seed(1); // the same batch on every rank
  const at::Tensor images = torch::randn({o.batch, 3, o.image, o.image});
  const at::Tensor labels = torch::randint(o.classes, {o.batch});
  std::vector<double> step_ms;
  int64_t activation_peak_bytes = 0;
  largo::parallel::ModelStateBytes state;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    optimizer.zero_grad();
    group->barrier();
    const auto start = Clock::now();
    memory.start_window();
    const at::Tensor loss = torch::cross_entropy_loss(model->forward(images), labels);
    loss.backward();
    activation_peak_bytes = memory.window_peak_bytes();
    optimizer.step();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (step >= o.warmup) {
      step_ms.push_back(ms);
    }
  }
  state = largo::parallel::measure_model_state_bytes(*model, optimizer);
  std::sort(step_ms.begin(), step_ms.end());
  const double median_ms = step_ms[step_ms.size() / 2];
  return {
      {"world_size", group->world_size()},
      {"sequence_parallel", o.sequence_parallel && group->world_size() > 1},
      {"full_parameters", full_parameters},
      {"parameter_bytes", state.parameters},
      {"gradient_bytes", state.gradients},
      {"optimizer_state_bytes", state.optimizer_state},
      // The backward's peak above the model state, less the gradients it allocated.
      {"activation_bytes", activation_peak_bytes - state.gradients},
      {"median_step_ms", median_ms},
      {"images_per_second", 1000.0 * static_cast<double>(o.batch) / median_ms},
  };
}

} // namespace

int main(int argc, char** argv) {
  try {
    largo::install_cpu_memory_counter(); // before anything to be measured is allocated
    largo::tune_malloc_for_tensors();
    const BenchOptions o = parse(argc, argv);
    torch::set_num_threads(o.threads);
    const auto group = make_group();
    const nlohmann::json result = run(o, group);
    if (group->rank() == 0) {
      std::cout << result.dump() << std::endl;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "tensor_parallel_bench: " << e.what() << "\n";
    return 1;
  }
}
