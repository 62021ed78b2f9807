#include <largo/checkpoint/zip_archive.h>

#include <largo/core/error.h>

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <initializer_list>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_set>

namespace largo::checkpoint {
namespace {

constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr size_t kEndOfDirectorySize = 22;
constexpr size_t kMaxCommentSize = 0xffff;

// Little-endian fields of a zip record held in memory, read with bounds checks.
class Fields {
 public:
  Fields(const std::string& bytes, size_t position) : bytes_(bytes), position_(position) {}
  bool has(size_t n) const {
    return position_ <= bytes_.size() && bytes_.size() - position_ >= n;
  }
  uint64_t take(size_t n) { // n <= 8 bytes, little endian; caller checked has()
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) {
      value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes_[position_ + i])) << (8 * i);
    }
    position_ += n;
    return value;
  }
  void skip(size_t n) {
    position_ += n;
  }
  size_t position() const {
    return position_;
  }

 private:
  const std::string& bytes_;
  size_t position_;
};

// The zip64 extra field (id 1) holds the 64-bit values of the fields saturated at
// 0xffffffff, in the order size, compressed size, local header offset.
void read_zip64_extra(Fields extra, size_t end, std::initializer_list<uint64_t*> values) {
  while (extra.position() + 4 <= end) {
    const uint64_t id = extra.take(2);
    const uint64_t length = extra.take(2);
    const size_t next = extra.position() + length;
    if (id == 1) {
      for (uint64_t* value : values) {
        if (*value == 0xffffffff && extra.position() + 8 <= std::min(next, end)) {
          *value = extra.take(8);
        }
      }
    }
    extra.skip(next - extra.position());
  }
}

} // namespace

uint32_t crc32_of(const void* data, uint64_t size, uint32_t crc) {
  const auto* bytes = static_cast<const Bytef*>(data);
  while (size > 0) { // zlib takes the length as a uInt
    const uInt chunk = static_cast<uInt>(std::min<uint64_t>(size, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, bytes, chunk));
    bytes += chunk;
    size -= chunk;
  }
  return crc;
}

ZipArchive::ZipArchive(std::filesystem::path path) : path_(std::move(path)), name_(path_.string()) {
  std::error_code ec;
  if (std::filesystem::is_symlink(path_, ec)) { // checkpoint.torch: say which file it names
    name_ += fmt::format(" (a link to {})", std::filesystem::read_symlink(path_, ec).string());
  }
  if (std::filesystem::is_directory(path_, ec)) {
    throw CheckpointError(fmt::format(
        "checkpoint {} is a directory, not a checkpoint file; remove or rename it",
        name_));
  }
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    throw CheckpointError(fmt::format(
        "cannot open checkpoint {}: {}",
        name_,
        errno == ENOENT   ? "no such file"
        : errno == EACCES ? "permission denied"
                          : std::strerror(errno)));
  }
  struct stat info {};
  if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd_);
    throw CheckpointError(fmt::format("checkpoint {} is not a regular file", name_));
  }
  file_size_ = static_cast<uint64_t>(info.st_size);
  try {
    if (file_size_ == 0) {
      throw CheckpointError(fmt::format(
          "checkpoint {} is empty (0 bytes); it was never completely written. Delete it, or "
          "point CHECKPOINT.DIR at a directory with a good checkpoint.",
          name_));
    }
    parse_directory();
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

ZipArchive::~ZipArchive() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

void ZipArchive::read_at(uint64_t offset, void* destination, uint64_t size) const {
  auto* out = static_cast<char*>(destination);
  while (size > 0) {
    const ssize_t n =
        ::pread(fd_, out, std::min<uint64_t>(size, 1u << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      throw CheckpointError(fmt::format(
          "cannot read checkpoint {} at byte {}: {}",
          name_,
          offset,
          n == 0 ? "unexpected end of file" : std::strerror(errno)));
    }
    out += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
}

CheckpointError ZipArchive::damaged(const std::string& what) const {
  return CheckpointError(fmt::format(
      "checkpoint {} ({} bytes) is truncated, corrupt or not a torch file ({}). Delete it or "
      "resume from an older checkpoint; Largo never overwrites a good checkpoint with a "
      "partial one.",
      name_,
      file_size_,
      what));
}

ZipArchive::DirectoryLocation ZipArchive::locate_directory() const {
  // The end-of-directory record sits at the end, before a comment of up to 64 KiB.
  const uint64_t tail_size = std::min<uint64_t>(file_size_, kEndOfDirectorySize + kMaxCommentSize);
  std::string tail(tail_size, '\0');
  read_at(file_size_ - tail_size, tail.data(), tail_size);
  size_t end_record = std::string::npos;
  const size_t last = tail_size >= kEndOfDirectorySize ? tail_size - kEndOfDirectorySize + 1 : 0;
  for (size_t i = last; i-- > 0;) {
    if (Fields(tail, i).take(4) == kEndOfDirectory) {
      end_record = i;
      break;
    }
  }
  if (end_record == std::string::npos) {
    char head = 0;
    read_at(0, &head, 1);
    if (static_cast<unsigned char>(head) == 0x80) { // a bare pickle: the pre-1.6 format
      throw CheckpointError(fmt::format(
          "checkpoint {} is in PyTorch's legacy format (torch.save with "
          "_use_new_zipfile_serialization=False); load it in Python and save it again with "
          "torch.save's default format",
          name_));
    }
    throw damaged("no zip directory at its end");
  }
  Fields end(tail, end_record + 10);
  DirectoryLocation location;
  location.count = end.take(2);
  location.size = end.take(4);
  location.offset = end.take(4);
  if (location.count == 0xffff || location.size == 0xffffffff || location.offset == 0xffffffff) {
    // Zip64: a locator just before the end record points at the 64-bit end record.
    const uint64_t locator_at = file_size_ - tail_size + end_record;
    std::string locator(20, '\0');
    if (locator_at < 20) {
      throw damaged("zip64 locator missing");
    }
    read_at(locator_at - 20, locator.data(), 20);
    Fields loc(locator, 0);
    if (loc.take(4) != kZip64Locator) {
      throw damaged("zip64 locator missing");
    }
    loc.skip(4);
    const uint64_t record_at = loc.take(8);
    if (record_at > file_size_ || file_size_ - record_at < 56) {
      throw damaged("zip64 end record outside the file");
    }
    std::string record(56, '\0');
    read_at(record_at, record.data(), 56);
    Fields rec(record, 0);
    if (rec.take(4) != kZip64EndOfDirectory) {
      throw damaged("zip64 end record missing");
    }
    rec.skip(28);
    location.count = rec.take(8);
    location.size = rec.take(8);
    location.offset = rec.take(8);
  }
  if (location.offset > file_size_ || file_size_ - location.offset < location.size) {
    throw damaged("its zip directory lies outside the file");
  }
  return location;
}

void ZipArchive::parse_directory() {
  const DirectoryLocation location = locate_directory();
  std::string directory(location.size, '\0');
  read_at(location.offset, directory.data(), location.size);
  Fields fields(directory, 0);
  std::unordered_set<std::string> names;
  for (uint64_t i = 0; i < location.count; ++i) {
    const auto entry_damaged = [&] {
      return damaged(fmt::format("zip directory entry {} of {} is damaged", i + 1, location.count));
    };
    if (!fields.has(46) || fields.take(4) != kDirectoryEntry) {
      throw entry_damaged();
    }
    fields.skip(4);
    const uint64_t flags = fields.take(2);
    const uint64_t method = fields.take(2);
    fields.skip(4);
    const auto crc = static_cast<uint32_t>(fields.take(4));
    uint64_t compressed = fields.take(4);
    uint64_t size = fields.take(4);
    const size_t name_length = fields.take(2);
    const size_t extra_length = fields.take(2);
    const size_t comment_length = fields.take(2);
    fields.skip(8);
    uint64_t local_offset = fields.take(4);
    if (!fields.has(name_length + extra_length + comment_length)) {
      throw entry_damaged();
    }
    std::string name = directory.substr(fields.position(), name_length);
    fields.skip(name_length);
    read_zip64_extra(
        Fields(directory, fields.position()),
        fields.position() + extra_length,
        {&size, &compressed, &local_offset});
    fields.skip(extra_length + comment_length);
    const bool stored = (flags & 1) == 0 && method == 0 && compressed == size;
    if (!names.insert(name).second) {
      throw damaged(fmt::format("entry '{}' appears twice", name));
    }
    const uint64_t data_offset = locate_data(local_offset, name);
    if (data_offset > file_size_ || file_size_ - data_offset < compressed) {
      throw damaged(
          fmt::format("entry '{}' ({} bytes) extends past the end of the file", name, size));
    }
    entries_.push_back({std::move(name), data_offset, size, crc, stored});
  }
}

uint64_t ZipArchive::locate_data(uint64_t local_header_offset, const std::string& name) const {
  if (local_header_offset > file_size_ || file_size_ - local_header_offset < 30) {
    throw CheckpointError(fmt::format(
        "checkpoint {} is truncated or corrupt: entry '{}' starts "
        "past the end of the file",
        name_,
        name));
  }
  std::string header(30, '\0');
  read_at(local_header_offset, header.data(), 30);
  Fields fields(header, 0);
  if (fields.take(4) != kLocalHeader) {
    throw CheckpointError(fmt::format(
        "checkpoint {} is corrupt: the header of entry '{}' is damaged", name_, name));
  }
  fields.skip(22);
  const uint64_t name_length = fields.take(2);
  const uint64_t extra_length = fields.take(2);
  return local_header_offset + 30 + name_length + extra_length;
}

const ZipArchive::Entry* ZipArchive::find(std::string_view name) const {
  for (const Entry& entry : entries_) {
    if (entry.name == name) {
      return &entry;
    }
  }
  return nullptr;
}

namespace {

[[noreturn]] void
crc_mismatch(const std::string& name, const ZipArchive::Entry& entry, uint32_t computed) {
  throw CheckpointError(fmt::format(
      "checkpoint {} is corrupt: its entry '{}' ({} bytes) fails its CRC-32 check (recorded "
      "{:08x}, computed {:08x}), so the file was damaged after it was written (disk, copy or "
      "transfer). Resume from an older checkpoint (see docs/checkpoints.md) or copy it again.",
      name,
      entry.name,
      entry.size,
      entry.crc32,
      computed));
}

} // namespace

void ZipArchive::check_stored(const Entry& entry) const {
  if (!entry.stored) {
    throw CheckpointError(fmt::format(
        "{} is not a torch file Largo can read: its entry '{}' is compressed or encrypted "
        "(torch files store their entries uncompressed)",
        name_,
        entry.name));
  }
}

void ZipArchive::read_into(const Entry& entry, void* destination) const {
  check_stored(entry);
  read_at(entry.data_offset, destination, entry.size);
  const uint32_t computed = crc32_of(destination, entry.size);
  if (computed != entry.crc32) {
    crc_mismatch(name_, entry, computed);
  }
}

std::string ZipArchive::read(const Entry& entry) const {
  std::string bytes(entry.size, '\0');
  read_into(entry, bytes.data());
  return bytes;
}

void ZipArchive::verify_all() const {
  constexpr uint64_t kChunk = 4 << 20;
  std::vector<char> buffer;
  for (const Entry& entry : entries_) {
    check_stored(entry);
    buffer.resize(std::min(entry.size, kChunk));
    uint32_t crc = 0;
    for (uint64_t done = 0; done < entry.size;) {
      const uint64_t n = std::min(kChunk, entry.size - done);
      read_at(entry.data_offset + done, buffer.data(), n);
      crc = crc32_of(buffer.data(), n, crc);
      done += n;
    }
    if (crc != entry.crc32) {
      crc_mismatch(name_, entry, crc);
    }
  }
}

} // namespace largo::checkpoint
