#include <largo/checkpoint/checkpoint_file.h>

#include <largo/core/atomic_file.h>
#include <largo/core/error.h>

#include <fmt/format.h>

#include <fstream>
#include <iterator>

namespace largo::checkpoint {

StateDict make_state_dict() {
  return StateDict(c10::StringType::get(), c10::AnyType::get());
}

void save_checkpoint(const std::filesystem::path& path, const StateDict& state) {
  std::vector<char> bytes = torch::pickle_save(c10::IValue(state));
  write_file_atomically(path, std::string_view(bytes.data(), bytes.size()));
}

StateDict load_checkpoint(const std::filesystem::path& path,
                          const std::vector<std::string>& required_keys) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw CheckpointError(fmt::format("cannot open checkpoint {}: {}", path.string(),
                                      std::filesystem::exists(path) ? "permission denied"
                                                                    : "no such file"));
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) {
    throw CheckpointError(fmt::format(
        "checkpoint {} is empty (0 bytes); it was never completely written. Delete it, or "
        "point CHECKPOINT.DIR at a directory with a good checkpoint.",
        path.string()));
  }
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    std::string reason = e.what();
    reason = reason.substr(0, reason.find('\n'));
    throw CheckpointError(fmt::format(
        "checkpoint {} ({} bytes) is truncated, corrupt or not a torch file ({}). "
        "Delete it or resume from an older checkpoint; Largo never overwrites a good "
        "checkpoint with a partial one.",
        path.string(), bytes.size(), reason));
  }
  if (!value.isGenericDict()) {
    throw CheckpointError(fmt::format("checkpoint {} holds a {}, not a dict of named state",
                                      path.string(), value.tagKind()));
  }
  StateDict state = value.toGenericDict();
  for (const auto& key : required_keys) {
    if (!state.contains(key)) {
      throw CheckpointError(fmt::format(
          "{} is not a Largo checkpoint: it has no '{}' entry", path.string(), key));
    }
  }
  return state;
}

const c10::IValue& state_at(const StateDict& state, const std::string& key,
                            const std::string& context) {
  auto it = state.find(key);
  if (it == state.end()) {
    throw CheckpointError(fmt::format("{} has no '{}' entry", context, key));
  }
  return it->value();
}

} // namespace largo::checkpoint
