#include <largo/checkpoint/checkpoint_file.h>

#include <largo/checkpoint/streaming_checkpoint.h>
#include <largo/checkpoint/torch_file.h>
#include <largo/core/atomic_file.h>
#include <largo/core/error.h>

#include <fmt/format.h>

namespace largo::checkpoint {

StateDict make_state_dict() {
  return StateDict(c10::StringType::get(), c10::AnyType::get());
}

void save_checkpoint(const std::filesystem::path& path, const StateDict& state) {
  StreamingCheckpoint().save(path, state); // with nothing deferred: every tensor as it is
}

StateDict load_checkpoint(const std::filesystem::path& path,
                          const std::vector<std::string>& required_keys) {
  const c10::IValue value = read_torch_file(path);
  if (!value.isGenericDict()) {
    throw CheckpointError(fmt::format("checkpoint {} holds a {}, not a dict of named state",
                                      path.string(), value.tagKind()));
  }
  StateDict state = value.toGenericDict();
  for (const auto& entry : state) {
    if (!entry.key().isString()) {
      throw CheckpointError(fmt::format(
          "checkpoint {} is a dict with a key of type {}; a checkpoint's keys are strings",
          path.string(), entry.key().tagKind()));
    }
  }
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
