#include <largo/checkpoint/torch_file.h>

#include "unpickler.h"

#include <largo/core/error.h>
#include <largo/core/resources.h>

#include <fmt/format.h>

namespace largo::checkpoint {
namespace {

// The archive's records sit in one top folder ("archive/", or the saved file's stem for
// torch.save in Python); data.pkl names it.
std::string record_prefix(const ZipArchive& archive) {
  const ZipArchive::Entry* pickle = nullptr;
  for (const auto& entry : archive.entries()) {
    const std::string& name = entry.name;
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.compare(slash + 1, std::string::npos, "data.pkl") == 0) {
      if (pickle != nullptr) {
        throw CheckpointError(fmt::format(
            "{} holds two pickles ({} and {}); it is not a torch "
            "file Largo can read",
            archive.path().string(),
            pickle->name,
            name));
      }
      pickle = &entry;
    }
  }
  const bool torchscript =
      std::any_of(archive.entries().begin(), archive.entries().end(), [](const auto& e) {
        return e.name.find("/code/") != std::string::npos;
      });
  if (torchscript) {
    throw CheckpointError(fmt::format(
        "{} is a TorchScript module (torch.jit.save), not a "
        "checkpoint; save its state_dict() with torch.save instead",
        archive.path().string()));
  }
  if (pickle == nullptr) {
    throw CheckpointError(fmt::format(
        "{} is a zip archive without data.pkl, so not a torch file", archive.path().string()));
  }
  return pickle->name.substr(0, pickle->name.size() - std::string("data.pkl").size());
}

c10::Storage load_storage(
    const ZipArchive& archive,
    const std::string& prefix,
    const std::string& key,
    at::ScalarType dtype,
    int64_t numel) {
  const ZipArchive::Entry* entry = archive.find(prefix + "data/" + key);
  if (entry == nullptr) {
    throw detail::UnpickleError(fmt::format("its tensor data 'data/{}' is missing", key));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), c10::elementSize(dtype), &nbytes) ||
      nbytes != entry->size) {
    throw detail::UnpickleError(fmt::format(
        "its tensor data 'data/{}' holds {} bytes, not the {} elements of {} it should",
        key,
        entry->size,
        numel,
        c10::toString(dtype)));
  }
  // Sized by the entry, which lies inside the file: a damaged size cannot ask for more.
  AllocationContext context(fmt::format("loading {}", archive.path().string()));
  c10::Storage storage(
      c10::Storage::use_byte_size_t(),
      static_cast<size_t>(nbytes),
      at::getCPUAllocator(),
      /*resizable=*/false);
  archive.read_into(*entry, storage.mutable_data());
  return storage;
}

} // namespace

c10::IValue read_torch_file(const ZipArchive& archive) {
  const std::string prefix = record_prefix(archive);
  if (const auto* order = archive.find(prefix + "byteorder")) {
    if (archive.read(*order) != "little") {
      throw CheckpointError(fmt::format(
          "{} was saved on a big-endian machine; Largo reads little-endian torch files only",
          archive.path().string()));
    }
  }
  const std::string pickle = archive.read(*archive.find(prefix + "data.pkl"));
  try {
    return detail::unpickle(
        pickle, [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
          return load_storage(archive, prefix, key, dtype, numel);
        });
  } catch (const detail::UnpickleError& e) {
    throw CheckpointError(fmt::format(
        "{} is damaged or not a checkpoint Largo can read: {}", archive.path().string(), e.what()));
  } catch (const c10::Error& e) { // a value libtorch refused (e.g. an unhashable dict key)
    const std::string reason = e.what_without_backtrace();
    throw CheckpointError(fmt::format(
        "{} is damaged or not a checkpoint Largo can read: {}",
        archive.path().string(),
        reason.substr(0, reason.find('\n'))));
  }
}

c10::IValue read_torch_file(const std::filesystem::path& path) {
  ZipArchive archive(path);
  c10::IValue value = read_torch_file(archive);
  // The entries the pickle does not refer to (version, byteorder) are checked too, so a
  // damaged byte anywhere in what was read is refused, not half-trusted.
  for (const auto& entry : archive.entries()) {
    if (entry.name.find("/data/") == std::string::npos) {
      archive.read(entry);
    }
  }
  return value;
}

} // namespace largo::checkpoint
