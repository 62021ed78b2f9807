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

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : ".";
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    throw Error(fmt::format("cannot create directory {}: {}", directory.string(), ec.message()));
  }
  std::filesystem::path temporary = path;
  temporary += fmt::format(".tmp.{}", ::getpid());

  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fail("cannot create", temporary);
  }
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      int saved = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      errno = saved;
      fail("cannot write", temporary);
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int saved = errno;
    ::unlink(temporary.c_str());
    errno = saved;
    fail("cannot flush", temporary);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(temporary.c_str());
    errno = saved;
    fail("cannot rename the new file onto", path);
  }
  fsync_directory(directory);
}

} // namespace largo
