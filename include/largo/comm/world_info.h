// Who this process is in a distributed job, read from the environment that launchers set:
//   largo launch / torchrun / torch.distributed.launch: RANK, WORLD_SIZE, LOCAL_RANK,
//                                                       LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   SLURM (srun):   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
//   Open MPI (mpirun): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                      OMPI_COMM_WORLD_LOCAL_SIZE
// MASTER_ADDR / MASTER_PORT are read under every launcher; the address defaults to
// 127.0.0.1 and the port to 29500. No collectives here: this only reads variables.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace largo::comm {

constexpr int kDefaultMasterPort = 29500;

struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  // Which launcher's variables were read: "env" (RANK/WORLD_SIZE), "slurm", "openmpi" or
  // "single" (none: a single process).
  std::string source = "single";
};

// Reads the variables above (`getenv` is injectable for tests). Returns nullopt when no
// launcher variables are set. Throws ConfigError naming the variable for a value that is not
// a number, a rank outside [0, world_size), or a port outside [1, 65535].
std::optional<WorldInfo> world_from_environment(
    const std::function<const char*(const char*)>& getenv_fn = nullptr);

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0 and read it back), for
// single-node jobs that pick their own rendezvous port.
int find_free_port();

} // namespace largo::comm
