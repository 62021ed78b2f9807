// Which rank stalled a collective, and in which operation (private to comm/).
//
// When a collective times out, every rank that waited only knows that *someone* did not
// arrive; c10d's message names the waiting rank. Each rank therefore publishes, once per
// heartbeat interval from a thread of its own, a beacon in the job's TCP store:
//   <key prefix>largo/beacon/<rank> = "<heartbeat count> <collective sequence number> <what>"
// (the key prefix scopes a store that outlives the attempt: ProcessGroupOptions::attempt)
// The collective sequence number counts the collectives the rank has started (every rank
// starts the same ones in the same order). After a failure, diagnose() reads every beacon
// twice, a few heartbeats apart: a rank whose heartbeat did not move is stopped (SIGSTOP),
// hung in the kernel or swapped out; a live rank whose sequence number is behind has not
// reached the collective (busy elsewhere, or deadlocked in its own code); a rank at the same
// number in another operation runs a different collective.
//
// The heartbeat thread uses its own connection to the store (the process group's is not
// shared across threads), never blocks a collective, and is detached: a rank whose store
// server (rank 0) is stopped must still be able to exit.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace largo::comm::detail {

class ProgressBeacon {
 public:
  // `store_server` names who serves the store, for the diagnosis ("rank 0").
  ProgressBeacon(
      const std::string& master_addr,
      int master_port,
      std::string key_prefix,
      std::string store_server,
      int rank,
      int world_size,
      std::chrono::milliseconds interval);
  ~ProgressBeacon();
  ProgressBeacon(const ProgressBeacon&) = delete;
  ProgressBeacon& operator=(const ProgressBeacon&) = delete;

  // Records that this rank starts its next collective; returns its sequence number (1, 2, ...).
  int64_t enter(const std::string& what);

  // After this rank's collective `sequence` failed: a sentence naming the ranks that stalled
  // it and what they were doing. Takes about three heartbeat intervals.
  std::string diagnose(int64_t sequence, const std::string& what) const;

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

} // namespace largo::comm::detail
