// Who this process is in a distributed job, read from the environment that launchers set:
//   largo launch / torchrun / torch.distributed.launch: RANK, WORLD_SIZE, LOCAL_RANK,
//                                                       LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   SLURM (srun):   SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
//   Open MPI (mpirun): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                      OMPI_COMM_WORLD_LOCAL_SIZE
// MASTER_ADDR / MASTER_PORT are read under every launcher. When they are unset:
//   address  SLURM: the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST (the compressed
//            form, gpu[001-004,010], is expanded here; scontrol is not called), where srun
//            starts task 0; otherwise 127.0.0.1
//   port     the caller's fallback (the `largo` program: DISTRIBUTED.RUN_ID's port); otherwise
//            SLURM: slurm_default_master_port(SLURM_JOB_ID), so two jobs sharing a node differ;
//            otherwise 29500
// torchrun also says whether its agent serves the job's store (TORCHELASTIC_USE_AGENT_STORE)
// and which attempt this is (TORCHELASTIC_RESTART_COUNT); process_group.h uses both.
// No collectives here: this only reads variables.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace largo::comm {

constexpr int kDefaultMasterPort = 29500;

// The master port of a SLURM job that sets no MASTER_PORT (and whose caller gives no
// fallback): 20000 + SLURM_JOB_ID mod 10000, the same on every task of the job.
int slurm_default_master_port(int64_t job_id);

// The hosts of a SLURM node list in its compressed form ("gpu[001-004,010],login1",
// "rack[1-2]-n[1-2]"), in SLURM's order, without calling scontrol. Throws ConfigError naming
// `variable` for a list that is not well formed.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist,
                                               const std::string& variable = "SLURM_JOB_NODELIST");

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
  // Where master_addr and master_port came from, for messages: "MASTER_ADDR", "the first host
  // of SLURM_JOB_NODELIST", "the default", ...
  std::string master_addr_origin = "the default";
  std::string master_port_origin = "the default";
  // torchrun: its agent serves the job's store at MASTER_ADDR:MASTER_PORT and keeps it across
  // restarts (TORCHELASTIC_USE_AGENT_STORE=True), and the attempt this process belongs to
  // (TORCHELASTIC_RESTART_COUNT; 0 without a restarting launcher).
  bool launcher_serves_store = false;
  int restart_count = 0;
};

// The master port when MASTER_PORT is unset, and what to call it in messages.
struct MasterPortFallback {
  int port = kDefaultMasterPort;
  std::string origin; // e.g. "DISTRIBUTED.RUN_ID"
};

// Reads the variables above (`getenv` is injectable for tests); `master_port_fallback` is the
// port when MASTER_PORT is unset. Returns nullopt when no launcher variables are set. Throws
// ConfigError naming the variable for a value that is not a number, a rank outside
// [0, world_size), a port outside [1, 65535] or a SLURM node list that cannot be read.
std::optional<WorldInfo> world_from_environment(
    const std::function<const char*(const char*)>& getenv_fn = nullptr,
    std::optional<MasterPortFallback> master_port_fallback = std::nullopt);

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0 and read it back), for
// single-node jobs that pick their own rendezvous port.
int find_free_port();

} // namespace largo::comm
