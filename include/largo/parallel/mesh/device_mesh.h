// The layout of the world's ranks over the parallel dimensions of a run, and the process
// group of each dimension (torchtitan's and PyTorch's DeviceMesh).
//
// Dimensions are named and listed outermost first: "pp" (pipeline stages), "dp" (data-parallel
// replicas), "tp" (tensor-parallel shards); more can be added to the list. Their sizes
// multiply to the world size. Layout: row-major, the last dimension innermost:
//
//   world rank = (pp_index * dp + dp_index) * tp + tp_index
//
// Innermost ranks are consecutive (usually one machine): tensor parallelism exchanges
// activations inside every layer, the heaviest traffic; a stage's replicas all-reduce the
// stage's gradients every step; pipeline stages exchange one micro-batch's activations at a
// boundary, the lightest. With tp = 1 a stage's replicas hold consecutive ranks
// (rank = stage * dp + replica); with pp = tp = 1 the mesh is plain data parallelism.
//
// A dimension's group is the ranks that differ from this rank in that coordinate only,
// numbered by that coordinate (the "pp" group's rank is the stage).
//
// The data a rank reads follows its data coordinate only (DataShard): replicas of "dp" read
// different data; ranks that differ only in "pp" or "tp" read the same batch (a pipeline's
// stages, a layer's tensor-parallel shards). data_shard() is a pure function of the rank and
// the sizes, so the data loaders can be built before any group exists.
//
// Collectives: the constructor, which calls world.new_group for every group of every
// dimension, dimensions in order, groups in order of their first rank; every rank of `world`
// must build the same mesh at the same point of its new_group calls. A dimension of the
// world's size is the world itself (no new_group call), and groups of one rank connect no
// backend, so the mesh of plain data parallelism, pp(1) * dp(N) * tp(1), connects nothing.
#pragma once

#include <largo/comm/process_group.h>

#include <memory>
#include <string>
#include <vector>

namespace largo::parallel {

struct MeshDimension {
  std::string name; // "pp", "dp", "tp"
  int size = 1;
};

// The dimensions of a run: pipeline stages x data-parallel replicas x tensor-parallel shards.
std::vector<MeshDimension> pp_dp_tp_dimensions(int pp, int dp, int tp = 1);

// "pp(2) * dp(2) * tp(1)"
std::string describe_sizes(const std::vector<MeshDimension>& dimensions);

// Throws OptionError (naming "DeviceMesh dimensions", the sizes and the world size) unless
// the names are distinct and not empty, every size is >= 1 and the sizes multiply to
// `world_size`: "pp(3) * dp(1) * tp(1) = 3 != world size (8)".
void check_mesh_dimensions(const std::vector<MeshDimension>& dimensions, int world_size);

// The coordinate of `world_rank` along each dimension (the layout above), and back.
std::vector<int> mesh_coordinates(int world_rank, const std::vector<MeshDimension>& dimensions);
int mesh_rank(const std::vector<int>& coordinates, const std::vector<MeshDimension>& dimensions);

// The world ranks of the group along `dimension` (an index into `dimensions`) that holds
// `world_rank`, numbered by their coordinate along it.
std::vector<int>
mesh_group_ranks(int world_rank, size_t dimension, const std::vector<MeshDimension>& dimensions);

// Which part of the data a rank reads: part `index` of `count` (a sampler's rank and
// num_replicas).
struct DataShard {
  int index = 0;
  int count = 1;
  bool operator==(const DataShard& other) const {
    return index == other.index && count == other.count;
  }
};

// The dimensions whose ranks read different data ("dp"); the others share their batch.
bool is_data_dimension(const std::string& name);

// The data shard of `world_rank`: its coordinates along the data dimensions, flattened
// row-major; {0, 1} without any. Pure: usable before any group exists.
DataShard data_shard(int world_rank, const std::vector<MeshDimension>& dimensions);

class DeviceMesh {
 public:
  // Checks the dimensions (check_mesh_dimensions) and builds every dimension's groups; the
  // mesh keeps `world`. Collective (see the top of this file).
  DeviceMesh(std::shared_ptr<comm::ProcessGroup> world, std::vector<MeshDimension> dimensions);
  // The same over a world the caller keeps alive for as long as the mesh.
  DeviceMesh(comm::ProcessGroup& world, std::vector<MeshDimension> dimensions);

  // This rank's group along dimension `name` (rank = this rank's coordinate there).
  // Throws OptionError for a name the mesh does not have.
  const std::shared_ptr<comm::ProcessGroup>& group(const std::string& name) const;
  int size(const std::string& name) const;
  int coordinate(const std::string& name) const;
  comm::ProcessGroup& world() const {
    return *world_;
  }
  const std::shared_ptr<comm::ProcessGroup>& world_group() const {
    return world_;
  }
  const std::vector<MeshDimension>& dimensions() const {
    return dimensions_;
  }
  // This rank's part of the data (data_shard() of its rank).
  DataShard data_shard() const;

  // "world 4 = pp(2) * dp(2) * tp(1) (world rank = (pp * 2 + dp) * 1 + tp); this rank 3:
  // pp 1, dp 1, tp 0"
  std::string describe() const;

 private:
  size_t index_of(const std::string& name) const;

  std::shared_ptr<comm::ProcessGroup> world_;
  std::vector<MeshDimension> dimensions_;
  std::vector<int> coordinates_;                            // per dimension
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups_; // per dimension
};

} // namespace largo::parallel
