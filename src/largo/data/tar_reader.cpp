// Tar headers (POSIX.1-1988 ustar, GNU and pax extensions) read one block at a time.
#include "largo/data/tar_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "largo/core/error.h"

namespace largo::data {
namespace {

constexpr int64_t kBlock = 512;

// Field offsets and widths of a ustar header block.
constexpr size_t kNameAt = 0, kNameLength = 100;
constexpr size_t kSizeAt = 124, kSizeLength = 12;
constexpr size_t kChecksumAt = 148, kChecksumLength = 8;
constexpr size_t kTypeAt = 156;
constexpr size_t kMagicAt = 257;
constexpr size_t kPrefixAt = 345, kPrefixLength = 155;

int64_t tar_padded(int64_t size) {
  return (size + kBlock - 1) / kBlock * kBlock;
}

// A NUL-terminated (or full-width) text field.
std::string field(const uint8_t* block, size_t at, size_t length) {
  const auto* begin = reinterpret_cast<const char*>(block + at);
  return std::string(begin, strnlen(begin, length));
}

// An octal number field (spaces or NULs around it), or GNU's base-256 form for values that
// do not fit (the first byte's high bit set). -1 when it is neither.
int64_t number_field(const uint8_t* block, size_t at, size_t length) {
  if ((block[at] & 0x80) != 0) {
    int64_t value = block[at] & 0x7f;
    for (size_t i = 1; i < length; ++i) {
      if (value > (INT64_MAX >> 8)) {
        return -1;
      }
      value = (value << 8) | block[at + i];
    }
    return value;
  }
  int64_t value = 0;
  bool digits = false;
  for (size_t i = 0; i < length; ++i) {
    const char c = static_cast<char>(block[at + i]);
    if (c >= '0' && c <= '7') {
      value = value * 8 + (c - '0');
      digits = true;
    } else if (c == ' ' || c == '\0') {
      if (digits) {
        break;
      }
    } else {
      return -1;
    }
  }
  return digits ? value : -1;
}

bool all_zero(const uint8_t* block) {
  return std::all_of(block, block + kBlock, [](uint8_t b) { return b == 0; });
}

// The header checksum: the sum of its bytes with the checksum field read as spaces.
// Historic tars summed signed chars; either sum is accepted, as tarfile accepts both.
bool checksum_ok(const uint8_t* block) {
  const int64_t stored = number_field(block, kChecksumAt, kChecksumLength);
  int64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < static_cast<size_t>(kBlock); ++i) {
    const bool in_field = i >= kChecksumAt && i < kChecksumAt + kChecksumLength;
    const uint8_t byte = in_field ? ' ' : block[i];
    unsigned_sum += byte;
    signed_sum += static_cast<int8_t>(byte);
  }
  return stored == unsigned_sum || stored == signed_sum;
}

// The records of a pax extended header ("<length> <key>=<value>\n" each) that name or size
// the next member.
void read_pax_records(const std::string& text, std::string& path, int64_t& size) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t space = text.find(' ', at);
    if (space == std::string::npos) {
      return;
    }
    const int64_t length = std::strtoll(text.c_str() + at, nullptr, 10);
    if (length <= 0 || at + static_cast<size_t>(length) > text.size()) {
      return;
    }
    const std::string record = text.substr(space + 1, at + length - space - 2); // without \n
    const size_t equals = record.find('=');
    if (equals != std::string::npos) {
      const std::string key = record.substr(0, equals);
      if (key == "path") {
        path = record.substr(equals + 1);
      } else if (key == "size") {
        size = std::strtoll(record.c_str() + equals + 1, nullptr, 10);
      }
    }
    at += static_cast<size_t>(length);
  }
}

} // namespace

void pread_exact(int fd, int64_t offset, int64_t size, uint8_t* out, const std::string& what) {
  int64_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd, out + done, static_cast<size_t>(size - done), offset + done);
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got <= 0) {
      const int error = errno;
      throw DataError(fmt::format(
          "{}: read {} of {} bytes at offset {}{}",
          what,
          done,
          size,
          offset,
          got < 0 ? std::string(": ") + std::strerror(error) : " (truncated)"));
    }
    done += got;
  }
}

void pread_exact(
    int fd, int64_t offset, int64_t size, std::vector<uint8_t>& bytes, const std::string& what) {
  bytes.resize(static_cast<size_t>(size));
  pread_exact(fd, offset, size, bytes.data(), what);
}

TarReader::TarReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) {
    const int error = errno;
    throw DataError(fmt::format("{}: cannot open the tar file: {}", path_, std::strerror(error)));
  }
  struct stat info {};
  if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd_);
    throw DataError(fmt::format("{}: not a regular file; a shard must be a tar file", path_));
  }
  file_size_ = static_cast<int64_t>(info.st_size);
}

TarReader::~TarReader() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

std::string TarReader::where_after_last() const {
  return last_name_.empty() ? fmt::format("the first member (offset {})", offset_)
                            : fmt::format("the member after {} (offset {})", last_name_, offset_);
}

bool TarReader::read_block(uint8_t* block) const {
  const int64_t left = file_size_ - offset_;
  if (left <= 0) {
    return false;
  }
  if (left < kBlock) {
    throw DataError(fmt::format(
        "{}: truncated tar: {} ends in a partial header ({} of 512 bytes)",
        path_,
        where_after_last(),
        left));
  }
  if (::pread(fd_, block, kBlock, offset_) != kBlock) { // a short read of a local file: retry
    pread_exact(fd_, offset_, kBlock, block, fmt::format("{}: {}", path_, where_after_last()));
  }
  return true;
}

std::string TarReader::read_text(int64_t offset, int64_t size, const std::string& what) const {
  if (size < 0 || offset + size > file_size_) {
    throw DataError(fmt::format(
        "{}: truncated tar: {} needs {} bytes at offset {}, but the file has {}",
        path_,
        what,
        size,
        offset,
        file_size_));
  }
  std::vector<uint8_t> bytes;
  pread_exact(fd_, offset, size, bytes, fmt::format("{}: {}", path_, what));
  return std::string(bytes.begin(), bytes.end());
}

std::optional<TarMember> TarReader::next() {
  std::string long_name; // from a GNU 'L' or pax 'x' member, for the next header
  int64_t pax_size = -1;
  uint8_t block[kBlock];
  for (;;) {
    if (!read_block(block) || all_zero(block)) {
      return std::nullopt;
    }
    if (!checksum_ok(block)) {
      throw DataError(fmt::format(
          "{}: not a tar file, or a corrupt header: {} has a bad header checksum",
          path_,
          where_after_last()));
    }
    const char type = static_cast<char>(block[kTypeAt]);
    std::string name = long_name.empty() ? field(block, kNameAt, kNameLength) : long_name;
    if (long_name.empty() && std::memcmp(block + kMagicAt, "ustar\0", 6) == 0) {
      const std::string prefix = field(block, kPrefixAt, kPrefixLength);
      if (!prefix.empty()) {
        name = prefix + "/" + name;
      }
    }
    int64_t size = number_field(block, kSizeAt, kSizeLength);
    if (pax_size >= 0) {
      size = pax_size;
    }
    if (size < 0) {
      throw DataError(fmt::format("{}: member {} has a malformed size field", path_, name));
    }
    const int64_t data_offset = offset_ + kBlock;
    if (data_offset + size > file_size_) {
      throw DataError(fmt::format(
          "{}: truncated tar: member {} has {} bytes at offset {}, but the file ends after {} "
          "(an interrupted copy or write?)",
          path_,
          name,
          size,
          data_offset,
          file_size_ - data_offset));
    }
    offset_ = data_offset + tar_padded(size);
    if (type == 'L') { // GNU: this member's data is the next member's name
      long_name = read_text(data_offset, size, "a GNU long name");
      long_name.resize(strnlen(long_name.c_str(), long_name.size()));
      continue;
    }
    if (type == 'x') { // pax: records for the next member
      read_pax_records(read_text(data_offset, size, "a pax header"), long_name, pax_size);
      continue;
    }
    if (type == 'K' || type == 'g') {
      continue; // a GNU long link name, a pax global header: nothing a sample needs
    }
    if (type != '0' && type != '\0' && type != '7') {
      long_name.clear(); // a directory, link or device: skipped
      pax_size = -1;
      continue;
    }
    last_name_ = name;
    return TarMember{std::move(name), data_offset, size};
  }
}

void TarReader::read(const TarMember& member, std::vector<uint8_t>& bytes) const {
  pread_exact(
      fd_,
      member.data_offset,
      member.size,
      bytes,
      fmt::format("{}: member {}", path_, member.name));
}

} // namespace largo::data
