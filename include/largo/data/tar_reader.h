// Reads the member list of a POSIX tar file from its headers alone, without reading the
// members' data: what a WebDataset shard index (webdataset_index.h) is built from.
//
// Formats: ustar (a 155-byte prefix joined to the 100-byte name), GNU (a 'L' long-name
// member names the next one; base-256 sizes), and POSIX pax ('x' records: path and size
// override the next header; 'g' global records are skipped) -- what Python's tarfile writes
// in each of its formats, and so what webdataset's TarWriter writes. Only regular files
// ('0' or NUL) are listed; directories, links and other types are skipped, as webdataset
// skips them. The archive ends at two zero blocks or at the end of the file on a header
// boundary (tarfile accepts both).
//
// Every error is a DataError naming the tar file and the member: a header with a bad
// checksum, a member whose data runs past the end of the file ("truncated"), a partial
// header at the end.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace largo::data {

struct TarMember {
  std::string name;        // path inside the archive (long-name and prefix forms joined)
  int64_t data_offset = 0; // byte offset of the member's data in the file
  int64_t size = 0;        // bytes of data
};

// Reads headers one after another with positioned reads (pread): each member costs one
// 512-byte read, and its data is skipped, not read.
class TarReader {
 public:
  // Throws DataError naming `path` when it cannot be opened or is not a regular file.
  explicit TarReader(std::string path);
  ~TarReader();
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;

  // The next regular-file member, or nullopt at the end of the archive. Throws DataError
  // naming the file and the member (or the last good one) for a bad or truncated archive.
  std::optional<TarMember> next();

  // Reads a member's data (e.g. a small label) into `bytes`. Throws DataError naming the
  // file and the member when the read comes up short.
  void read(const TarMember& member, std::vector<uint8_t>& bytes) const;

  const std::string& path() const {
    return path_;
  }
  int64_t file_size() const {
    return file_size_;
  }

 private:
  // Reads the 512-byte header at offset_ into block; false at the end of the file.
  bool read_block(uint8_t* block) const;
  // The data of a pax or GNU long-name member (small), read whole.
  std::string read_text(int64_t offset, int64_t size, const std::string& what) const;
  std::string where_after_last() const;

  std::string path_;
  int fd_ = -1;
  int64_t file_size_ = 0;
  int64_t offset_ = 0;    // of the next header
  std::string last_name_; // the last member listed, for messages
};

// Reads `size` bytes at `offset` of an open file into `bytes`; throws DataError with `what`
// (the file and member) when fewer are there.
void pread_exact(
    int fd, int64_t offset, int64_t size, std::vector<uint8_t>& bytes, const std::string& what);
void pread_exact(int fd, int64_t offset, int64_t size, uint8_t* out, const std::string& what);

} // namespace largo::data
