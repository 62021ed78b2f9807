// Pipeline parallelism on the CPU (Gloo): bubble, activation memory and throughput.
//
// Started alone it trains the whole global batch in one process (`plain`); started by a
// launcher (largo launch sets RANK / WORLD_SIZE / MASTER_*), `plain` is DDP over the ranks and
// `pipeline` cuts the model into --pipeline stages (the rest of the world, if any, data
// parallel). One fixed in-memory global batch, SGD with momentum; a step is zero_grad (kept
// allocated, so the memory window sees activations, not gradients) -> forward/backward ->
// gradient reduction -> step.
//
// Measured per rank over the timed steps (medians): ms per step; the idle fraction of the
// pipeline's schedule, 1 - (time in forward/backward passes) / (time of forward_backward's
// schedule); the peak bytes allocated during one forward_backward above what was live
// before it (core/memory_tracker.h: activations, received messages, temporaries such as a
// layer's weight-gradient before it is added into .grad); the bytes of parameters, gradients
// and momentum the rank holds. Printed by
// rank 0 as one JSON line, with the closed-form bubble and the simulated one
// (pipeline_simulation.h, unit pass costs; zb_h1 with F = I = W).
//
// `passes` (one process) times one stage's passes instead — the second half of the model's
// blocks on one micro-batch (batch / microbatches rows): forward F, full backward B, and
// zb_h1's input pass I and weight pass W — the costs that decide whether zb_h1 pays: per
// step it shortens the bubble from (S-1)(F+B) to (S-1)(F+I-W) (pipeline_simulation.h), a
// gain of (S-1)(B-I+W), and adds M(I+W-B) of compute (the split's overhead).
//
// `timelines` prints each schedule's simulated timeline for --pipeline and --microbatches
// (interleaved with --virtual, default 2), with unit pass costs: docs/pipeline.md's diagrams.
//
// Usage: pipeline_bench timelines - [--pipeline P] [--microbatches M] [--virtual V]
//        pipeline_bench plain|pipeline|passes mlp|vit [--schedule
//        gpipe|1f1b|interleaved_1f1b|zb_h1]
//          [--microbatches M] [--virtual V] [--pipeline P] [--batch B] [--steps N]
//          [--warmup W] [--checkpoint]
#include <largo/comm/process_group.h>
#include <largo/comm/world_info.h>
#include <largo/core/malloc_tuning.h>
#include <largo/core/memory_tracker.h>
#include <largo/models/model_factory.h>
#include <largo/models/parameter_count.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>
#include <largo/parallel/mesh/device_mesh.h>
#include <largo/parallel/pipeline/pipeline_parallel.h>
#include <largo/parallel/pipeline/pipeline_simulation.h>
#include <largo/parallel/pipeline/pipeline_split_backward.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;
using namespace largo;

struct BenchOptions {
  std::string mode = "pipeline"; // plain | pipeline
  std::string model = "mlp";     // mlp | vit
  std::string schedule = "1f1b";
  int microbatches = 8;
  int virtual_stages = 1;
  int pipeline = 2;
  int64_t batch = 64;
  int steps = 5;
  int warmup = 2;
  bool checkpoint = false;
};

BenchOptions parse(int argc, char** argv) {
  if (argc < 3) {
    throw std::invalid_argument(
        "usage: pipeline_bench plain|pipeline mlp|vit [--schedule S] [--microbatches M] "
        "[--virtual V] [--pipeline P] [--batch B] [--steps N] [--warmup W] [--checkpoint]");
  }
  BenchOptions options;
  options.mode = argv[1];
  options.model = argv[2];
  for (int i = 3; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        throw std::invalid_argument(flag + " needs a value");
      }
      return argv[++i];
    };
    if (flag == "--schedule") {
      options.schedule = value();
    } else if (flag == "--microbatches") {
      options.microbatches = std::stoi(value());
    } else if (flag == "--virtual") {
      options.virtual_stages = std::stoi(value());
    } else if (flag == "--pipeline") {
      options.pipeline = std::stoi(value());
    } else if (flag == "--batch") {
      options.batch = std::stoll(value());
    } else if (flag == "--steps") {
      options.steps = std::stoi(value());
    } else if (flag == "--warmup") {
      options.warmup = std::stoi(value());
    } else if (flag == "--checkpoint") {
      options.checkpoint = true;
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  return options;
}

// mlp: 16 blocks of 512 -> 512 on 1 x 22 x 22 inputs (4.2 M parameters, dense compute);
// vit: 32 x 32 images, patch 4 (65 tokens), width 192, 8 layers, 3 heads (ViT-Tiny's layers).
models::ModelOptions make_model_options(const std::string& model) {
  models::ModelOptions options;
  options.num_classes = 10;
  if (model == "mlp") {
    options.trunk_name = "mlp";
    options.in_channels = 1;
    options.image_size = 22;
    options.mlp.hidden_dims.assign(16, 512);
  } else if (model == "vit") {
    options.trunk_name = "vision_transformer";
    options.in_channels = 3;
    options.image_size = 32;
    options.vit.image_size = 32;
    options.vit.patch_size = 4;
    options.vit.hidden_dim = 192;
    options.vit.num_layers = 8;
    options.vit.num_heads = 3;
    options.vit.mlp_dim = 768;
  } else {
    throw std::invalid_argument("unknown model " + model + "; use mlp or vit");
  }
  return options;
}

std::shared_ptr<comm::ProcessGroup> join_world() {
  const auto world = comm::world_from_environment();
  if (!world || world->world_size == 1) {
    return comm::ProcessGroup::single_process();
  }
  comm::ProcessGroupOptions options;
  options.rank = world->rank;
  options.world_size = world->world_size;
  options.master_addr = world->master_addr;
  options.master_port = world->master_port;
  options.rendezvous_timeout = std::chrono::seconds(120);
  options.gloo_threads = 1;
  return comm::ProcessGroup::create(options);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0.0 : values[values.size() / 2];
}

// What one rank measured.
struct RankFigures {
  double ms_per_step = 0.0;
  double idle_fraction = 0.0;
  double peak_activation_bytes = 0.0;
  double final_loss = 0.0;
  double model_state_bytes = 0.0; // parameters + gradients + SGD momentum held by the rank
};

// Median milliseconds of F, B, I and W of the second half of the blocks (a last stage that
// sends its input's gradient back) on one micro-batch.
nlohmann::json
time_passes(models::TrunkHeadModel& model, const at::Tensor& images, const BenchOptions& options) {
  auto blocks = parallel::pipeline_blocks(*model);
  const auto half = static_cast<std::ptrdiff_t>(blocks.size() / 2);
  parallel::PipelineStage first(
      std::vector<parallel::PipelineBlock>(blocks.begin(), blocks.begin() + half));
  blocks.erase(blocks.begin(), blocks.begin() + half);
  parallel::PipelineStage stage(blocks);
  const at::Tensor input =
      first->forward(images.narrow(0, 0, options.batch / options.microbatches)).detach();
  std::vector<double> f, b, i, w;
  auto ms_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  for (int rep = 0; rep < options.warmup + options.steps; ++rep) {
    for (bool split : {false, true}) {
      at::Tensor x = input.clone().requires_grad_(true);
      auto start = Clock::now();
      at::Tensor y = stage->forward(x);
      const double forward_ms = ms_since(start);
      at::Tensor seed = at::ones_like(y);
      start = Clock::now();
      if (!split) {
        y.backward(seed);
        if (rep >= options.warmup) {
          f.push_back(forward_ms);
          b.push_back(ms_since(start));
        }
        continue;
      }
      at::Tensor input_grad;
      auto backward =
          parallel::SplitBackward::input_pass(y, seed, x, stage->parameters(), input_grad);
      const double input_ms = ms_since(start);
      start = Clock::now();
      backward.weight_pass();
      if (rep >= options.warmup) {
        i.push_back(input_ms);
        w.push_back(ms_since(start));
      }
    }
  }
  return {
      {"mode", "passes"},
      {"model", options.model},
      {"microbatch_rows", input.size(0)},
      {"stage_blocks", blocks.size()},
      {"forward_ms", median(f)},
      {"backward_ms", median(b)},
      {"input_ms", median(i)},
      {"weight_ms", median(w)}};
}

// Every schedule's simulated timeline (unit costs), as docs/pipeline.md shows them.
void print_timelines(const BenchOptions& options) {
  using parallel::PipelineScheduleKind;
  for (auto kind :
       {PipelineScheduleKind::kGPipe,
        PipelineScheduleKind::kOneFOneB,
        PipelineScheduleKind::kInterleaved1F1B,
        PipelineScheduleKind::kZeroBubbleH1}) {
    const int virtual_stages =
        kind == PipelineScheduleKind::kInterleaved1F1B ? std::max(options.virtual_stages, 2) : 1;
    const parallel::PipelineShape shape{options.pipeline, options.microbatches, virtual_stages};
    const auto simulation =
        parallel::simulate_schedule(parallel::pipeline_schedule(kind, shape), shape);
    std::cout << parallel::to_string(kind) << " (S = " << shape.num_ranks
              << ", M = " << shape.num_microbatches << ", V = " << virtual_stages << "): bubble "
              << simulation.mean_idle_fraction() << ", peak stages in flight";
    for (int peak : simulation.peak_in_flight) {
      std::cout << " " << peak;
    }
    std::cout << "\n" << parallel::render_timeline(simulation, shape) << "\n";
  }
}

} // namespace

int main(int argc, char** argv) try {
  tune_malloc_for_tensors();
  install_cpu_memory_counter();
  const BenchOptions options = parse(argc, argv);
  if (options.mode == "timelines") {
    print_timelines(options);
    return 0;
  }
  torch::set_num_threads(1);
  auto world = join_world();
  const auto model_options = make_model_options(options.model);

  torch::manual_seed(0);
  const int64_t side = model_options.image_size;
  at::Tensor images = torch::randn({options.batch, model_options.in_channels, side, side});
  at::Tensor labels = torch::randint(0, 10, {options.batch}, torch::kLong);
  models::TrunkHeadModel model = models::build_model(model_options);
  const int64_t num_parameters = models::count_parameters(*model);
  auto loss_fn = [](const at::Tensor& output, const at::Tensor& target) {
    return torch::nn::functional::cross_entropy(output, target);
  };

  if (options.mode == "passes") {
    std::cout << time_passes(model, images, options).dump() << std::endl;
    return 0;
  }
  std::unique_ptr<parallel::PipelineParallel> pipeline;
  std::unique_ptr<parallel::DistributedDataParallel> ddp;
  int replicas = world->world_size();
  int replica = world->rank();
  std::shared_ptr<torch::nn::Module> trained = model.ptr();
  if (options.mode == "pipeline") {
    const parallel::DeviceMesh mesh(
        *world,
        parallel::pp_dp_tp_dimensions(
            options.pipeline, world->world_size() / std::max(options.pipeline, 1)));
    replicas = mesh.size("dp");
    replica = mesh.coordinate("dp");
    pipeline = std::make_unique<parallel::PipelineParallel>(
        parallel::pipeline_blocks(*model),
        mesh.group("pp"),
        mesh.group("dp"),
        parallel::PipelineParallelOptions()
            .schedule(parallel::parse_pipeline_schedule(options.schedule))
            .num_microbatches(options.microbatches)
            .virtual_stages(options.virtual_stages)
            .checkpoint_stages(options.checkpoint));
    trained = pipeline->module();
    model = nullptr; // this rank keeps its stages only
  } else if (options.mode != "plain") {
    throw std::invalid_argument("unknown mode " + options.mode + "; use plain or pipeline");
  } else if (world->world_size() > 1) {
    ddp = std::make_unique<parallel::DistributedDataParallel>(trained, world);
  }
  const int64_t local_batch = options.batch / replicas;
  images = images.narrow(0, replica * local_batch, local_batch).contiguous();
  labels = labels.narrow(0, replica * local_batch, local_batch).contiguous();

  optim::ParamGroupOptions group_options;
  group_options.lr = 0.01;
  optim::SGDOptions sgd_options;
  sgd_options.momentum = 0.9;
  optim::SGD optimizer(optim::build_param_groups(*trained, group_options), sgd_options);
  MemoryTracker memory(torch::kCPU);

  RankFigures figures;
  std::vector<double> step_ms, idle;
  for (int step = 0; step < options.warmup + options.steps; ++step) {
    optimizer.zero_grad(/*set_to_none=*/false);
    world->barrier();
    const auto start = Clock::now();
    memory.start_window();
    if (pipeline) {
      figures.final_loss = pipeline->forward_backward(images, labels, loss_fn);
      const auto times = pipeline->last_step_times();
      if (step >= options.warmup) {
        idle.push_back(1.0 - times.busy_seconds / times.step_seconds);
      }
    } else {
      if (ddp) {
        ddp->before_forward();
      }
      at::Tensor loss = loss_fn(trained->as<models::TrunkHeadModelImpl>()->forward(images), labels);
      figures.final_loss = loss.item<double>();
      loss.backward();
    }
    figures.peak_activation_bytes = static_cast<double>(memory.window_peak_bytes());
    if (pipeline) {
      pipeline->reduce_gradients();
    }
    optimizer.step();
    if (step >= options.warmup) {
      step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  }
  figures.ms_per_step = median(step_ms);
  figures.idle_fraction = median(idle);
  for (const auto& parameter : trained->parameters()) {
    figures.model_state_bytes +=
        3.0 * static_cast<double>(parameter.numel() * parameter.element_size());
  }

  // Rank 0 gathers every rank's figures.
  const int ranks = world->world_size();
  constexpr int kFigures = 5;
  at::Tensor mine = at::tensor(
      {figures.ms_per_step,
       figures.idle_fraction,
       figures.peak_activation_bytes,
       figures.final_loss,
       figures.model_state_bytes},
      at::kDouble);
  at::Tensor all = at::zeros({ranks * kFigures}, at::kDouble);
  world->all_gather(all, mine);
  if (world->rank() != 0) {
    return 0;
  }
  auto column = [&](int index) {
    std::vector<double> values;
    for (int r = 0; r < ranks; ++r) {
      values.push_back(all[r * kFigures + index].item<double>());
    }
    return values;
  };
  const auto ms = column(0);
  const double slowest_ms = *std::max_element(ms.begin(), ms.end());
  nlohmann::json result = {
      {"mode", options.mode},
      {"model", options.model},
      {"procs", ranks},
      {"batch", options.batch},
      {"steps", options.steps},
      {"num_parameters", num_parameters},
      {"ms_per_step", slowest_ms},
      {"images_per_sec", options.batch * 1000.0 / slowest_ms},
      {"peak_activation_bytes", column(2)},
      {"model_state_bytes", column(4)},
      {"final_loss", figures.final_loss}};
  if (pipeline) {
    const auto kind = parallel::parse_pipeline_schedule(options.schedule);
    const auto& shape = pipeline->shape();
    const auto simulated =
        parallel::simulate_schedule(parallel::pipeline_schedule(kind, shape), shape);
    result["schedule"] = options.schedule;
    result["pipeline"] = options.pipeline;
    result["microbatches"] = options.microbatches;
    result["virtual_stages"] = options.virtual_stages;
    result["checkpoint"] = options.checkpoint;
    result["idle_fraction"] = column(1);
    result["bubble_formula"] = parallel::bubble_fraction_formula(kind, shape);
    result["bubble_simulated"] = simulated.mean_idle_fraction();
    result["peak_in_flight_simulated"] = simulated.peak_in_flight;
    result["describe"] = pipeline->describe();
  }
  std::cout << result.dump() << std::endl;
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "pipeline_bench: %s\n", error.what());
  return 1;
}
