// Data-parallel training throughput of Largo's DistributedDataParallel on the CPU (Gloo).
// Started alone it trains the whole global batch in one process (no DDP); started by a
// launcher (largo launch sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT) each of the
// WORLD_SIZE ranks trains its slice of the same global batch under DDP. One fixed in-memory
// global batch (no data loading), the trainer's step: zero_grad -> forward (DDP: buffers
// broadcast) -> cross-entropy -> loss.item() -> backward (DDP: bucketed all-reduce) -> SGD
// step. bench/ddp_throughput_reference.py does the same with PyTorch DDP;
// bench/run_ddp_bench.sh runs both side by side.
//
// Usage: ddp_throughput_bench MODEL [--batch GLOBAL] [--threads T] [--warmup W] [--steps S]
//                             [--delay_allreduce] [--bucket_cap_mb M] [--foreach]
//   --foreach: SGD's _foreach path (torch.optim's ops in its order) instead of the fused
//              pass, which rounds differently: for a bit-exact check against PyTorch.
//   MODEL: small_cnn ([N, 1, 28, 28], the default job's model) or resnet18 (cifar stem,
//          [N, 3, 32, 32]).
// Rank 0 prints one JSON line: impl, model, procs, batch (global), threads, steps,
// ms_per_step, images_per_sec (global batch / step time), final_loss (rank 0's).
#include <largo/comm/process_group.h>
#include <largo/comm/world_info.h>
#include <largo/core/malloc_tuning.h>
#include <largo/models/model_factory.h>
#include <largo/models/parameter_count.h>
#include <largo/optim/param_groups.h>
#include <largo/optim/sgd.h>
#include <largo/parallel/data_parallel/distributed_data_parallel.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model = "small_cnn";
  int64_t batch = 0; // global; 0: the model's default below
  int threads = 1;
  int warmup_steps = 0;
  int steps = 0;
  bool delay_allreduce = false;
  int64_t bucket_cap_mb = 25;
  bool foreach = false;
};

BenchOptions parse(int argc, char** argv) {
  BenchOptions options;
  if (argc < 2) {
    throw std::invalid_argument("usage: ddp_throughput_bench small_cnn|resnet18 [--batch GLOBAL] "
                                "[--threads T] [--warmup W] [--steps S] [--delay_allreduce] "
                                "[--bucket_cap_mb M] [--foreach]");
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
    } else if (flag == "--delay_allreduce") {
      options.delay_allreduce = true;
    } else if (flag == "--bucket_cap_mb") {
      options.bucket_cap_mb = value();
    } else if (flag == "--foreach") {
      options.foreach = true;
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  // Keep in sync with DEFAULTS in ddp_throughput_reference.py: a few seconds per run on the
  // 2-core dev machine.
  const bool small = options.model == "small_cnn";
  if (options.batch == 0) {
    options.batch = small ? 128 : 32;
  }
  if (options.warmup_steps == 0) {
    options.warmup_steps = small ? 10 : 2;
  }
  if (options.steps == 0) {
    options.steps = small ? 60 : 6;
  }
  return options;
}

} // namespace

int main(int argc, char** argv) try {
  largo::tune_malloc_for_tensors(); // as the trainer and the `largo` program do
  const BenchOptions options = parse(argc, argv);
  torch::set_num_threads(options.threads);

  // The job: launched (DDP over the ranks) or alone.
  const auto world = largo::comm::world_from_environment();
  std::shared_ptr<largo::comm::ProcessGroup> group = largo::comm::ProcessGroup::single_process();
  if (world && world->world_size > 1) {
    largo::comm::ProcessGroupOptions group_options;
    group_options.rank = world->rank;
    group_options.world_size = world->world_size;
    group_options.master_addr = world->master_addr;
    group_options.master_port = world->master_port;
    group_options.rendezvous_timeout = std::chrono::seconds(120);
    group = largo::comm::ProcessGroup::create(group_options);
  }
  const int rank = group->rank();
  const int procs = group->world_size();
  if (options.batch % procs != 0) {
    throw std::invalid_argument("the global batch must divide by the number of processes");
  }
  const int64_t batch_per_rank = options.batch / procs;

  largo::models::ModelOptions model_options;
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

  // The whole global batch is drawn on every rank (same seed and order as the reference),
  // then each rank keeps its slice; the weights come next from the same generator.
  torch::manual_seed(0);
  at::Tensor all_images = torch::randn({options.batch, model_options.in_channels,
                                        model_options.image_size, model_options.image_size});
  at::Tensor all_labels = torch::randint(0, 10, {options.batch}, torch::kLong);
  at::Tensor images = all_images.narrow(0, rank * batch_per_rank, batch_per_rank).contiguous();
  at::Tensor labels = all_labels.narrow(0, rank * batch_per_rank, batch_per_rank).contiguous();
  largo::models::TrunkHeadModel model = largo::models::build_model(model_options);
  model->train();

  std::optional<largo::parallel::DistributedDataParallel> ddp;
  if (procs > 1) {
    largo::parallel::DistributedDataParallelOptions ddp_options;
    ddp_options.bucket_cap_bytes = options.bucket_cap_mb * 1024 * 1024;
    ddp_options.delay_allreduce = options.delay_allreduce;
    ddp.emplace(model.ptr(), group, ddp_options);
  }

  // The default job's optimizer (as in train_throughput_bench.cpp).
  largo::optim::ParamGroupOptions group_options;
  group_options.lr = 0.05;
  group_options.weight_decay = 5e-4;
  largo::optim::SGDOptions sgd_options;
  sgd_options.momentum = 0.9;
  sgd_options.nesterov = true;
  sgd_options.fused = !options.foreach;
  largo::optim::SGD optimizer(largo::optim::build_param_groups(*model, group_options), sgd_options);

  float last_loss = 0.0f;
  auto one_step = [&] {
    optimizer.zero_grad();
    at::Tensor logits = ddp ? ddp->forward(model, images) : model->forward(images);
    at::Tensor loss = torch::nn::functional::cross_entropy(logits, labels);
    last_loss = loss.item<float>();
    loss.backward(); // DDP: gradients averaged over the ranks when this returns
    optimizer.step();
  };
  for (int i = 0; i < options.warmup_steps; ++i) {
    one_step();
  }
  group->barrier();
  const auto start = Clock::now();
  for (int i = 0; i < options.steps; ++i) {
    one_step();
  }
  group->barrier();
  const double ms_per_step =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count() / options.steps;

  if (rank == 0) {
    std::string impl = procs == 1 ? "largo" : options.delay_allreduce ? "largo_ddp_delay" : "largo_ddp";
    if (options.foreach) {
      impl += "_foreach";
    }
    nlohmann::json result = {{"impl", impl},
                             {"model", options.model},
                             {"procs", procs},
                             {"batch", options.batch},
                             {"threads", options.threads},
                             {"steps", options.steps},
                             {"num_parameters", largo::models::count_parameters(*model)},
                             {"ms_per_step", ms_per_step},
                             {"images_per_sec", options.batch * 1000.0 / ms_per_step},
                             {"final_loss", last_loss}};
    std::cout << result.dump() << std::endl;
  }
  return 0;
} catch (const std::exception& error) {
  std::fprintf(stderr, "ddp_throughput_bench: %s\n", error.what());
  return 1;
}
