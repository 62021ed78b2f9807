// How `largo train` starts: VISSL's DISTRIBUTED.NUM_NODES / NUM_PROC_PER_NODE / INIT_METHOD /
// RUN_ID decide whether this process trains alone, is one worker of a job that a launcher
// started, or starts this node's workers itself (as VISSL's launcher does), through
// comm/launcher.h. Reads the config and the environment only; starts nothing.
//
//  1. Started by a launcher — RANK/WORLD_SIZE (largo launch, torchrun), SLURM_PROCID/
//     SLURM_NTASKS (srun) or OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (mpirun) are set: the
//     environment defines the world and the keys above are not used.
//  2. Otherwise NUM_NODES x NUM_PROC_PER_NODE = 1: one process, no process group.
//  3. Otherwise this process starts NUM_PROC_PER_NODE workers (itself again, as workers of
//     case 1), ranks node_rank * NUM_PROC_PER_NODE + local rank, meeting at the master that
//     INIT_METHOD names:
//       tcp, RUN_ID auto       127.0.0.1 and a free port (one node only)
//       tcp, RUN_ID host:port  that address and port (give every node the same)
//       env                    MASTER_ADDR and MASTER_PORT from the environment
//       file                   not supported (a ConfigError says to use tcp or env)
//     With NUM_NODES > 1 the node's rank is the NODE_RANK environment variable (VISSL passes
//     a node id on its command line; an environment variable lets every node run the same
//     command): 0 on the master's node, 1 ... NUM_NODES - 1 on the others.
#pragma once

#include <largo/comm/launcher.h>
#include <largo/comm/world_info.h>
#include <largo/core/config.h>

#include <functional>
#include <optional>
#include <string>

namespace largo::train {

struct TrainLaunchPlan {
  enum class Kind {
    kSingleProcess,   // case 2
    kExternalWorker,  // case 1: `world` is what the environment says
    kSpawnWorkers,    // case 3: start workers with `launcher`
  };
  Kind kind = Kind::kSingleProcess;
  std::optional<comm::WorldInfo> world;
  comm::LauncherOptions launcher; // master_port 0: a free port, picked when the workers start
  std::string master_origin;      // where the master address came from, for messages
};

// The checks that need only the config (what `largo config` runs): throws ConfigError naming
// the key and its value for NUM_NODES or NUM_PROC_PER_NODE < 1 and, when there are workers
// to start, an INIT_METHOD other than tcp / env (file is refused) or a RUN_ID that is neither
// auto nor host:port. RUN_ID auto with NUM_NODES > 1 is valid: a launcher (srun) gives the
// master; plan_train_launch refuses it when largo train would start the workers itself.
void validate_launch_config(const Config& config);

// DISTRIBUTED.RUN_ID's port when INIT_METHOD is tcp and RUN_ID is host:port (nullopt for
// auto or INIT_METHOD env): the master port of a job whose launcher sets no MASTER_PORT
// (srun, mpirun). Throws validate_launch_config's error for a malformed RUN_ID.
std::optional<comm::MasterPortFallback> run_id_master_port(const Config& config);

// validate_launch_config's errors, and also, when largo train starts the workers itself:
// RUN_ID auto with NUM_NODES > 1, a missing or out-of-range NODE_RANK with NUM_NODES > 1
// (both from the environment), or INIT_METHOD env without MASTER_PORT (or without
// MASTER_ADDR on several nodes). `getenv_fn` is injectable for tests.
TrainLaunchPlan plan_train_launch(const Config& config,
                                  const std::function<const char*(const char*)>& getenv_fn = nullptr);

} // namespace largo::train
