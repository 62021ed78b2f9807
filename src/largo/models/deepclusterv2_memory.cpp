#include <largo/models/deepclusterv2_memory.h>

#include <largo/core/error.h>
#include <largo/models/deepclusterv2_loss.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <utility>

namespace largo::models {
namespace {

// F.normalize(x, dim=1) with its eps, as VISSL normalises embeddings and centroids.
at::Tensor normalize_rows(const at::Tensor& x) {
  return x / x.norm(2, 1, /*keepdim=*/true).clamp_min(1e-12);
}

void validate(const DeepClusterV2MemoryOptions& o) {
  const std::string name = "DeepClusterV2MemoryOptions::";
  require_option(
      !o.num_clusters.empty() &&
          *std::min_element(o.num_clusters.begin(), o.num_clusters.end()) > 0,
      name + "num_clusters",
      fmt::format("[{}]", fmt::join(o.num_clusters, ", ")),
      "one or more cluster counts, each > 0");
  require_option(
      o.kmeans_iters >= 0, name + "kmeans_iters", std::to_string(o.kmeans_iters), ">= 0");
  require_option(
      o.embedding_dim > 0, name + "embedding_dim", std::to_string(o.embedding_dim), "> 0");
  require_option(o.num_crops > 0, name + "num_crops", std::to_string(o.num_crops), "> 0");
  bool crops_in_range = !o.crops_for_mb.empty();
  for (int64_t crop : o.crops_for_mb) {
    crops_in_range = crops_in_range && crop >= 0 && crop < o.num_crops;
  }
  require_option(
      crops_in_range,
      name + "crops_for_mb",
      fmt::format("[{}]", fmt::join(o.crops_for_mb, ", ")),
      fmt::format("one or more crop indices in [0, {}) (num_crops)", o.num_crops));
  require_option(o.num_samples > 0, name + "num_samples", std::to_string(o.num_samples), "> 0");
  require_option(
      o.memory_size_per_rank > 0,
      name + "memory_size_per_rank",
      std::to_string(o.memory_size_per_rank),
      "> 0 (deepclusterv2_memory_size of the run's data)");
}

// [world * rows, ...]: every rank's `local` in rank order (VISSL's gather_from_all).
at::Tensor gather_rows(const at::Tensor& local, comm::ProcessGroup& group) {
  if (group.world_size() == 1) {
    return local;
  }
  std::vector<int64_t> shape = local.sizes().vec();
  shape[0] *= group.world_size();
  at::Tensor gathered = at::empty(shape, local.options());
  group.all_gather(gathered, local.contiguous());
  return gathered;
}

} // namespace

int64_t deepclusterv2_memory_size(
    int64_t num_samples, int64_t world_size, int64_t batch_size, bool drop_last) {
  int64_t size = (num_samples + world_size - 1) / world_size;
  if (drop_last) {
    size -= size % batch_size;
  }
  return size;
}

SphericalKmeansResult distributed_spherical_kmeans(
    const at::Tensor& embeddings,
    const at::Tensor& initial_centroids,
    int64_t iterations,
    comm::ProcessGroup& group) {
  TORCH_CHECK(
      embeddings.dim() == 2 && initial_centroids.dim() == 2 &&
          initial_centroids.size(1) == embeddings.size(1),
      "distributed_spherical_kmeans: expected embeddings [m, d] and centroids [K, d], got ",
      embeddings.sizes(),
      " and ",
      initial_centroids.sizes());
  at::NoGradGuard no_grad;
  const int64_t k = initial_centroids.size(0);
  at::Tensor centroids = initial_centroids.clone();
  at::Tensor assignments;
  for (int64_t iteration = 0;; ++iteration) {
    assignments = std::get<1>(at::mm(embeddings, centroids.t()).max(1)); // [m]
    if (iteration == iterations) {
      return {centroids, assignments};
    }
    at::Tensor counts = at::bincount(assignments, /*weights=*/{}, k); // [K] int64
    at::Tensor sums = at::zeros({k, embeddings.size(1)}, embeddings.options());
    sums.index_add_(0, assignments, embeddings);
    if (group.world_size() > 1) {
      group.all_reduce(counts);
      group.all_reduce(sums);
    }
    const at::Tensor has_members = (counts > 0).unsqueeze(1);
    const at::Tensor means = sums / counts.clamp_min(1).to(sums.scalar_type()).unsqueeze(1);
    centroids = normalize_rows(at::where(has_members, means, centroids));
  }
}

DeepClusterV2Memory::DeepClusterV2Memory(DeepClusterV2MemoryOptions options, c10::Device device)
    : options_(std::move(options)) {
  validate(options_);
  const auto banks = static_cast<int64_t>(options_.crops_for_mb.size());
  const auto heads = static_cast<int64_t>(options_.num_clusters.size());
  const auto floats = at::TensorOptions().dtype(at::kFloat).device(device);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  embeddings_ = at::zeros({banks, options_.memory_size_per_rank, options_.embedding_dim}, floats);
  sample_indexes_ = at::zeros({options_.memory_size_per_rank}, longs);
  assignments_ = at::full({heads, options_.num_samples}, kDeepClusterV2Unassigned, longs);
  for (int64_t k : options_.num_clusters) {
    centroids_.push_back(at::zeros({k, options_.embedding_dim}, floats));
  }
}

void DeepClusterV2Memory::write(const at::Tensor& output, const at::Tensor& sample_indexes) {
  const int64_t n = sample_indexes.numel();
  if (output.dim() != 2 || output.size(0) != options_.num_crops * n ||
      output.size(1) != options_.embedding_dim || sample_indexes.dim() != 1) {
    throw Error(fmt::format(
        "DeepClusterV2Memory::write: output [{}] and sample indexes [{}] given; expected "
        "[num_crops * n, embedding_dim] = [{} * n, {}] and [n]",
        fmt::join(output.sizes(), ", "),
        fmt::join(sample_indexes.sizes(), ", "),
        options_.num_crops,
        options_.embedding_dim));
  }
  if (position_ + n > options_.memory_size_per_rank) {
    throw Error(fmt::format(
        "DeepClusterV2Memory::write: {} images after {} fill a bank of {} rows: more images "
        "were written since the last cluster() than memory_size_per_rank holds (size it with "
        "deepclusterv2_memory_size for the run's samples, ranks, batch and drop_last)",
        n,
        position_,
        options_.memory_size_per_rank));
  }
  at::NoGradGuard no_grad;
  const at::Tensor normalized = normalize_rows(output.detach().to(at::kFloat));
  for (size_t bank = 0; bank < options_.crops_for_mb.size(); ++bank) {
    embeddings_[static_cast<int64_t>(bank)]
        .narrow(0, position_, n)
        .copy_(normalized.narrow(0, options_.crops_for_mb[bank] * n, n));
  }
  sample_indexes_.narrow(0, position_, n).copy_(sample_indexes);
  position_ += n;
}

void DeepClusterV2Memory::cluster(comm::ProcessGroup& group, at::Generator generator) {
  at::NoGradGuard no_grad;
  position_ = 0;
  const at::Tensor all_indexes = gather_rows(sample_indexes_, group);
  const int64_t banks = embeddings_.size(0);
  for (size_t h = 0; h < options_.num_clusters.size(); ++h) {
    const int64_t k = options_.num_clusters[h];
    const at::Tensor bank = embeddings_[static_cast<int64_t>(h) % banks];
    at::Tensor initial = at::empty({k, options_.embedding_dim}, bank.options());
    if (group.rank() == 0) {
      if (bank.size(0) < k) {
        throw Error(fmt::format(
            "DeepClusterV2Memory::cluster: head {} has {} clusters, more than the {} rows of rank "
            "0's bank it draws its initial centroids from; use fewer clusters or more images "
            "per rank",
            h,
            k,
            bank.size(0)));
      }
      const at::Tensor rows = at::randperm(bank.size(0), generator).narrow(0, 0, k);
      initial.copy_(bank.index_select(0, rows.to(bank.device())));
    }
    if (group.world_size() > 1) {
      group.broadcast(initial, 0);
    }
    SphericalKmeansResult result =
        distributed_spherical_kmeans(bank, initial, options_.kmeans_iters, group);
    centroids_[h].copy_(result.centroids);
    // Last write wins where an index repeats (a sampler's padding), as VISSL's index_put.
    assignments_[static_cast<int64_t>(h)].fill_(kDeepClusterV2Unassigned);
    c10::List<std::optional<at::Tensor>> at_indexes;
    at_indexes.push_back(all_indexes);
    assignments_[static_cast<int64_t>(h)].index_put_(
        at_indexes, gather_rows(result.assignments, group));
  }
}

at::Tensor DeepClusterV2Memory::targets(const at::Tensor& sample_indexes) const {
  TORCH_CHECK(
      sample_indexes.dim() == 1,
      "DeepClusterV2Memory::targets: expected sample indexes [n], got ",
      sample_indexes.sizes());
  return assignments_.index_select(1, sample_indexes.to(assignments_.device()))
      .repeat({1, options_.num_crops});
}

std::map<std::string, at::Tensor> DeepClusterV2Memory::state_dict() const {
  std::map<std::string, at::Tensor> state{
      {"local_memory_embeddings", embeddings_.cpu().clone()},
      {"local_memory_index", sample_indexes_.cpu().clone()},
      {"assignments", assignments_.cpu().clone()},
      {"start_idx", at::tensor({position_}, at::kLong)}};
  for (size_t h = 0; h < centroids_.size(); ++h) {
    state.emplace(fmt::format("centroids{}", h), centroids_[h].cpu().clone());
  }
  return state;
}

void DeepClusterV2Memory::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  std::vector<std::pair<std::string, at::Tensor*>> buffers{
      {"local_memory_embeddings", &embeddings_},
      {"local_memory_index", &sample_indexes_},
      {"assignments", &assignments_}};
  for (size_t h = 0; h < centroids_.size(); ++h) {
    buffers.emplace_back(fmt::format("centroids{}", h), &centroids_[h]);
  }
  for (const auto& [name, buffer] : buffers) {
    const auto saved = state.find(name);
    if (saved == state.end() || saved->second.sizes() != buffer->sizes()) {
      throw CheckpointError(fmt::format(
          "DeepCluster v2 memory state: expected \"{}\" of shape [{}] (num_clusters, "
          "crops_for_mb, embedding_dim, the dataset and the world size must be those of the "
          "run that saved it)",
          name,
          fmt::join(buffer->sizes(), ", ")));
    }
  }
  const auto position = state.find("start_idx");
  if (position == state.end() || position->second.numel() != 1 ||
      position->second.item<int64_t>() < 0 ||
      position->second.item<int64_t>() > options_.memory_size_per_rank) {
    throw CheckpointError(fmt::format(
        "DeepCluster v2 memory state: expected \"start_idx\", a row in [0, {}]",
        options_.memory_size_per_rank));
  }
  for (const auto& [name, buffer] : buffers) {
    buffer->copy_(state.at(name));
  }
  position_ = position->second.item<int64_t>();
}

} // namespace largo::models
