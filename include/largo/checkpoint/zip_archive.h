// Reading the zip archives that hold torch files (what torch.save, torch::pickle_save and
// Largo's checkpoints write: uncompressed entries "<folder>/data.pkl", "<folder>/data/<key>",
// "<folder>/version"), with the CRC-32 of every entry checked as it is read.
//
// Why not libtorch's reader (caffe2::serialize::PyTorchStreamReader, which Largo's writer
// does use: streaming_checkpoint.cpp): it skips the CRC check, so a bit flipped on disk loads
// as a silently wrong weight (checked with libtorch 2.11: a flipped bit in a stored tensor
// entry loads without an error through torch::pickle_load, as through Python's torch.load);
// here a damaged entry is refused, naming the file and the entry. Entries are
// read straight from the file into the caller's memory (no whole-file copy), so loading
// needs the file's size in memory once, not twice. Sizes and offsets are checked against the
// file before anything is allocated: a damaged directory cannot ask for more memory than the
// file holds.
#pragma once

#include <largo/core/error.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace largo::checkpoint {

class ZipArchive {
 public:
  struct Entry {
    std::string name;     // full name in the archive, e.g. "archive/data/0"
    uint64_t data_offset; // where the entry's bytes start in the file
    uint64_t size;        // bytes (entries are stored uncompressed)
    uint32_t crc32;       // as recorded in the central directory
    bool stored;          // uncompressed and unencrypted: the only entries read_into reads
  };

  // Opens `path` and reads its central directory. Throws CheckpointError naming the file
  // when it is missing, a directory, empty, not a zip archive, truncated, or holds
  // duplicate entries. (Compressed or encrypted entries are refused when read.)
  explicit ZipArchive(std::filesystem::path path);
  ~ZipArchive();
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  const std::filesystem::path& path() const {
    return path_;
  }
  uint64_t file_size() const {
    return file_size_;
  }
  const std::vector<Entry>& entries() const {
    return entries_;
  }
  // The entry with this full name, or nullptr.
  const Entry* find(std::string_view name) const;

  // Reads the entry into `destination` (entry.size bytes) and checks its CRC-32; throws
  // CheckpointError naming the file and the entry when the bytes do not match.
  void read_into(const Entry& entry, void* destination) const;
  std::string read(const Entry& entry) const;

  // Checks the CRC-32 of every entry (reading each in bounded chunks). Throws like read_into.
  void verify_all() const;

 private:
  void check_stored(const Entry& entry) const;
  void read_at(uint64_t offset, void* destination, uint64_t size) const;
  struct DirectoryLocation {
    uint64_t count = 0;
    uint64_t size = 0;
    uint64_t offset = 0;
  };
  DirectoryLocation locate_directory() const;
  void parse_directory();
  CheckpointError damaged(const std::string& what) const;
  uint64_t locate_data(uint64_t local_header_offset, const std::string& name) const;

  std::filesystem::path path_;
  std::string name_; // the path, and the file it links to, for messages
  int fd_ = -1;
  uint64_t file_size_ = 0;
  std::vector<Entry> entries_;
};

// CRC-32 (the zip polynomial) of `size` bytes, continuing from `crc` (0 to start).
uint32_t crc32_of(const void* data, uint64_t size, uint32_t crc = 0);

} // namespace largo::checkpoint
