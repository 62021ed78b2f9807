#include <largo/comm/world_info.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace largo::comm {
namespace {

using Getenv = std::function<const char*(const char*)>;

std::optional<int> int_variable(const Getenv& getenv_fn, const char* name) {
  const char* text = getenv_fn(name);
  if (text == nullptr || *text == '\0') {
    return std::nullopt;
  }
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < 0 || value > (1L << 30)) {
    throw ConfigError(fmt::format(
        "environment variable {}='{}' is not a non-negative integer; the launcher that started "
        "this process set it wrongly",
        name, text));
  }
  return static_cast<int>(value);
}

// The names of one launcher's rank variables.
struct LauncherVariables {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

} // namespace

std::optional<WorldInfo> world_from_environment(const Getenv& getenv_arg) {
  const Getenv getenv_fn = getenv_arg ? getenv_arg : [](const char* name) -> const char* {
    return std::getenv(name);
  };
  // torchrun's variables win: `largo launch` sets them, and a torchrun job inside a SLURM
  // allocation carries SLURM variables that describe the allocation, not the workers.
  const LauncherVariables launchers[] = {
      {"env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
  };
  for (const auto& launcher : launchers) {
    auto rank = int_variable(getenv_fn, launcher.rank);
    auto world_size = int_variable(getenv_fn, launcher.world_size);
    if (!rank && !world_size) {
      continue;
    }
    if (!rank || !world_size) {
      throw ConfigError(fmt::format(
          "{} is set but {} is not; a distributed launcher sets both (largo launch, torchrun, "
          "srun and mpirun do)",
          rank ? launcher.rank : launcher.world_size, rank ? launcher.world_size : launcher.rank));
    }
    if (*world_size < 1 || *rank >= *world_size) {
      throw ConfigError(fmt::format("{}={} with {}={}: the rank must be in [0, world size)",
                                    launcher.rank, *rank, launcher.world_size, *world_size));
    }
    WorldInfo info;
    info.source = launcher.source;
    info.rank = *rank;
    info.world_size = *world_size;
    info.local_rank = int_variable(getenv_fn, launcher.local_rank).value_or(0);
    // SLURM_NTASKS_PER_NODE may read "4(x2)" on heterogeneous allocations; only a plain
    // number is used, otherwise the local world size stays unknown (1).
    try {
      info.local_world_size = int_variable(getenv_fn, launcher.local_world_size).value_or(1);
    } catch (const ConfigError&) {
      info.local_world_size = 1;
    }
    if (const char* addr = getenv_fn("MASTER_ADDR"); addr != nullptr && *addr != '\0') {
      info.master_addr = addr;
    }
    info.master_port = int_variable(getenv_fn, "MASTER_PORT").value_or(kDefaultMasterPort);
    if (info.master_port < 1 || info.master_port > 65535) {
      throw ConfigError(fmt::format("MASTER_PORT={} is not a TCP port (1-65535)", info.master_port));
    }
    return info;
  }
  return std::nullopt;
}

int find_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    throw CommError(fmt::format("could not open a socket to find a free port: {}",
                                std::strerror(errno)));
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    int error = errno;
    ::close(fd);
    throw CommError(fmt::format("could not bind a socket on 127.0.0.1 to find a free port: {}",
                                std::strerror(error)));
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

} // namespace largo::comm
