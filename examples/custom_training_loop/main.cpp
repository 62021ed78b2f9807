// A libtorch user's own model and training loop, trained in parallel by Largo:
//   largo launch --nproc_per_node 2 -- ./custom_training_loop ddp|zero2|fsdp|pipeline
// bfloat16 autocast and activation checkpointing of every block (of every stage with a
// pipeline: 2 stages, each step's batch in 4 micro-batches). Tensor parallelism on a device
// mesh is examples/device_mesh_loop.
#include <largo/comm/process_group.h>
#include <largo/optim/adamw.h>
#include <largo/optim/param_groups.h>
#include <largo/parallel/parallelize.h>

#include <torch/torch.h>

#include <cstdio>
#include <string>

namespace parallel = largo::parallel;

// The user's model: residual blocks in a Sequential (where Largo picks FSDP units and
// checkpointed modules), an embedding and a head called directly.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : fc1(register_module("fc1", torch::nn::Linear(64, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 64))) {}
  torch::Tensor forward(torch::Tensor x) {
    return x + fc2(torch::gelu(fc1(x)));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl()
      : embed(register_module("embed", torch::nn::Linear(32, 64))),
        blocks(register_module("blocks", torch::nn::Sequential(Block(), Block(), Block()))),
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
  } else {
    options.activation_checkpointing.modules = parallel::WrapPolicy::of_type<BlockImpl>("Block");
  }
  largo::precision::PrecisionPolicyOptions amp;
  amp.use_amp = true;
  amp.amp_type = "pytorch";
  amp.dtype = "bfloat16";
  options.precision = largo::precision::resolve_precision_policy(amp);

  torch::manual_seed(0); // every rank draws the same weights
  Net net;
  auto groups = largo::optim::build_param_groups(*net, {.lr = 3e-3}); // by name: ZeRO shards it

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
  // Given the world, the mesh is built for the options (pp(2) x dp(world / 2) for the pipeline).
  auto model = parallel::parallelize(std::move(input), groups, adamw, world, options);

  // The task: labels from a fixed random linear teacher; each replica draws its own samples
  // (a pipeline's stages draw the same ones).
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
        "%s: %s\nloss %.4f -> %.4f (mean of the first and last 5 steps, rank 0)\n",
        mode.c_str(),
        model->describe().c_str(),
        first,
        last);
  }
  return 0;
}
