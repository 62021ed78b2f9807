#include "largo/data/local_copy.h"

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>

#include "largo/core/error.h"

namespace largo::data {
namespace fs = std::filesystem;
namespace {

const char* const kCompleteMarker = "copy_complete"; // VISSL's name for it

bool is_complete_copy(const fs::path& source, const fs::path& target) {
  if (fs::is_directory(source)) {
    return fs::is_regular_file(target / kCompleteMarker);
  }
  std::error_code error;
  return fs::is_regular_file(target) && fs::file_size(target, error) == fs::file_size(source);
}

std::string refusal_to_overwrite(const fs::path& source, const fs::path& target) {
  return fs::is_directory(source)
             ? fmt::format(
                   "{} exists but is not a complete copy of {} (it has no {} file); remove it "
                   "or choose another DataSourceOptions::local_copy_dir",
                   target.string(),
                   source.string(),
                   kCompleteMarker)
             : fmt::format(
                   "{} exists with another size than {}; remove it or choose another "
                   "DataSourceOptions::local_copy_dir",
                   target.string(),
                   source.string());
}

// The copy under a temporary name beside the target, renamed once whole.
void copy_whole(const fs::path& source, const fs::path& target) {
  const fs::path partial =
      target.parent_path() / fmt::format(".{}.partial-{}", target.filename().string(), getpid());
  std::error_code error;
  fs::remove_all(partial, error);
  fs::copy(source, partial, fs::copy_options::recursive, error);
  if (!error && fs::is_directory(source)) {
    std::ofstream(partial / kCompleteMarker).close();
  }
  if (!error) {
    fs::rename(partial, target, error);
  }
  if (error && is_complete_copy(source, target)) { // another process finished the same copy
    std::error_code ignored;
    fs::remove_all(partial, ignored);
    return;
  }
  if (error) {
    std::error_code ignored;
    fs::remove_all(partial, ignored);
    throw DataError(fmt::format(
        "copying {} to {} failed: {}; check that the destination has room and is writable, "
        "or leave DataSourceOptions::local_copy_dir empty to read the data where it is",
        source.string(),
        target.string(),
        error.message()));
  }
}

} // namespace

fs::path local_copy_path(const fs::path& source, const fs::path& destination_dir) {
  const fs::path name = source.has_filename() ? source.filename() : source.parent_path().filename();
  return destination_dir / name;
}

fs::path copy_to_local_disk(const fs::path& source, const fs::path& destination_dir) {
  if (!fs::exists(source)) {
    throw DataError(fmt::format(
        "cannot copy {} to the local disk: it does not exist; check DataSourceOptions::path "
        "(or DataSourceOptions::label_path)",
        source.string()));
  }
  const fs::path target = local_copy_path(source, destination_dir);
  std::error_code error;
  if (fs::equivalent(source, target, error)) {
    throw DataError(fmt::format(
        "DataSourceOptions::local_copy_dir {} holds {} itself: choose a directory on the local "
        "disk other than the data's own",
        destination_dir.string(),
        source.string()));
  }
  if (is_complete_copy(source, target)) {
    spdlog::info("local copy of {} found complete at {}", source.string(), target.string());
    return target;
  }
  if (fs::exists(target)) {
    throw DataError(refusal_to_overwrite(source, target));
  }
  fs::create_directories(destination_dir, error);
  if (error) {
    throw DataError(fmt::format(
        "cannot create DataSourceOptions::local_copy_dir {}: {}",
        destination_dir.string(),
        error.message()));
  }
  const auto start = std::chrono::steady_clock::now();
  copy_whole(source, target);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  spdlog::info("copied {} to {} in {:.1f} s", source.string(), target.string(), took.count());
  return target;
}

} // namespace largo::data
