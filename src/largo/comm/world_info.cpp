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

std::optional<std::string> text_variable(const Getenv& getenv_fn, const char* name) {
  const char* text = getenv_fn(name);
  if (text == nullptr || *text == '\0') {
    return std::nullopt;
  }
  return std::string(text);
}

// SLURM's tasks per node: "8", or "8(x2)" (8 on each of 2 nodes); a list that differs between
// nodes ("8(x2),4") leaves it unknown.
std::optional<int> slurm_tasks_per_node(const Getenv& getenv_fn) {
  const auto text = text_variable(getenv_fn, "SLURM_NTASKS_PER_NODE");
  if (!text || text->find(',') != std::string::npos) {
    return std::nullopt;
  }
  char* end = nullptr;
  const long value = std::strtol(text->c_str(), &end, 10);
  if (end == text->c_str() || value < 1 || value > (1L << 30) || (*end != '\0' && *end != '(')) {
    return std::nullopt;
  }
  return static_cast<int>(value);
}

// Every host of one node-list item ("gpu[001-004,010]-ib"), appended to `hosts`.
void expand_item(const std::string& item, const std::string& variable,
                 std::vector<std::string>& hosts) {
  const auto bad = [&](const std::string& why) {
    return ConfigError(fmt::format(
        "environment variable {} names '{}', which is not a SLURM node list ({}); expected "
        "host names or SLURM's compressed form, e.g. gpu[001-004,010]",
        variable, item, why));
  };
  const auto open = item.find('[');
  if (open == std::string::npos) {
    if (item.find(']') != std::string::npos) {
      throw bad("a ']' without '['");
    }
    hosts.push_back(item);
    return;
  }
  const auto close = item.find(']', open);
  if (close == std::string::npos) {
    throw bad("a '[' without ']'");
  }
  const std::string prefix = item.substr(0, open);
  const std::string ranges = item.substr(open + 1, close - open - 1);
  std::vector<std::string> suffixes;
  expand_item(item.substr(close + 1), variable, suffixes); // "" expands to {""}
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t end = ranges.find(',', start);
    if (end == std::string::npos) {
      end = ranges.size();
    }
    const std::string range = ranges.substr(start, end - start);
    start = end + 1;
    const auto dash = range.find('-');
    const std::string low_text = range.substr(0, dash);
    const std::string high_text = dash == std::string::npos ? low_text : range.substr(dash + 1);
    const auto is_number = [](const std::string& text) {
      return !text.empty() && text.size() <= 9 &&
             text.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!is_number(low_text) || !is_number(high_text)) {
      throw bad(fmt::format("'{}' is not a number or a range of numbers", range));
    }
    const long low = std::stol(low_text);
    const long high = std::stol(high_text);
    if (high < low || high - low > (1L << 20)) {
      throw bad(fmt::format("the range '{}' is empty or too long", range));
    }
    for (long number = low; number <= high; ++number) {
      // SLURM keeps the zero padding of the range's first number: [001-010] -> 001 ... 010.
      const std::string digits = fmt::format("{:0{}}", number, low_text.size());
      for (const auto& suffix : suffixes) {
        hosts.push_back(prefix + digits + suffix);
      }
    }
  }
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

int slurm_default_master_port(int64_t job_id) {
  return 20000 + static_cast<int>(job_id % 10000);
}

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist,
                                               const std::string& variable) {
  std::vector<std::string> hosts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= nodelist.size(); ++i) {
    if (i < nodelist.size() && nodelist[i] == '[') {
      ++depth;
    } else if (i < nodelist.size() && nodelist[i] == ']') {
      --depth;
    } else if (i == nodelist.size() || (nodelist[i] == ',' && depth == 0)) {
      const std::string item = nodelist.substr(start, i - start);
      if (!item.empty()) {
        expand_item(item, variable, hosts);
      }
      start = i + 1;
    }
  }
  if (hosts.empty()) {
    throw ConfigError(fmt::format(
        "environment variable {}='{}' names no host; srun sets it to the job's nodes", variable,
        nodelist));
  }
  return hosts;
}

std::optional<WorldInfo> world_from_environment(const Getenv& getenv_arg,
                                                std::optional<MasterPortFallback> master_port_fallback) {
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
    const bool slurm = std::string(launcher.source) == "slurm";
    if (slurm && rank && !world_size) {
      // srun without --ntasks: SLURM_NNODES x SLURM_NTASKS_PER_NODE tasks.
      const auto nodes = int_variable(getenv_fn, "SLURM_NNODES");
      const auto per_node = slurm_tasks_per_node(getenv_fn);
      if (nodes && per_node) {
        world_size = *nodes * *per_node;
      }
    }
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
    if (slurm) {
      // SLURM_NTASKS_PER_NODE may read "4(x2)", or differ between nodes ("4(x2),2"): then the
      // local world size stays unknown (1).
      info.local_world_size = slurm_tasks_per_node(getenv_fn).value_or(1);
    } else {
      info.local_world_size = int_variable(getenv_fn, launcher.local_world_size).value_or(1);
    }
    if (auto addr = text_variable(getenv_fn, "MASTER_ADDR")) {
      info.master_addr = *addr;
      info.master_addr_origin = "MASTER_ADDR";
    } else if (slurm) {
      // srun starts task 0 on the first node of its step.
      for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
        if (auto nodelist = text_variable(getenv_fn, name)) {
          info.master_addr = expand_slurm_nodelist(*nodelist, name).front();
          info.master_addr_origin = fmt::format("the first host of {}", name);
          break;
        }
      }
    }
    if (auto port = int_variable(getenv_fn, "MASTER_PORT")) {
      info.master_port = *port;
      info.master_port_origin = "MASTER_PORT";
    } else if (master_port_fallback) {
      info.master_port = master_port_fallback->port;
      info.master_port_origin = master_port_fallback->origin;
    } else if (auto job_id = slurm ? int_variable(getenv_fn, "SLURM_JOB_ID") : std::nullopt) {
      info.master_port = slurm_default_master_port(*job_id);
      info.master_port_origin = "20000 + SLURM_JOB_ID mod 10000";
    }
    if (info.master_port < 1 || info.master_port > 65535) {
      throw ConfigError(fmt::format("MASTER_PORT={} is not a TCP port (1-65535)", info.master_port));
    }
    info.launcher_serves_store =
        text_variable(getenv_fn, "TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    info.restart_count = int_variable(getenv_fn, "TORCHELASTIC_RESTART_COUNT").value_or(0);
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
