#include "run_environment.h"

#include <largo/comm/world_info.h>
#include <largo/models/attention_backend.h>
#include <largo/precision/tf32.h>
#include <largo/train/option_keys.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

namespace largo::train {

std::shared_ptr<comm::ProcessGroup>
join_world(const DistributedOptions& options, const std::string& backend) {
  comm::ProcessGroupOptions group_options;
  group_options.backend = backend;
  group_options.rendezvous_timeout = std::chrono::seconds(options.rendezvous_timeout_seconds);
  group_options.collective_timeout = std::chrono::seconds(options.collective_timeout_seconds);
  std::optional<comm::MasterPortFallback> port_fallback;
  if (options.run_id_master_port) {
    port_fallback = comm::MasterPortFallback{*options.run_id_master_port, "DISTRIBUTED.RUN_ID"};
  }
  return rethrow_with_yaml_keys(
      [&] { return comm::ProcessGroup::from_environment(group_options, port_fallback); });
}

RunWorld world_of(const comm::ProcessGroup& group) {
  RunWorld world;
  world.world_size = group.world_size();
  world.backend = group.backend();
  auto environment = group.world_size() > 1 ? comm::world_from_environment() : std::nullopt;
  world.procs_per_node =
      environment ? std::max(1, environment->local_world_size) : world.world_size;
  return world;
}

int64_t set_threads(int64_t configured, int procs_per_node) {
  int64_t threads = configured;
  if (threads == 0) {
    threads = std::max<int64_t>(
        1, std::max(1u, std::thread::hardware_concurrency()) / std::max(1, procs_per_node));
  }
  torch::set_num_threads(static_cast<int>(threads));
  return threads;
}

void apply_kernel_switches(const TrainerOptions& options) {
  precision::apply_tf32(options.tf32);
  models::prefer_attention_backend(options.attention_backend);
}

torch::Device pick_device(const TrainerOptions& options) {
  if (options.device != "gpu") {
    return torch::kCPU;
  }
  if (!torch::cuda::is_available()) {
    spdlog::warn("MACHINE.DEVICE is gpu but no CUDA device is visible; training on the CPU");
    return torch::kCPU;
  }
  // One GPU per process: the launcher's LOCAL_RANK picks it.
  auto world = comm::world_from_environment();
  const int local_rank = world ? world->local_rank : 0;
  return torch::Device(
      torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % torch::cuda::device_count()));
}

} // namespace largo::train
