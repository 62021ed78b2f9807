// Crash-safe file replacement: write to a temporary file in the same directory, fsync it,
// rename it over the destination and fsync the directory. A crash at any point leaves
// either the old file or the new one, never a torn mix (checkpoints depend on this).
#pragma once

#include <filesystem>
#include <string_view>

namespace largo {

// Throws largo::Error naming the path (and errno's text) on any I/O failure; the
// previous contents of `path` are untouched in that case.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

} // namespace largo
