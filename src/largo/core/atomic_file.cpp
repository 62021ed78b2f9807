#include <largo/core/atomic_file.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace largo {
namespace {

[[noreturn]] void fail(const std::string& what, const std::filesystem::path& path) {
  throw Error(fmt::format("{} {}: {}", what, path.string(), std::strerror(errno)));
}

void fsync_directory(const std::filesystem::path& directory) {
  int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    fail("cannot open directory", directory);
  }
  ::fsync(fd); // best effort: some file systems refuse fsync on directories
  ::close(fd);
}

} // namespace

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path) : path_(std::move(path)) {
  std::filesystem::path directory = path_.has_parent_path() ? path_.parent_path() : ".";
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    throw Error(fmt::format("cannot create directory {}: {}", directory.string(), ec.message()));
  }
  temporary_ = path_;
  temporary_ += fmt::format(".tmp.{}", ::getpid());
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    fail("cannot create", temporary_);
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t size) {
  const char* bytes = static_cast<const char*>(data);
  size_t written = 0;
  while (written < size) {
    ssize_t n = ::write(fd_, bytes + written, size - written);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      fail("cannot write", temporary_);
    }
    written += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int saved = errno;
    ::unlink(temporary_.c_str());
    errno = saved;
    fail("cannot flush", temporary_);
  }
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    int saved = errno;
    ::unlink(temporary_.c_str());
    errno = saved;
    fail("cannot rename the new file onto", path_);
  }
  fsync_directory(path_.has_parent_path() ? path_.parent_path() : ".");
}

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  AtomicFileWriter writer(path);
  writer.write(bytes.data(), bytes.size());
  writer.commit();
}

} // namespace largo
