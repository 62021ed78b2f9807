// A process group: the ranks of one job and the collectives Largo needs between them, on
// c10d's ProcessGroupGloo (CPU tensors) or ProcessGroupNCCL (CUDA builds, one GPU per
// process), after a rendezvous through c10d's TCPStore.
//
// Collective contract (as c10d's): every method below except rank()/world_size()/backend()
// is a collective. Every rank must call the same collectives, with tensors of the same
// shape and dtype, in the same order; a rank that skips one makes the others wait until the
// timeout. A collective that fails (a peer died, the timeout passed) throws CommError naming
// the collective and its sequence number, instead of hanging, and the rank that stalled it:
// each rank publishes a heartbeat and its collective count in the store (a thread of its own,
// once per heartbeat_interval), so a rank that stopped (SIGSTOP, hung) or has not reached the
// collective is told apart from one that runs (src/largo/comm/progress_beacon.h).
//
// Tensors are modified in place (all_reduce, broadcast, reduce) or written into the output
// given (all_gather, reduce_scatter); async variants return a Work that must be waited on
// before the tensors are read or freed.
//
// A world of one process (single_process()) needs no rendezvous: its collectives are
// identities, so code written for N ranks runs unchanged on one. create() returns such a
// world for world_size 1 whatever the backend, so no NCCL communicator is made then.
//
// Gloo takes CUDA tensors too (slower than NCCL: each message goes through host memory):
// c10d's Gloo all-reduce and broadcast stage them through pinned host memory, and this
// class's send, recv and Gloo sum reduce copy them to and from the host around the message.
//
// Point to point (send/recv, for pipeline parallelism) is not a collective: only the two
// ranks take part. Sub-groups (new_group) share the job's store; creating one is a
// collective of the parent group (see new_group).
#pragma once

#include <largo/comm/world_info.h>

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace largo::comm {

enum class ReduceOp { kSum, kMax, kMin };

struct ProcessGroupOptions {
  std::string backend = "gloo"; // gloo | nccl (DISTRIBUTED.BACKEND)
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // How long ranks wait for each other to join, and for each collective to finish.
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds collective_timeout{std::chrono::minutes(30)};
  int gloo_threads = 2; // Gloo's worker threads per process
  // How often each rank publishes its heartbeat and collective count to the store, so that a
  // timed-out collective names the rank that stalled it (and what it was doing).
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(1)};
  // Who serves the job's store. false: rank 0 serves it, and it ends with rank 0. true: the
  // launcher does (torchrun's agent, TORCHELASTIC_USE_AGENT_STORE=True), every rank (rank 0
  // too) connects to it, and it outlives one attempt of the job: the keys this group writes
  // (rank claims, world sizes, Gloo's addresses, heartbeats) are then scoped to `attempt`
  // (TORCHELASTIC_RESTART_COUNT), so a restarted job never reads the previous attempt's.
  bool launcher_serves_store = false;
  int attempt = 0;
};

// A collective in flight. wait() blocks until it is done (or throws CommError); a
// default-constructed Work is already done.
class Work {
 public:
  Work() = default;
  void wait();

 private:
  friend class ProcessGroup;
  struct State;
  explicit Work(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

class ProcessGroup {
 public:
  // Joins the job described by `options` (a collective over all ranks: rank 0 serves the
  // TCPStore at master_addr:master_port). Throws CommError when the port is taken, the master
  // cannot be reached, not every rank joined within the rendezvous timeout, two processes
  // claim the same rank, or the ranks disagree about the world size; ConfigError for a bad
  // backend or rank. With more than one rank, SIGPIPE is ignored from then on (unless the
  // program handles it), so a dead peer fails a collective instead of killing this process.
  static std::shared_ptr<ProcessGroup> create(const ProcessGroupOptions& options);

  // Whether this build has the NCCL backend (built against a CUDA libtorch: the
  // LARGO_WITH_NCCL CMake option, docs/distributed.md).
  static bool nccl_built();

  // A world of one: rank 0 of 1, every collective an identity.
  static std::shared_ptr<ProcessGroup> single_process();

  // The job a launcher started this process in (torch.distributed's env://): rank, world
  // size, master, who serves the store and the attempt from world_from_environment()
  // (largo launch / torchrun, SLURM or Open MPI variables; `master_port_fallback` when
  // MASTER_PORT is unset), the rest (backend, timeouts) from `options`; a single process when
  // the environment names no world of more than one rank. Collective like create().
  static std::shared_ptr<ProcessGroup> from_environment(
      ProcessGroupOptions options = {},
      std::optional<MasterPortFallback> master_port_fallback = std::nullopt);

  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int world_size() const;
  const std::string& backend() const; // "gloo", "nccl" or "single"

  // Every rank's `tensor` becomes the reduction of all ranks' tensors.
  Work all_reduce_async(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  void all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);

  // Every rank's `tensor` becomes root's.
  Work broadcast_async(const at::Tensor& tensor, int root);
  void broadcast(const at::Tensor& tensor, int root);

  // root's `tensor` becomes the reduction; the others' tensors are left unspecified. On Gloo
  // a sum is the other ranks sending their tensors straight to the root, which adds them in
  // rank order.
  Work reduce_async(const at::Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum);
  void reduce(const at::Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum);

  // `output` (contiguous, world_size * input.numel() elements) receives every rank's `input`,
  // rank r's at [r * n, (r + 1) * n). `input` may be this rank's part of `output` itself (in
  // place). On Gloo: one broadcast per rank, straight into `output`.
  Work all_gather_async(const at::Tensor& output, const at::Tensor& input);
  void all_gather(const at::Tensor& output, const at::Tensor& input);

  // `input` (contiguous, world_size * n elements) is reduced over ranks and rank r's `output`
  // (n elements) receives part [r * n, (r + 1) * n) of the result. `input` is scratch: its
  // contents are unspecified afterwards (Gloo has no reduce-scatter, so it is all-reduced in
  // place and this rank's part copied out).
  Work reduce_scatter_async(const at::Tensor& output, const at::Tensor& input,
                            ReduceOp op = ReduceOp::kSum);
  void reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                      ReduceOp op = ReduceOp::kSum);

  void barrier();

  // ---- point to point (pipeline parallelism) ----------------------------------------
  // Not collectives: only this rank and the peer take part. A send to `dst` pairs with the
  // recv from this rank with the same tag on `dst`; messages between two ranks with the same
  // tag pair in the order they were issued. `tensor` must be contiguous and stay alive, and
  // unmodified (send) or unread (recv), until the Work is waited for. recv writes into
  // `tensor`, which must have the sender's numel and dtype (nothing describes the message
  // but its bytes). Tags are in [0, 2^30); they never meet the messages reduce() sends.
  // On Gloo, a send completes only once the peer has posted the matching recv, so waiting
  // for a send can block until then; on NCCL tags are ignored and the sends and recvs
  // between two ranks pair in issue order.
  Work send_async(const at::Tensor& tensor, int dst, int tag = 0);
  void send(const at::Tensor& tensor, int dst, int tag = 0);
  Work recv_async(const at::Tensor& tensor, int src, int tag = 0);
  void recv(const at::Tensor& tensor, int src, int tag = 0);

  // ---- sub-groups -------------------------------------------------------------------
  // A process group of the ranks `ranks` (ranks of this group, distinct, in the order that
  // numbers them in the new group: ranks[i] becomes its rank i), on this group's backend and
  // store. Every rank of this group must call new_group, with the same `ranks`, in the same
  // order as its other new_group calls (as torch.distributed.new_group): ranks outside
  // `ranks` get nullptr. The members' call is a rendezvous of the new group (its backend
  // connects); it issues no collective on this group. A group of one rank is a world of one.
  // Throws ConfigError for an empty list, a repeated rank or one outside [0, world_size()).
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);

  // The job-wide rank (the rank in the group made by create()) of this group's rank `rank`:
  // what error messages name. The identity for a group made by create().
  int global_rank(int rank) const;

 private:
  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  Work launch(const std::string& what, const std::function<Work()>& start);
  Work point_to_point(bool sending, const at::Tensor& tensor, int peer, int tag);
  std::unique_ptr<Impl> impl_;
};

} // namespace largo::comm
