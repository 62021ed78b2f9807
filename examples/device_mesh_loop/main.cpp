// The device mesh from a libtorch user's side: the world's ranks laid out as pp x dp x tp, the
// user's own blocks split over the mesh's "tp" group, parallelize() over the mesh:
//   largo launch --nproc_per_node 4 -- ./device_mesh_loop tp_dp   # tp 2 x dp 2 (DDP)
//   largo launch --nproc_per_node 4 -- ./device_mesh_loop tp_pp   # tp 2 x pp 2 (stages)
// Tensor parallelism composes with DDP over "dp" and a pipeline over "pp" (the 3-D mesh: tp_pp
// at 8 ranks is pp 2 x dp 2 x tp 2); with ZeRO or FSDP it is refused (OptionError), not built.
#include <largo/comm/process_group.h>
#include <largo/optim/adamw.h>
#include <largo/optim/param_groups.h>
#include <largo/parallel/mesh/device_mesh.h>
#include <largo/parallel/parallelize.h>
#include <largo/parallel/tensor_parallel/tensor_parallel.h>

#include <torch/torch.h>

#include <cstdio>
#include <string>

namespace parallel = largo::parallel;
using Group = std::shared_ptr<largo::comm::ProcessGroup>;

// Megatron's MLP as a residual block: fc1 split by output features (column-parallel), fc2 by
// input features (row-parallel), so one all-reduce over "tp" in forward and one in backward.
// Each rank slices its part of full layers that every rank draws alike (the same seed).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const Group& tp)
      : fc1(register_module(
            "fc1", parallel::ColumnParallelLinear(*torch::nn::Linear(64, 128), tp))),
        fc2(register_module("fc2", parallel::RowParallelLinear(*torch::nn::Linear(128, 64), tp))) {}
  torch::Tensor forward(torch::Tensor x) {
    return x + fc2(torch::gelu(fc1(x)));
  }
  parallel::ColumnParallelLinear fc1;
  parallel::RowParallelLinear fc2;
};
TORCH_MODULE(Block);

// A Sequential (a pipeline cuts its elements) with the plain forward that parallelize() needs.
struct NetImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) {
    return SequentialImpl::forward(x);
  }
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "tp_dp";
  TORCH_CHECK(mode == "tp_dp" || mode == "tp_pp", "mode: tp_dp or tp_pp, not ", mode);
  auto world = largo::comm::ProcessGroup::from_environment(); // RANK, WORLD_SIZE, MASTER_*
  parallel::ParallelOptions options; // data_parallelism kDdp: over each replica's "dp" group
  options.tensor_parallel_size = 2;
  if (mode == "tp_pp") {
    options.pipeline.size = 2;                   // stages cut by parameter count
    options.pipeline.stages.num_microbatches(4); // the 1f1b schedule
  }
  // tp innermost (consecutive ranks for the heaviest traffic). Collective: makes every group.
  auto mesh = parallel::make_device_mesh(world, options);
  std::printf("rank %d: %s\n", world->rank(), mesh->describe().c_str());

  torch::manual_seed(0); // every rank draws the same full weights, and the same task
  const Group& tp = mesh->group("tp"); // embed, split blocks, head (replicated)
  Net net(torch::nn::Linear(32, 64), Block(tp), Block(tp), torch::nn::Linear(64, 10));
  const torch::Tensor teacher = torch::randn({32, 10}); // labels: a fixed random linear map
  auto groups = largo::optim::build_param_groups(*net, {.lr = 3e-3}); // this rank's shards
  parallel::ModelToParallelize input = net;
  if (options.pipeline.enabled()) { // the blocks a pipeline cuts: net's elements "0".."3"
    const std::shared_ptr<torch::nn::SequentialImpl> chain = net.ptr();
    input = parallel::pipeline_blocks(torch::nn::Sequential(chain));
  }
  auto adamw = [](auto groups) { return std::make_unique<largo::optim::AdamW>(std::move(groups)); };
  // DDP over the mesh's "dp" groups, the pipeline's stages over its "pp".
  auto model = parallel::parallelize(std::move(input), groups, adamw, mesh, options);

  // Each replica draws its own samples; ranks that differ only in tp or pp, the same ones.
  torch::manual_seed(1 + mesh->data_shard().index);
  double first = 0, last = 0;
  const int steps = 40;
  for (int step = 0; step < steps; ++step) {
    torch::Tensor x = torch::randn({16, 32}), y = x.matmul(teacher).argmax(1);
    model->zero_grad();
    const double loss = model->forward_backward(x, y, [](const auto& output, const auto& target) {
      return torch::nn::functional::cross_entropy(output, target);
    });
    if (model->finish_backward()) {
      model->clip_grad_norm(1.0); // the unsharded model's norm
    }
    model->step();
    first += step < 5 ? loss / 5 : 0;
    last += step >= steps - 5 ? loss / 5 : 0;
  }
  if (world->rank() == 0) {
    std::printf("%s: %s\n", mode.c_str(), model->describe().c_str());
    std::printf("loss %.4f -> %.4f (mean of the first and last 5 steps)\n", first, last);
  }
  return 0;
}
