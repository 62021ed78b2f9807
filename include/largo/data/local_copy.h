// VISSL's COPY_TO_LOCAL_DISK: a dataset kept on a shared (network) file system is read from a
// copy on the machine's own disk, made once per machine before the first epoch. As VISSL's
// copy_data_to_local, a file goes to destination_dir/<its name>, a directory to
// destination_dir/<its name>/ with a `copy_complete` marker file, and a copy found complete is
// used as it is. Unlike VISSL, Largo copies under a temporary name and renames the whole
// (so a job killed mid-copy never leaves what looks like a complete copy), never overwrites
// or removes anything already at the destination, and keeps the copy after the run (a
// resumed or repeated run reads it without copying again).
#pragma once

#include <filesystem>

namespace largo::data {

// Where copy_to_local_disk puts `source`: destination_dir / source's last path component.
std::filesystem::path
local_copy_path(const std::filesystem::path& source, const std::filesystem::path& destination_dir);

// Copies `source` (a file, or a directory and everything below it) into `destination_dir`
// (created if missing) unless a complete copy is there, and returns local_copy_path().
// Throws DataError naming the paths when `source` does not exist, when the destination is
// the source itself, when something other than a complete copy is in the way (a file of
// another size; a directory without the marker), or when the copy fails (the partial copy
// is removed).
std::filesystem::path copy_to_local_disk(
    const std::filesystem::path& source, const std::filesystem::path& destination_dir);

} // namespace largo::data
