#include <largo/parallel/pipeline/pipeline_checkpoint.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <torch/serialize.h>

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace largo::parallel {

using GenericDict = c10::impl::GenericDict;

namespace {

// Tags of gather_to_root's two messages per rank (a size, then the bytes); outside a
// pipeline step's, which stay below 2 * stages * micro-batches + stages.
constexpr int kGatherSizeTag = 1 << 29;
constexpr int kGatherBytesTag = (1 << 29) + 1;

GenericDict string_dict() {
  return GenericDict(c10::StringType::get(), c10::AnyType::get());
}

GenericDict as_dict(const c10::IValue& value, const char* what) {
  if (!value.isGenericDict()) {
    throw CheckpointError(fmt::format("optimizer state: {} must be a dict", what));
  }
  return value.toGenericDict();
}

std::vector<std::string> names_of(const c10::IValue& params) {
  std::vector<std::string> names;
  for (const c10::IValue& name : params.toListRef()) {
    names.push_back(name.toStringRef());
  }
  return names;
}

} // namespace

std::vector<c10::IValue>
gather_to_root(comm::ProcessGroup& group, const c10::IValue& value, int root) {
  // NCCL moves only CUDA tensors; Gloo CPU ones.
  const at::Device device =
      group.backend() == "nccl" ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  if (group.rank() != root) {
    std::vector<char> bytes = torch::pickle_save(value);
    at::Tensor data = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(data.data_ptr<uint8_t>()));
    group.send(at::full({1}, data.numel(), at::kLong).to(device), root, kGatherSizeTag);
    group.send(data.to(device), root, kGatherBytesTag);
    return {};
  }
  std::vector<c10::IValue> values;
  for (int rank = 0; rank < group.world_size(); ++rank) {
    if (rank == root) { // a snapshot, like the others: the live state goes on changing
      values.push_back(torch::pickle_load(torch::pickle_save(value)));
      continue;
    }
    at::Tensor size = at::empty({1}, at::TensorOptions(at::kLong).device(device));
    group.recv(size, rank, kGatherSizeTag);
    at::Tensor data =
        at::empty({size.item<int64_t>()}, at::TensorOptions(at::kByte).device(device));
    group.recv(data, rank, kGatherBytesTag);
    data = data.cpu();
    const char* begin = reinterpret_cast<const char*>(data.data_ptr<uint8_t>());
    values.push_back(torch::pickle_load(std::vector<char>(begin, begin + data.numel())));
  }
  return values;
}

c10::IValue merge_optimizer_state_dicts(
    const std::vector<c10::IValue>& parts,
    const std::vector<std::string>& parameter_order,
    const std::vector<std::string>& group_order) {
  std::unordered_map<std::string, size_t> position;
  for (size_t i = 0; i < parameter_order.size(); ++i) {
    position[parameter_order[i]] = i;
  }
  GenericDict root = string_dict();
  GenericDict state = string_dict();
  std::vector<std::string> order = group_order;
  std::map<std::string, GenericDict> groups;              // by name: entries but "params"
  std::map<std::string, std::vector<std::string>> params; // by group name
  for (const c10::IValue& part_value : parts) {
    const GenericDict part = as_dict(part_value, "each part");
    for (const auto& entry : part) {
      const std::string key = entry.key().toStringRef();
      if (key == "type" && root.contains("type") && root.at("type") != entry.value()) {
        throw CheckpointError("optimizer states of different optimizer types cannot be merged");
      }
      if (key != "state" && key != "param_groups" && !root.contains(key)) {
        root.insert(key, entry.value());
      }
    }
    for (const auto& entry : as_dict(part.at("state"), "'state'")) {
      if (!state.insert(entry.key(), entry.value()).second) {
        throw CheckpointError(fmt::format(
            "optimizer state: parameter '{}' is in two parts", entry.key().toStringRef()));
      }
    }
    for (const c10::IValue& group_value : part.at("param_groups").toListRef()) {
      const GenericDict group = as_dict(group_value, "each param group");
      const std::string name = group.at("name").toStringRef();
      if (!groups.count(name)) {
        GenericDict copy = string_dict();
        for (const auto& entry : group) {
          if (entry.key().toStringRef() != "params") {
            copy.insert(entry.key(), entry.value());
          }
        }
        groups.emplace(name, copy);
        if (std::find(order.begin(), order.end(), name) == order.end()) {
          order.push_back(name);
        }
      }
      auto names = names_of(group.at("params"));
      params[name].insert(params[name].end(), names.begin(), names.end());
    }
  }
  c10::impl::GenericList merged_groups(c10::AnyType::get());
  for (const std::string& name : order) {
    if (!groups.count(name)) {
      continue;
    }
    auto& names = params[name];
    std::stable_sort(names.begin(), names.end(), [&](const auto& a, const auto& b) {
      auto pa = position.find(a), pb = position.find(b);
      return (pa == position.end() ? SIZE_MAX : pa->second) <
             (pb == position.end() ? SIZE_MAX : pb->second);
    });
    GenericDict group = groups.at(name);
    group.insert_or_assign("params", c10::List<std::string>(names));
    merged_groups.push_back(group);
  }
  root.insert_or_assign("state", state);
  root.insert_or_assign("param_groups", merged_groups);
  return root;
}

c10::IValue
select_optimizer_state(const c10::IValue& full, const std::vector<std::string>& parameter_names) {
  const GenericDict root = as_dict(full, "the top level");
  const std::unordered_set<std::string> wanted(parameter_names.begin(), parameter_names.end());
  std::unordered_set<std::string> found;
  GenericDict result = string_dict();
  for (const auto& entry : root) {
    const std::string key = entry.key().toStringRef();
    if (key != "state" && key != "param_groups") {
      result.insert(entry.key(), entry.value());
    }
  }
  GenericDict state = string_dict();
  for (const auto& entry : as_dict(root.at("state"), "'state'")) {
    if (wanted.count(entry.key().toStringRef())) {
      state.insert(entry.key(), entry.value());
    }
  }
  c10::impl::GenericList groups(c10::AnyType::get());
  for (const c10::IValue& group_value : root.at("param_groups").toListRef()) {
    const GenericDict group = as_dict(group_value, "each param group");
    c10::List<std::string> kept;
    for (const std::string& name : names_of(group.at("params"))) {
      if (wanted.count(name)) {
        kept.push_back(name);
        found.insert(name);
      }
    }
    if (kept.empty()) {
      continue;
    }
    GenericDict copy = group.copy();
    copy.insert_or_assign("params", kept);
    groups.push_back(copy);
  }
  for (const std::string& name : parameter_names) {
    if (!found.count(name)) {
      throw CheckpointError(fmt::format(
          "the optimizer state has no parameter '{}' in any group: it was written for another "
          "model",
          name));
    }
  }
  result.insert_or_assign("state", state);
  result.insert_or_assign("param_groups", groups);
  return result;
}

c10::IValue
full_optimizer_state_dict(const PipelineParallel& pipeline, const optim::Optimizer& optimizer) {
  auto parts = gather_to_root(pipeline.pipeline_group(), optimizer.state_dict(), 0);
  if (pipeline.pipeline_rank() != 0) {
    return c10::IValue();
  }
  return merge_optimizer_state_dicts(parts, pipeline.full_parameter_names());
}

} // namespace largo::parallel
