// Reading and writing checkpoint files. A checkpoint is a dict of named values (tensors,
// numbers, strings, nested dicts and lists) in libtorch's file format (torch::pickle_save's
// zip archive) without TorchScript's type tags, so Python's `torch.load(path)` reads it as a
// plain dict, in its default weights_only mode too. Writes are atomic (core/atomic_file.h).
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <string>

namespace largo::checkpoint {

// A string-keyed dict of IValues: what Python sees as {str: object}.
using StateDict = c10::impl::GenericDict;

StateDict make_state_dict();

// Serialize and write atomically: a crash mid-write never damages an older file at `path`.
void save_checkpoint(const std::filesystem::path& path, const StateDict& state);

// Read a checkpoint back: Largo's own, or any dict Python's torch.save wrote (a state_dict,
// a dict of tensors and scalars), through read_torch_file (torch_file.h), which checks the
// CRC-32 of every entry. Throws CheckpointError that names the file and says what is
// wrong: missing, a directory, empty, truncated or damaged, not a dict with string keys, or
// (when `required_keys` is given) a dict without those keys, i.e. not a Largo checkpoint.
StateDict load_checkpoint(const std::filesystem::path& path,
                          const std::vector<std::string>& required_keys = {});

// Typed access with errors that name the key.
const c10::IValue& state_at(const StateDict& state, const std::string& key,
                            const std::string& context = "checkpoint");

} // namespace largo::checkpoint
