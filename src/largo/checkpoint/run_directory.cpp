#include <largo/checkpoint/run_directory.h>

namespace largo::checkpoint {
namespace fs = std::filesystem;

void point_latest_checkpoint_at(const fs::path& dir, const std::string& file_name) {
  const fs::path latest = dir / kLatestCheckpointName;
  const fs::path temporary = dir / (std::string(kLatestCheckpointName) + ".tmp");
  fs::remove(temporary);
  fs::create_symlink(file_name, temporary);
  fs::rename(temporary, latest);
}

std::optional<fs::path> latest_checkpoint(const fs::path& dir) {
  const fs::path latest = dir / kLatestCheckpointName;
  // symlink_status: a dangling checkpoint.torch is an error to report, not "no checkpoint".
  if (!fs::exists(fs::symlink_status(latest))) {
    return std::nullopt;
  }
  return latest;
}

} // namespace largo::checkpoint
