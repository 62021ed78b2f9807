#include <largo/train/method_state_estimate.h>

#include <largo/models/swav_head.h>
#include <largo/parallel/parallelize.h>
#include <largo/train/self_supervised_loss.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

namespace largo::train {
namespace {

constexpr int64_t kFloatBytes = 4;

// The bytes of every parameter and buffer of `module`, as built.
int64_t tensor_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& tensors : {module.parameters(), module.buffers()}) {
    for (const at::Tensor& tensor : tensors) {
      bytes += static_cast<int64_t>(tensor.nbytes());
    }
  }
  return bytes;
}

// The ranks that read different images (the mesh's "dp"): the loss's queues are theirs.
int64_t data_parallel_size(const RunPlan& plan) {
  const int world = static_cast<int>(plan.world.world_size);
  for (const parallel::MeshDimension& dimension : parallel::mesh_dimensions(plan.parallel, world)) {
    if (dimension.name == "dp") {
      return dimension.size;
    }
  }
  return world;
}

// SwAV's queue (models/swav_queue.h): per assigned crop, `length` rows of the embedding and
// of each prototype set's scores, float32.
std::optional<MethodState> swav_queue(const RunPlan& plan, const models::RunModel& model) {
  const SelfSupervisedLossOptions& loss = plan.options.self_supervised;
  const int64_t length =
      local_queue_length(loss.queue_length, plan.batch_per_rank, data_parallel_size(plan));
  if (length <= 0) {
    return std::nullopt;
  }
  for (const auto& item : model.module()->named_modules()) {
    if (const auto* head = item.value()->as<models::SwavHeadImpl>()) {
      const auto& clusters = head->options().num_clusters;
      const int64_t width = head->options().dims.back() +
                            std::accumulate(clusters.begin(), clusters.end(), int64_t{0});
      const auto crops = static_cast<int64_t>(loss.swav.crops_for_assign.size());
      return MethodState{
          fmt::format(
              "SwAV queue ({} assigned crops x {} images x (embedding {} + scores {}), float32)",
              crops,
              length,
              head->options().dims.back(),
              fmt::join(clusters, " + ")),
          crops * length * width * kFloatBytes};
    }
  }
  return std::nullopt; // no swav_head: resolve_run has refused the run already
}

} // namespace

std::vector<MethodState> estimate_method_state(const RunPlan& plan, const models::RunModel& model) {
  const SelfSupervisedLossOptions& loss = plan.options.self_supervised;
  std::vector<MethodState> state;
  if (model.dino) {
    state.push_back(
        {"DINO teacher (a whole copy of the student's parameters and buffers, as built; no "
         "gradients or optimizer state)",
         tensor_bytes(*model.dino->teacher())});
  }
  if (model.moco) {
    state.push_back(
        {"MoCo momentum encoder (a whole copy of the query encoder's parameters and buffers, "
         "as built; no gradients or optimizer state)",
         tensor_bytes(*model.moco->momentum_encoder())});
    state.push_back(
        {fmt::format(
             "MoCo queue ({} keys x {}, float32)", loss.moco_queue_size, loss.moco_embedding_dim),
         loss.moco_queue_size * loss.moco_embedding_dim * kFloatBytes});
  }
  if (loss.is_swav()) {
    if (auto queue = swav_queue(plan, model)) {
      state.push_back(*queue);
    }
  }
  if (loss.is_deepclusterv2()) {
    const auto& memory = loss.deepclusterv2_memory;
    state.push_back(
        {fmt::format(
             "DeepCluster v2 memory banks ({} crops x the images a rank reads per epoch x {}, "
             "float32, and each image's cluster per head, int64): sized by the dataset",
             memory.crops_for_mb.size(),
             memory.embedding_dim),
         std::nullopt});
  }
  return state;
}

} // namespace largo::train
