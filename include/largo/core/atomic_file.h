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

// The same, for contents written piece by piece (e.g. a checkpoint too large to build in
// memory first): write() appends, commit() makes the file appear at `path`. Destroyed
// without commit(), it removes its temporary file and `path` keeps its old contents.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size);
  void commit();

 private:
  std::filesystem::path path_;
  std::filesystem::path temporary_;
  int fd_ = -1;
};

} // namespace largo
