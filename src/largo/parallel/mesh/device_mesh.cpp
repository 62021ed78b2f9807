#include <largo/parallel/mesh/device_mesh.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <set>

namespace largo::parallel {

std::vector<MeshDimension> pp_dp_tp_dimensions(int pp, int dp, int tp) {
  return {{"pp", pp}, {"dp", dp}, {"tp", tp}};
}

std::string describe_sizes(const std::vector<MeshDimension>& dimensions) {
  std::string text;
  for (const auto& dimension : dimensions) {
    text += fmt::format("{}{}({})", text.empty() ? "" : " * ", dimension.name, dimension.size);
  }
  return text;
}

void check_mesh_dimensions(const std::vector<MeshDimension>& dimensions, int world_size) {
  const std::string sizes = describe_sizes(dimensions);
  if (dimensions.empty()) {
    throw OptionError("DeviceMesh dimensions", "(none)", "at least one dimension");
  }
  std::set<std::string> names;
  int64_t product = 1;
  for (const auto& dimension : dimensions) {
    if (dimension.name.empty() || !names.insert(dimension.name).second) {
      throw OptionError("DeviceMesh dimensions", sizes, "distinct, non-empty names");
    }
    if (dimension.size < 1) {
      throw OptionError("DeviceMesh dimensions", sizes, fmt::format("{} >= 1", dimension.name));
    }
    product *= dimension.size;
  }
  if (product != world_size) {
    throw OptionError(
        "DeviceMesh dimensions",
        sizes,
        fmt::format(
            "sizes whose product is the world size: {} = {} != world size ({})",
            sizes,
            product,
            world_size));
  }
}

std::vector<int> mesh_coordinates(int world_rank, const std::vector<MeshDimension>& dimensions) {
  std::vector<int> coordinates(dimensions.size());
  for (size_t i = dimensions.size(); i-- > 0;) { // the last dimension is innermost
    coordinates[i] = world_rank % dimensions[i].size;
    world_rank /= dimensions[i].size;
  }
  return coordinates;
}

int mesh_rank(const std::vector<int>& coordinates, const std::vector<MeshDimension>& dimensions) {
  int rank = 0;
  for (size_t i = 0; i < dimensions.size(); ++i) {
    rank = rank * dimensions[i].size + coordinates.at(i);
  }
  return rank;
}

std::vector<int>
mesh_group_ranks(int world_rank, size_t dimension, const std::vector<MeshDimension>& dimensions) {
  std::vector<int> coordinates = mesh_coordinates(world_rank, dimensions);
  std::vector<int> ranks;
  for (int index = 0; index < dimensions.at(dimension).size; ++index) {
    coordinates[dimension] = index;
    ranks.push_back(mesh_rank(coordinates, dimensions));
  }
  return ranks;
}

bool is_data_dimension(const std::string& name) {
  return name == "dp";
}

DataShard data_shard(int world_rank, const std::vector<MeshDimension>& dimensions) {
  const std::vector<int> coordinates = mesh_coordinates(world_rank, dimensions);
  DataShard shard;
  for (size_t i = 0; i < dimensions.size(); ++i) {
    if (is_data_dimension(dimensions[i].name)) {
      shard.index = shard.index * dimensions[i].size + coordinates[i];
      shard.count *= dimensions[i].size;
    }
  }
  return shard;
}

DeviceMesh::DeviceMesh(std::shared_ptr<comm::ProcessGroup> world,
                       std::vector<MeshDimension> dimensions)
    : world_(std::move(world)), dimensions_(std::move(dimensions)) {
  check_mesh_dimensions(dimensions_, world_->world_size());
  coordinates_ = mesh_coordinates(world_->rank(), dimensions_);
  groups_.resize(dimensions_.size());
  // Every rank creates every group, in the same order (new_group's contract): per
  // dimension, the groups in order of their first rank, which has coordinate 0 there. A
  // dimension of the whole world is the world itself (every rank decides that alike from the
  // sizes), so a 1-D mesh connects no new group; groups of one rank connect nothing either.
  for (size_t d = 0; d < dimensions_.size(); ++d) {
    if (dimensions_[d].size > 1 && dimensions_[d].size == world_->world_size()) {
      groups_[d] = world_;
      continue;
    }
    for (int rank = 0; rank < world_->world_size(); ++rank) {
      if (mesh_coordinates(rank, dimensions_)[d] != 0) {
        continue;
      }
      if (auto group = world_->new_group(mesh_group_ranks(rank, d, dimensions_))) {
        groups_[d] = std::move(group);
      }
    }
  }
}

DeviceMesh::DeviceMesh(comm::ProcessGroup& world, std::vector<MeshDimension> dimensions)
    : DeviceMesh(std::shared_ptr<comm::ProcessGroup>(&world, [](comm::ProcessGroup*) {}),
                 std::move(dimensions)) {}

size_t DeviceMesh::index_of(const std::string& name) const {
  for (size_t i = 0; i < dimensions_.size(); ++i) {
    if (dimensions_[i].name == name) {
      return i;
    }
  }
  throw OptionError(
      "DeviceMesh dimension",
      name,
      fmt::format("one of the mesh's: {}", describe_sizes(dimensions_)));
}

const std::shared_ptr<comm::ProcessGroup>& DeviceMesh::group(const std::string& name) const {
  return groups_[index_of(name)];
}

int DeviceMesh::size(const std::string& name) const {
  return dimensions_[index_of(name)].size;
}

int DeviceMesh::coordinate(const std::string& name) const {
  return coordinates_[index_of(name)];
}

DataShard DeviceMesh::data_shard() const {
  return parallel::data_shard(world_->rank(), dimensions_);
}

std::string DeviceMesh::describe() const {
  std::string formula = dimensions_.front().name;
  for (size_t i = 1; i < dimensions_.size(); ++i) {
    formula = fmt::format(
        "{}{} * {} + {}",
        i > 1 ? "(" : "",
        i > 1 ? formula + ")" : formula,
        dimensions_[i].size,
        dimensions_[i].name);
  }
  std::string coordinates;
  for (size_t i = 0; i < dimensions_.size(); ++i) {
    coordinates += fmt::format("{}{} {}", i == 0 ? "" : ", ", dimensions_[i].name, coordinates_[i]);
  }
  return fmt::format(
      "world {} = {} (world rank = {}); this rank {}: {}",
      world_->world_size(),
      describe_sizes(dimensions_),
      formula,
      world_->rank(),
      coordinates);
}

} // namespace largo::parallel
