#include <largo/parallel/pipeline_mesh.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace largo::parallel {

std::string PipelineMesh::describe() const {
  const int world = pipeline_size * data_parallel_size;
  return fmt::format(
      "world {} = pipeline {} x data parallel {} (world rank = stage * {} + "
      "replica); this rank {}: stage {}, replica {}",
      world,
      pipeline_size,
      data_parallel_size,
      data_parallel_size,
      stage * data_parallel_size + replica,
      stage,
      replica);
}

int num_replicas(int world_size, int pipeline_size) {
  return world_size / std::max(pipeline_size, 1);
}

int replica_of(int world_rank, int world_size, int pipeline_size) {
  return world_rank % std::max(num_replicas(world_size, pipeline_size), 1);
}

PipelineMesh make_pipeline_mesh(comm::ProcessGroup& world, int pipeline_size) {
  const int world_size = world.world_size();
  if (pipeline_size < 1 || world_size % pipeline_size != 0) {
    throw ConfigError(fmt::format(
        "DISTRIBUTED.PIPELINE_SIZE = {} with {} ranks: the pipeline size must be >= 1 and divide "
        "the number of ranks (nnodes x nproc_per_node), which it splits into pipeline size x "
        "data-parallel replicas",
        pipeline_size,
        world_size));
  }
  PipelineMesh mesh;
  mesh.pipeline_size = pipeline_size;
  mesh.data_parallel_size = world_size / pipeline_size;
  const int D = mesh.data_parallel_size;
  mesh.stage = world.rank() / D;
  mesh.replica = replica_of(world.rank(), world_size, pipeline_size);
  // Every rank creates every group, in the same order (new_group's contract).
  for (int replica = 0; replica < D; ++replica) {
    std::vector<int> ranks;
    for (int stage = 0; stage < pipeline_size; ++stage) {
      ranks.push_back(stage * D + replica);
    }
    if (auto group = world.new_group(ranks)) {
      mesh.pipeline = group;
    }
  }
  for (int stage = 0; stage < pipeline_size; ++stage) {
    std::vector<int> ranks;
    for (int replica = 0; replica < D; ++replica) {
      ranks.push_back(stage * D + replica);
    }
    if (auto group = world.new_group(ranks)) {
      mesh.data_parallel = group;
    }
  }
  return mesh;
}

} // namespace largo::parallel
