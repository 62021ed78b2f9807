// A libtorch user's own model and training loop, trained in parallel by Largo:
//   largo launch --nproc_per_node 2 -- ./custom_training_loop ddp|zero2|fsdp|pipeline
//   largo launch --nproc_per_node 4 -- ./custom_training_loop tp
// bfloat16 autocast and activation checkpointing of every block (of every stage with a
// pipeline: 2 stages, each step's batch in 4 micro-batches) in the first four modes; tp: a 2-D
// mesh, the blocks' Linear layers split over 2 tensor-parallel ranks, DDP over the replicas.
#include <largo/comm/process_group.h>
#include <largo/optim/adamw.h>
#include <largo/parallel/device_mesh.h>
#include <largo/parallel/parallelize.h>
#include <largo/parallel/tensor_parallel.h>

#include <torch/torch.h>

#include <cstdio>
#include <string>

namespace parallel = largo::parallel;
using Group = std::shared_ptr<largo::comm::ProcessGroup>;

// The user's model: residual blocks in a Sequential (where Largo picks FSDP units and
// checkpointed modules), an embedding and a head called directly. Given a tensor-parallel
// group, a block splits its Linear layers over it (Megatron's column then row), built from
// the full layers every rank draws alike.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const Group& tp) {
    torch::nn::Linear full1(64, 128), full2(128, 64);
    fc1 = tp ? torch::nn::AnyModule(parallel::ColumnParallelLinear(*full1, tp))
             : torch::nn::AnyModule(full1);
    fc2 = tp ? torch::nn::AnyModule(parallel::RowParallelLinear(*full2, tp))
             : torch::nn::AnyModule(full2);
    register_module("fc1", fc1.ptr());
    register_module("fc2", fc2.ptr());
  }
  torch::Tensor forward(torch::Tensor x) {
    return x + fc2.forward(torch::gelu(fc1.forward(x)));
  }
  torch::nn::AnyModule fc1, fc2;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  explicit NetImpl(const Group& tp)
      : embed(register_module("embed", torch::nn::Linear(32, 64))),
        blocks(register_module("blocks", torch::nn::Sequential(Block(tp), Block(tp), Block(tp)))),
        head(register_module("head", torch::nn::Linear(64, 10))) {}
  torch::Tensor forward(torch::Tensor x) { return head(blocks->forward(embed(x))); }
  torch::nn::Linear embed;
  torch::nn::Sequential blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

torch::Tensor cross_entropy(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(output, target);
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ddp";
  auto world = largo::comm::ProcessGroup::from_environment(); // RANK, WORLD_SIZE, MASTER_*
  parallel::ParallelOptions options;
  options.data_parallelism = mode == "fsdp"    ? parallel::DataParallelism::kFsdp
                             : mode == "zero2" ? parallel::DataParallelism::kZero2
                                               : parallel::DataParallelism::kDdp;
  options.fsdp.wrap_policy = parallel::WrapPolicy::of_type<BlockImpl>("Block"); // a unit each
  if (mode == "pipeline") {
    options.pipeline.size = 2;
    options.pipeline.stages.num_microbatches(4).checkpoint_stages(true);
  } else if (mode == "tp") {
    options.tensor_parallel_size = 2;
  } else {
    options.activation_checkpointing.modules = parallel::WrapPolicy::of_type<BlockImpl>("Block");
  }
  if (mode != "tp") { // (autocast with tensor parallelism is not tested yet)
    largo::precision::PrecisionPolicyOptions amp;
    amp.use_amp = true;
    amp.amp_type = "pytorch";
    amp.dtype = "bfloat16";
    options.precision = largo::precision::resolve_precision_policy(amp);
  }
  // The world as pp x dp x tp ("world 4 = pp(1) * dp(2) * tp(2)" for tp at 4 ranks); with
  // tensor parallelism parallelize() runs DDP over its "dp" groups.
  auto mesh = std::make_shared<parallel::DeviceMesh>(
      *world, parallel::mesh_dimensions(options, world->world_size()));
  Group tp = mode == "tp" ? mesh->group("tp") : nullptr;
  if (tp) {
    options.tensor_parallel_group = tp;
    options.mesh = mesh;
  }

  torch::manual_seed(0); // every rank draws the same full weights
  Net net(tp);
  largo::optim::ParamGroup all; // what the optimizer steps, by name (ZeRO and FSDP shard it)
  for (const auto& item : net->named_parameters()) {
    all.params.push_back(item.value());
    all.names.push_back(item.key());
  }
  all.lr = 3e-3;

  // A pipeline cuts the model's chain of blocks, named as the model names them.
  std::vector<parallel::PipelineBlock> blocks{{"embed", torch::nn::AnyModule(net->embed)}};
  for (auto& block : parallel::pipeline_blocks(net->blocks, "blocks")) {
    blocks.push_back(block);
  }
  blocks.push_back({"head", torch::nn::AnyModule(net->head)});
  auto adamw = [](auto groups) { return std::make_unique<largo::optim::AdamW>(std::move(groups)); };
  // One call for every mode: the module, or its blocks for the pipeline to cut into stages.
  parallel::ModelToParallelize input = net;
  if (mode == "pipeline") {
    input = std::move(blocks);
  }
  auto model = parallel::parallelize(std::move(input), {all}, adamw, world, options);

  // The task: labels from a fixed random linear teacher; each replica draws its own samples
  // (a pipeline's stages, and a replica's tensor-parallel ranks, draw the same ones).
  const torch::Tensor teacher = torch::randn({32, 10});
  torch::manual_seed(1 + model->data_parallel_group().rank());
  double first = 0, last = 0;
  const int steps = 40, micro_steps = 2;
  for (int step = 0; step < steps; ++step) {
    model->zero_grad();
    double loss_sum = 0;
    for (int k = 0; k < micro_steps; ++k) { // gradient accumulation
      torch::Tensor x = torch::randn({16, 32});
      torch::Tensor y = x.matmul(teacher).argmax(1);
      auto scope = model->micro_step(/*synchronize=*/k + 1 == micro_steps);
      // forward, loss / micro_steps, backward (a pipeline: its schedule over the micro-batches)
      loss_sum += model->forward_backward(x, y, cross_entropy, micro_steps) / micro_steps;
    }
    if (model->finish_backward()) {
      model->clip_grad_norm(1.0);
    }
    model->step();
    if (step < 5) {
      first += loss_sum / 5;
    } else if (step >= steps - 5) {
      last += loss_sum / 5;
    }
  }
  if (world->rank() == 0) {
    std::printf(
        "%s: %s\n%s\nloss %.4f -> %.4f (mean of the first and last 5 steps, rank 0)\n",
        mode.c_str(),
        mesh->describe().c_str(),
        model->describe().c_str(),
        first,
        last);
  }
  return 0;
}
