// ZeRO stages 0-3 on a wide MLP (>= 50 M parameters), Largo's side: one process per rank
// (bench/run_zero_bench.sh starts them with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set),
// Gloo over 127.0.0.1. bench/zero_reference.py runs the same model, batch and optimizer
// with PyTorch's DDP and ZeroRedundancyOptimizer.
//
// Usage: zero_bench [--stages 0,1,2,3] [--optimizer adamw|sgd] [--input N] [--width N]
//                   [--depth N] [--classes N] [--batch N] [--warmup W] [--steps S]
//                   [--threads T] [--stage3_prefetch on,off]
//                   [--stage3_compute float32,bfloat16]
// For each stage: a fresh model (same seed), DDP + the optimizer (0), DDP + ShardedOptimizer
// (1), ShardedDataParallel + ShardedOptimizer (2), FullyShardedDataParallel with every
// (Linear, ReLU) block a unit and the last Linear the root unit (3; once with prefetch and once
// without, as --stage3_prefetch lists; with prefetch also with bfloat16 compute copies of its
// float32 shards, gradients reduced in float32, as --stage3_compute lists); W untimed steps,
// then S timed steps
// (zero_grad -> forward -> cross-entropy -> backward -> step, each a full iteration). After
// the last step, before zero_grad, each rank measures the bytes it holds
// (parallel::measure_model_state_bytes) next to the estimate and the ZeRO formula
// (parallel/estimate/memory_estimate.h). Rank 0 prints one JSON line per stage with its step times
// (median and mean ms) and every rank's measured/estimated bytes.
#include <largo/comm/process_group.h>
#include <largo/comm/world_info.h>
#include <largo/core/malloc_tuning.h>
#include <largo/models/trunk_head_model.h>
#include <largo/optim/optimizer_factory.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/data_parallel/fully_sharded_data_parallel.h>
#include <largo/parallel/data_parallel/sharded_data_parallel.h>
#include <largo/parallel/data_parallel/sharded_optimizer.h>
#include <largo/parallel/estimate/memory_estimate.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;
using largo::parallel::ModelStateBytes;

struct BenchOptions {
  std::vector<int> stages{0, 1, 2, 3};
  std::vector<bool> stage3_prefetch{true, false};
  std::vector<std::string> stage3_compute{"float32", "bfloat16"};
  std::string optimizer = "adamw";
  int64_t input = 1024, width = 4096, depth = 4, classes = 9, batch = 16;
  int warmup = 2, steps = 6, threads = 1;
};

// Keep in sync with zero_reference.py: Linear(input, width), ReLU, (Linear(width, width),
// ReLU) x (depth - 1), Linear(width, classes).
torch::nn::Sequential make_mlp(const BenchOptions& o) {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  net->push_back(torch::nn::Linear(o.input, o.width));
  net->push_back(torch::nn::ReLU());
  for (int64_t i = 1; i < o.depth; ++i) {
    net->push_back(torch::nn::Linear(o.width, o.width));
    net->push_back(torch::nn::ReLU());
  }
  net->push_back(torch::nn::Linear(o.width, o.classes));
  return net;
}

largo::optim::OptimizerSpec optimizer_spec(const BenchOptions& o) {
  largo::optim::OptimizerSpec spec;
  spec.name = o.optimizer;
  spec.sgd.momentum = 0.9;
  return spec;
}

// One group, weight decay 0.01 on everything (as the Python side).
std::vector<largo::optim::ParamGroup> groups_of(const torch::nn::Module& net) {
  largo::optim::ParamGroup group;
  group.name = "all";
  group.lr = 1e-3;
  group.weight_decay = 0.01;
  for (const auto& item : net.named_parameters()) {
    group.params.push_back(item.value());
    group.names.push_back(item.key());
  }
  return {group};
}

nlohmann::json to_json(const ModelStateBytes& bytes) {
  return {{"parameters", bytes.parameters},
          {"gradients", bytes.gradients},
          {"optimizer_state", bytes.optimizer_state},
          {"total", bytes.total()}};
}

// A trunk block of the MLP: Linear then ReLU.
class LinearReluImpl : public torch::nn::Module {
 public:
  explicit LinearReluImpl(torch::nn::Linear linear)
      : linear_(register_module("linear", std::move(linear))) {}
  at::Tensor forward(at::Tensor x) {
    return torch::relu(linear_->forward(x));
  }

 private:
  torch::nn::Linear linear_;
};
TORCH_MODULE(LinearRelu);

// The same MLP (the same Linear modules, so the same weights) as a trunk of (Linear, ReLU)
// blocks and a Linear head: the shape FullyShardedDataParallel cuts into units.
largo::models::TrunkHeadModel as_trunk_and_head(torch::nn::Sequential net, const BenchOptions& o) {
  largo::models::Trunk trunk;
  for (size_t i = 0; i + 1 < net->size(); i += 2) {
    trunk.blocks->push_back(LinearRelu(torch::nn::Linear(net->ptr<torch::nn::LinearImpl>(i))));
  }
  trunk.output_dim = o.width;
  torch::nn::Sequential head;
  head->push_back(torch::nn::Linear(net->ptr<torch::nn::LinearImpl>(net->size() - 1)));
  return largo::models::TrunkHeadModel(std::move(trunk), std::move(head));
}

nlohmann::json run_stage(int stage, bool prefetch, bool bf16_copies, const BenchOptions& o,
                         const std::shared_ptr<largo::comm::ProcessGroup>& group) {
  auto net = make_mlp(o);
  auto groups = groups_of(*net);
  const auto sizes = largo::parallel::parameter_sizes(*net, groups);
  const auto spec = optimizer_spec(o);
  auto make_base = [&](std::vector<largo::optim::ParamGroup> pieces) {
    return largo::optim::make_optimizer(std::move(pieces), spec);
  };
  std::unique_ptr<largo::optim::Optimizer> optimizer;
  std::unique_ptr<largo::parallel::FullyShardedDataParallel> fsdp;
  if (stage == 3) {
    largo::parallel::FullyShardedDataParallelOptions fsdp_options;
    fsdp_options.wrap_policy = largo::parallel::WrapPolicy::elements_of("trunk"); // head in the root
    fsdp_options.prefetch = prefetch;
    if (bf16_copies) {
      fsdp_options.compute_dtype = at::kBFloat16;
      fsdp_options.fp32_reduce_scatter = true; // gradients summed in float32, as Apex O2 does
    }
    fsdp = std::make_unique<largo::parallel::FullyShardedDataParallel>(as_trunk_and_head(net, o),
                                                                       group, fsdp_options);
    optimizer = fsdp->make_optimizer(groups_of(*fsdp->module()), make_base);
  } else if (stage == 0) {
    optimizer = largo::optim::make_optimizer(std::move(groups), spec);
  } else {
    largo::parallel::ShardedOptimizerOptions options;
    options.make_base_optimizer = make_base;
    optimizer = std::make_unique<largo::parallel::ShardedOptimizer>(std::move(groups), group, options);
  }
  std::unique_ptr<largo::parallel::DistributedDataParallel> ddp;
  std::unique_ptr<largo::parallel::ShardedDataParallel> sdp;
  if (fsdp) {
    // reduces its own gradients
  } else if (stage == 2) {
    sdp = std::make_unique<largo::parallel::ShardedDataParallel>(
        net.ptr(), static_cast<largo::parallel::ShardedOptimizer&>(*optimizer), group);
  } else {
    ddp = std::make_unique<largo::parallel::DistributedDataParallel>(net.ptr(), group);
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(100 + group->rank());
  const at::Tensor inputs = at::randn({o.batch, o.input}, generator);
  const at::Tensor labels = at::randint(0, o.classes, {o.batch}, generator);

  std::vector<double> step_ms;
  ModelStateBytes measured;
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    const auto start = Clock::now();
    optimizer->zero_grad();
    at::Tensor logits = fsdp ? fsdp->forward(inputs)
        : ddp                ? ddp->forward(net, inputs)
                             : sdp->forward(net, inputs);
    torch::nn::functional::cross_entropy(logits.to(at::kFloat), labels).backward();
    optimizer->step();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (step >= o.warmup) {
      step_ms.push_back(ms);
    }
    if (step + 1 == o.warmup + o.steps) { // untimed: measured before the next zero_grad
      measured = fsdp ? largo::parallel::measure_model_state_bytes(*fsdp, *optimizer)
                      : largo::parallel::measure_model_state_bytes(*net, *optimizer);
    }
  }

  largo::parallel::MemoryEstimateOptions estimate_options;
  estimate_options.optimizer = spec;
  estimate_options.world_size = group->world_size();
  estimate_options.stage = stage;
  estimate_options.rank = group->rank();
  const auto estimated = largo::parallel::estimate_model_state_bytes(sizes, estimate_options);
  const auto formula = largo::parallel::zero_formula_bytes(sizes, estimate_options);

  // Every rank's bytes to rank 0: [rank][measured 3, estimated 3, formula 3].
  at::Tensor bytes = at::zeros({group->world_size(), 9}, at::kLong);
  const int64_t mine[9] = {measured.parameters, measured.gradients, measured.optimizer_state,
                           estimated.parameters, estimated.gradients, estimated.optimizer_state,
                           formula.parameters, formula.gradients, formula.optimizer_state};
  for (int k = 0; k < 9; ++k) {
    bytes[group->rank()][k] = mine[k];
  }
  group->all_reduce(bytes);
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < group->world_size(); ++r) {
    auto row = bytes[r];
    auto get = [&](int k) { return row[k].item<int64_t>(); };
    ranks.push_back({{"measured", to_json({get(0), get(1), get(2)})},
                     {"estimated", to_json({get(3), get(4), get(5)})},
                     {"formula", to_json({get(6), get(7), get(8)})}});
  }
  std::vector<double> sorted = step_ms;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double ms : step_ms) {
    mean += ms / static_cast<double>(step_ms.size());
  }
  int64_t numel = 0;
  for (const auto& size : sizes) {
    numel += size.numel;
  }
  return {{"impl", "largo"},
          {"stage", stage},
          {"optimizer", o.optimizer},
          {"world_size", group->world_size()},
          {"num_parameters", numel},
          {"batch_per_rank", o.batch},
          {"steps", o.steps},
          {"ms_per_step", sorted[sorted.size() / 2]},
          {"mean_ms_per_step", mean},
          {"step_ms", step_ms},
          {"ranks", ranks},
          // stage 3: whether the next unit's all-gather was prefetched, and the most bytes of
          // full units gathered at once (transient, on top of the model state)
          {"prefetch", stage == 3 && prefetch},
          {"compute_dtype", bf16_copies ? "bfloat16" : "float32"},
          {"peak_gathered_bytes", fsdp ? fsdp->peak_gathered_bytes() : 0}};
}

BenchOptions parse(int argc, char** argv) {
  BenchOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      throw std::invalid_argument(flag + " needs a value");
    }
    const std::string value = argv[++i];
    if (flag == "--stages") {
      o.stages.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) {
        o.stages.push_back(std::stoi(item));
      }
    } else if (flag == "--stage3_prefetch") {
      o.stage3_prefetch.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) {
        if (item != "on" && item != "off") {
          throw std::invalid_argument("--stage3_prefetch takes on, off or on,off, not " + value);
        }
        o.stage3_prefetch.push_back(item == "on");
      }
    } else if (flag == "--stage3_compute") {
      o.stage3_compute.clear();
      std::stringstream items(value);
      for (std::string item; std::getline(items, item, ',');) {
        if (item != "float32" && item != "bfloat16") {
          throw std::invalid_argument("--stage3_compute takes float32, bfloat16 or both, not " +
                                      value);
        }
        o.stage3_compute.push_back(item);
      }
    } else if (flag == "--optimizer") {
      o.optimizer = value;
    } else if (flag == "--input") {
      o.input = std::stoll(value);
    } else if (flag == "--width") {
      o.width = std::stoll(value);
    } else if (flag == "--depth") {
      o.depth = std::stoll(value);
    } else if (flag == "--classes") {
      o.classes = std::stoll(value);
    } else if (flag == "--batch") {
      o.batch = std::stoll(value);
    } else if (flag == "--warmup") {
      o.warmup = std::stoi(value);
    } else if (flag == "--steps") {
      o.steps = std::stoi(value);
    } else if (flag == "--threads") {
      o.threads = std::stoi(value);
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  if (o.optimizer != "adamw" && o.optimizer != "sgd") {
    throw std::invalid_argument("--optimizer must be adamw or sgd, not " + o.optimizer);
  }
  if (o.steps < 1 || o.warmup < 0 || o.depth < 1) {
    throw std::invalid_argument("--steps must be >= 1, --warmup >= 0, --depth >= 1");
  }
  return o;
}

} // namespace

int main(int argc, char** argv) {
  try {
    largo::tune_malloc_for_tensors();
    const BenchOptions o = parse(argc, argv);
    torch::set_num_threads(o.threads);
    const auto world = largo::comm::world_from_environment();
    if (!world) {
      throw std::invalid_argument("set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (run_zero_bench.sh does)");
    }
    largo::comm::ProcessGroupOptions group_options;
    group_options.rank = world->rank;
    group_options.world_size = world->world_size;
    group_options.master_addr = world->master_addr;
    group_options.master_port = world->master_port;
    group_options.gloo_threads = 1;
    auto group = largo::comm::ProcessGroup::create(group_options);
    for (int stage : o.stages) {
      for (bool prefetch : stage == 3 ? o.stage3_prefetch : std::vector<bool>{false}) {
        for (const std::string& compute :
             stage == 3 ? o.stage3_compute : std::vector<std::string>{"float32"}) {
          const bool bf16_copies = compute == "bfloat16";
          if (bf16_copies && !prefetch) {
            continue; // the copies are compared with prefetch only
          }
          nlohmann::json result = run_stage(stage, prefetch, bf16_copies, o, group);
          if (world->rank == 0) {
            std::cout << result.dump() << std::endl;
          }
        }
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "zero_bench: " << e.what() << "\n";
    return 1;
  }
}
