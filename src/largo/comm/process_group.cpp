#include <largo/comm/process_group.h>

#include "failure_advice.h"
#include "progress_beacon.h"
#include <largo/comm/world_info.h>

#include <largo/core/byte_format.h>
#include <largo/core/error.h>
#include <largo/core/error_report.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(LARGO_WITH_NCCL)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <thread>

namespace largo::comm {
namespace {

// A peer that died leaves its sockets closed; writing to one must fail the collective with
// EPIPE (a CommError naming the operation), not kill this process with SIGPIPE. Gloo writes
// with writev, which cannot pass MSG_NOSIGNAL, so the signal is ignored for the process, as
// the Python interpreter (and so PyTorch) does at start-up. A handler the program installed
// is left alone.
void ignore_broken_pipe_signal() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
  case ReduceOp::kSum:
    return c10d::ReduceOp::SUM;
  case ReduceOp::kMax:
    return c10d::ReduceOp::MAX;
  case ReduceOp::kMin:
    return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

std::string describe_bytes(const at::Tensor& tensor) {
  return format_bytes(static_cast<double>(tensor.numel() * tensor.element_size()));
}

// c10d's Gloo send and recv hand the tensor's memory to Gloo's TCP transport as it is, and
// that transport reads and writes host memory only (its collectives stage CUDA tensors
// through pinned host memory themselves; send and recv do not): a CUDA tensor is copied to
// the host first. A CPU tensor is returned as it is.
at::Tensor host_copy_for_gloo(const at::Tensor& tensor) {
  return tensor.is_cuda() ? tensor.to(at::kCPU) : tensor;
}

bool is_loopback(const std::string& address) {
  return address == "127.0.0.1" || address == "localhost" || address == "::1";
}

// The Gloo transport device: the interface named by GLOO_SOCKET_IFNAME (as PyTorch does),
// loopback for a job on 127.0.0.1, otherwise the address this host's name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  }
  if (is_loopback(master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

} // namespace

// ---- Work ---------------------------------------------------------------------------

struct Work::State {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<c10::intrusive_ptr<c10d::Work>> more_work; // a collective made of several
  std::function<void()> then; // runs once after a successful wait (e.g. a fallback's copy)
  std::string operation;      // "all_reduce of 1.2 MiB": the same on every rank
  std::string what;           // "all_reduce of 1.2 MiB (collective #12) on rank 0 of 2 (gloo)"
  int64_t sequence = 0;       // this rank's collective count (progress_beacon.h)
  std::shared_ptr<detail::ProgressBeacon> beacon; // null in a world of one
  std::chrono::milliseconds timeout{0};
  bool done = false;
};

namespace {

// c10d's own words, first line only and without stack frames: what failed at the socket.
std::string c10d_reason(const std::exception& e) {
  const std::string text = without_stack_trace(e.what());
  return text.substr(0, text.find('\n'));
}

} // namespace

Work::Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

void Work::wait() {
  if (!state_ || state_->done) {
    return;
  }
  state_->done = true;
  try {
    if (state_->work) {
      state_->work->wait(state_->timeout);
    }
    for (const auto& work : state_->more_work) {
      work->wait(state_->timeout);
    }
  } catch (const std::exception& e) {
    // Which rank stalled it, and where: the beacons say (a few seconds, on failure only).
    const std::string diagnosis =
        state_->beacon
            ? state_->beacon->diagnose(state_->sequence, state_->operation)
            : "a peer process has probably died, stalled or is running a different collective";
    throw CommError(fmt::format(
        "{} failed: {}. (c10d: {}; the timeout is {} s: DISTRIBUTED.COLLECTIVE_TIMEOUT_SECONDS)",
        state_->what,
        diagnosis,
        c10d_reason(e),
        state_->timeout.count() / 1000));
  }
  if (state_->then) {
    state_->then();
  }
}

// ---- ProcessGroup -------------------------------------------------------------------

struct ProcessGroup::Impl {
  int rank = 0;
  int world_size = 1;
  std::string backend_name = "single";
  std::chrono::milliseconds collective_timeout{std::chrono::minutes(30)};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;       // null for a world of one
  std::shared_ptr<detail::ProgressBeacon> beacon;  // null for a world of one
  // Tag of the next point-to-point message pair (Gloo's sum reduce): every rank issues the
  // same collectives in the same order, so the counters agree.
  int next_p2p_tag = 1;
  // For sub-groups (new_group): how this group's backend was made, how many new_group calls
  // it has seen (every rank counts them alike, so each sub-group gets the same store prefix
  // on all its members), and the job-wide rank of each of its ranks (empty: the identity).
  std::string master_addr = "127.0.0.1";
  int gloo_threads = 2;
  int next_group_id = 0;
  std::vector<int> global_ranks;
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

bool ProcessGroup::nccl_built() {
#if defined(LARGO_WITH_NCCL)
  return true;
#else
  return false;
#endif
}

std::shared_ptr<ProcessGroup> ProcessGroup::from_environment(
    ProcessGroupOptions options,
    std::optional<MasterPortFallback> master_port_fallback) {
  const auto world = world_from_environment(nullptr, std::move(master_port_fallback));
  if (!world || world->world_size == 1) {
    return single_process();
  }
  options.rank = world->rank;
  options.world_size = world->world_size;
  options.master_addr = world->master_addr;
  options.master_port = world->master_port;
  options.launcher_serves_store = world->launcher_serves_store;
  options.attempt = world->restart_count;
  return create(options);
}

std::shared_ptr<ProcessGroup> ProcessGroup::single_process() {
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::make_unique<Impl>()));
}

namespace {

// The prefix of every key this job writes in the store: a store the launcher serves outlives
// an attempt, so each attempt gets keys of its own (ProcessGroupOptions::attempt).
std::string job_key_prefix(const ProcessGroupOptions& options) {
  return options.launcher_serves_store ? fmt::format("largo/attempt_{}/", options.attempt) : "";
}

// Rank 0 serves the store (unless the launcher does); the others connect to it. c10d's errors
// are turned into ones that say which of the usual causes it is.
c10::intrusive_ptr<c10d::Store> connect_store(const ProcessGroupOptions& options) {
  const bool serves = options.rank == 0 && !options.launcher_serves_store;
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(options.master_port);
  store_options.isServer = serves;
  store_options.numWorkers = static_cast<std::size_t>(options.world_size);
  // A launcher's store counts its own clients (torchrun's agents) and every attempt's: only a
  // store of this job's own waits for its workers (check_world waits for the others anyway).
  store_options.waitWorkers = !options.launcher_serves_store;
  store_options.timeout = options.rendezvous_timeout;
  const std::string where = fmt::format("{}:{}", options.master_addr, options.master_port);
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
    if (!options.launcher_serves_store) {
      return store;
    }
    std::string prefix = job_key_prefix(options);
    prefix.pop_back(); // PrefixStore adds the '/'
    return c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  } catch (const std::exception& e) {
    const std::string message = e.what();
    const long seconds = static_cast<long>(options.rendezvous_timeout.count() / 1000);
    if (options.launcher_serves_store) {
      throw CommError(fmt::format(
          "rank {} could not reach the store that its launcher (torchrun's agent, "
          "TORCHELASTIC_USE_AGENT_STORE=True) serves at {} within {} s: has the launcher "
          "stopped? c10d said: {}",
          options.rank,
          where,
          seconds,
          c10d_reason(e)));
    }
    if (options.rank == 0 && (message.find("in use") != std::string::npos ||
                              message.find("failed to listen") != std::string::npos ||
                              message.find("bind") != std::string::npos)) {
      throw CommError(fmt::format(
          "rank 0 could not serve the rendezvous at {}: the port is already in use (another "
          "job, or a previous run still exiting); choose another port (largo launch "
          "--master_port, MASTER_PORT, or DISTRIBUTED.RUN_ID=host:port). c10d said: {}",
          where,
          message));
    }
    if (options.rank == 0) {
      throw CommError(fmt::format(
          "rank 0 served the rendezvous at {} but not all {} ranks joined within {} s; start "
          "every rank (world size {}) or check the other ranks' errors. c10d said: {}",
          where,
          options.world_size,
          seconds,
          options.world_size,
          message));
    }
    throw CommError(fmt::format(
        "rank {} could not reach the rendezvous master at {} within {} s: is rank 0 running, "
        "and are MASTER_ADDR and MASTER_PORT right? c10d said: {}",
        options.rank,
        where,
        seconds,
        message));
  }
}

// Catches two processes started with the same rank, and ranks started with different world
// sizes, before Gloo would hang or pair the wrong peers. Rank 0 compares every rank's world
// size with its own and publishes a verdict; it waits until the others have read it before
// it stops, so every rank can report the mismatch rather than a lost connection.
void check_world(c10d::Store& store, const ProcessGroupOptions& options) {
  auto text_of = [&](const std::string& key) {
    store.wait({key}, options.rendezvous_timeout);
    auto bytes = store.get(key);
    return std::string(bytes.begin(), bytes.end());
  };
  auto set_text = [&](const std::string& key, const std::string& text) {
    store.set(key, std::vector<uint8_t>(text.begin(), text.end()));
  };
  const std::string own_size = std::to_string(options.world_size);
  auto mismatch = [&](int other_rank, const std::string& other_size) {
    return fmt::format(
        "world size mismatch: rank {} was started with world size {} but rank {} with {}; start "
        "every process of the job with the same WORLD_SIZE (nnodes x nproc_per_node)",
        options.rank,
        own_size,
        other_rank,
        other_size);
  };
  try {
    if (store.add(fmt::format("largo/rank_claimed/{}", options.rank), 1) > 1) {
      throw CommError(fmt::format(
          "two processes claim rank {} of this job{}; every process needs a distinct RANK in "
          "[0, {})",
          options.rank,
          options.launcher_serves_store
              ? fmt::format(" in attempt {} (TORCHELASTIC_RESTART_COUNT)", options.attempt)
              : "",
          options.world_size));
    }
    set_text(fmt::format("largo/world_size/{}", options.rank), own_size);
    if (options.rank == 0) {
      std::string verdict;
      for (int other = 1; other < options.world_size && verdict.empty(); ++other) {
        const std::string other_size = text_of(fmt::format("largo/world_size/{}", other));
        if (other_size != own_size) {
          verdict = mismatch(other, other_size);
        }
      }
      set_text("largo/world_verdict", verdict);
      const auto deadline = std::chrono::steady_clock::now() + options.rendezvous_timeout;
      while (store.add("largo/world_verdict_read", 0) < options.world_size - 1 &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!verdict.empty()) {
        throw CommError(verdict);
      }
      return;
    }
    const std::string verdict = text_of("largo/world_verdict");
    const std::string rank0_size = text_of("largo/world_size/0");
    store.add("largo/world_verdict_read", 1);
    if (rank0_size != own_size) {
      throw CommError(mismatch(0, rank0_size));
    }
    if (!verdict.empty()) {
      throw CommError(verdict);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(fmt::format(
        "rank {} lost the rendezvous master at {}:{} while checking the job ({}): rank 0 has "
        "probably stopped with an error; see its output",
        options.rank,
        options.master_addr,
        options.master_port,
        e.what()));
  }
}

} // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::create(const ProcessGroupOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw ConfigError(fmt::format(
        "rank {} of world size {}: expected 0 <= rank < world size >= 1",
        options.rank,
        options.world_size));
  }
  if (options.backend != "gloo" && options.backend != "nccl") {
    throw ConfigError(fmt::format(
        "DISTRIBUTED.BACKEND = {}: expected gloo (CPU tensors) or nccl (CUDA tensors)",
        options.backend));
  }
  if (options.world_size == 1) {
    auto group = single_process();
    group->impl_->collective_timeout = options.collective_timeout;
    return group;
  }
  ignore_broken_pipe_signal();
  auto impl = std::make_unique<Impl>();
  impl->rank = options.rank;
  impl->world_size = options.world_size;
  impl->backend_name = options.backend;
  impl->collective_timeout = options.collective_timeout;
  impl->master_addr = options.master_addr;
  impl->gloo_threads = options.gloo_threads;
  auto tcp_store = connect_store(options);
  check_world(*tcp_store, options);
  impl->store = c10::make_intrusive<c10d::PrefixStore>("largo/" + options.backend, tcp_store);
  try {
    impl->beacon = std::make_shared<detail::ProgressBeacon>(
        options.master_addr,
        options.master_port,
        job_key_prefix(options),
        options.launcher_serves_store ? "the launcher (torchrun's agent)" : "rank 0",
        options.rank,
        options.world_size,
        options.heartbeat_interval);
  } catch (const std::exception& e) {
    throw CommError(fmt::format(
        "rank {} lost the rendezvous master at {}:{}: {}",
        options.rank,
        options.master_addr,
        options.master_port,
        c10d_reason(e)));
  }
  try {
    if (options.backend == "gloo") {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.collective_timeout);
      gloo_options->devices.push_back(gloo_device(options.master_addr));
      gloo_options->threads = options.gloo_threads;
      impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
          impl->store, options.rank, options.world_size, gloo_options);
    } else {
#if defined(LARGO_WITH_NCCL)
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = options.collective_timeout;
      impl->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          impl->store, options.rank, options.world_size, nccl_options);
#else
      throw OptionError(
          "ProcessGroupOptions::backend",
          "nccl",
          "gloo: this build of Largo has no NCCL, having been built against a "
          "libtorch without CUDA (docs/distributed.md, GPUs and NCCL, says how to "
          "build against a CUDA libtorch)");
#endif
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(fmt::format(
        "rank {} of {} could not connect its {} process group to its "
        "peers: {}",
        options.rank,
        options.world_size,
        options.backend,
        e.what()));
  }
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

int ProcessGroup::rank() const {
  return impl_->rank;
}

int ProcessGroup::world_size() const {
  return impl_->world_size;
}

const std::string& ProcessGroup::backend() const {
  return impl_->backend_name;
}

// Starts a collective, turning c10d's synchronous errors (a dead peer is often noticed at
// launch; NCCL refuses what it cannot do) into CommError with the same wording as
// Work::wait's.
Work ProcessGroup::launch(const std::string& what, const std::function<Work()>& start) {
  try {
    return start();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string reason = c10d_reason(e);
    throw CommError(
        fmt::format("{} failed: {}. {}", what, reason, detail::launch_failure_advice(reason)));
  }
}

namespace {

std::string operation_of(const char* collective, const at::Tensor& tensor) {
  return fmt::format("{} of {}", collective, describe_bytes(tensor));
}

} // namespace

#define LARGO_WORK_STATE(collective, tensor)                                                       \
  auto state = std::make_shared<Work::State>();                                                    \
  state->operation = operation_of(collective, tensor);                                             \
  state->beacon = impl_->beacon;                                                                   \
  state->sequence = impl_->beacon ? impl_->beacon->enter(state->operation) : 0;                    \
  state->what = fmt::format(                                                                       \
      "{} (collective #{}) on rank {} of {} ({})",                                                 \
      state->operation,                                                                            \
      state->sequence,                                                                             \
      impl_->rank,                                                                                 \
      impl_->world_size,                                                                           \
      impl_->backend_name);                                                                        \
  state->timeout = impl_->collective_timeout

Work ProcessGroup::all_reduce_async(const at::Tensor& tensor, ReduceOp op) {
  if (!impl_->backend) {
    return Work();
  }
  LARGO_WORK_STATE("all_reduce", tensor);
  return launch(state->what, [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    state->work = impl_->backend->allreduce(tensors, options);
    return Work(state);
  });
}

void ProcessGroup::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op).wait();
}

Work ProcessGroup::broadcast_async(const at::Tensor& tensor, int root) {
  if (!impl_->backend) {
    return Work();
  }
  LARGO_WORK_STATE("broadcast", tensor);
  return launch(state->what, [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    state->work = impl_->backend->broadcast(tensors, options);
    return Work(state);
  });
}

void ProcessGroup::broadcast(const at::Tensor& tensor, int root) {
  broadcast_async(tensor, root).wait();
}

Work ProcessGroup::reduce_async(const at::Tensor& tensor, int root, ReduceOp op) {
  if (!impl_->backend) {
    return Work();
  }
  LARGO_WORK_STATE("reduce", tensor);
  if (impl_->backend_name == "gloo" && op == ReduceOp::kSum && tensor.is_contiguous()) {
    // Every other rank sends its tensor straight to the root, which adds them up in rank
    // order. Gloo's reduce is a ring (a reduce-scatter, then the parts sent to the root): on
    // 2 ranks each rank sends 3/4 of the tensor instead of the 1/2 here. When the roots of
    // a series of reduces take turns, as the owners of ZeRO-2's buckets do, the sends are a
    // reduce-scatter with the least traffic possible. A CUDA tensor travels through host
    // memory (host_copy_for_gloo), as c10d's Gloo collectives move theirs.
    const int tag = impl_->next_p2p_tag++;
    return launch(state->what, [&] {
      if (impl_->rank != root) {
        std::vector<at::Tensor> tensors{host_copy_for_gloo(tensor)};
        state->work = impl_->backend->send(tensors, root, tag);
        return Work(state);
      }
      std::vector<at::Tensor> received;
      for (int r = 0; r < impl_->world_size; ++r) {
        if (r == root) {
          continue;
        }
        received.push_back(at::empty_like(tensor, at::TensorOptions().device(at::kCPU)));
        std::vector<at::Tensor> tensors{received.back()};
        auto work = impl_->backend->recv(tensors, r, tag);
        if (!state->work) {
          state->work = std::move(work);
        } else {
          state->more_work.push_back(std::move(work));
        }
      }
      state->then = [tensor, received] {
        at::NoGradGuard no_grad;
        for (const at::Tensor& part : received) {
          tensor.add_(part.to(tensor.device()));
        }
      };
      return Work(state);
    });
  }
  return launch(state->what, [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::ReduceOptions options;
    options.rootRank = root;
    options.reduceOp = to_c10d(op);
    state->work = impl_->backend->reduce(tensors, options);
    return Work(state);
  });
}

void ProcessGroup::reduce(const at::Tensor& tensor, int root, ReduceOp op) {
  reduce_async(tensor, root, op).wait();
}

Work ProcessGroup::all_gather_async(const at::Tensor& output, const at::Tensor& input) {
  TORCH_CHECK(
      output.is_contiguous() && output.numel() == input.numel() * impl_->world_size,
      "all_gather: output must be contiguous with world_size * input.numel() elements");
  if (!impl_->backend) {
    output.view_as(input).copy_(input);
    return Work();
  }
  LARGO_WORK_STATE("all_gather", output);
  return launch(state->what, [&] {
    if (impl_->backend_name == "nccl") {
      at::Tensor output_tensor = output;
      at::Tensor input_tensor = input;
      state->work = impl_->backend->_allgather_base(output_tensor, input_tensor);
      return Work(state);
    }
    // Gloo: one broadcast per rank, each straight into that rank's part of the output.
    // Gloo's own allgather gathers into a fresh flat buffer and copies it out, which for a
    // large model-state buffer costs an allocation (page faults) and a full copy every call.
    const int64_t n = input.numel();
    at::Tensor flat_output = output.view({-1});
    at::Tensor own = flat_output.narrow(0, static_cast<int64_t>(impl_->rank) * n, n);
    if (own.data_ptr() != input.data_ptr()) { // not gathering in place
      own.copy_(input.reshape({-1}));
    }
    for (int r = 0; r < impl_->world_size; ++r) {
      std::vector<at::Tensor> part{flat_output.narrow(0, r * n, n)};
      c10d::BroadcastOptions options;
      options.rootRank = r;
      auto work = impl_->backend->broadcast(part, options);
      if (r == 0) {
        state->work = std::move(work);
      } else {
        state->more_work.push_back(std::move(work));
      }
    }
    return Work(state);
  });
}

void ProcessGroup::all_gather(const at::Tensor& output, const at::Tensor& input) {
  all_gather_async(output, input).wait();
}

Work ProcessGroup::reduce_scatter_async(
    const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  TORCH_CHECK(
      input.is_contiguous() && input.numel() == output.numel() * impl_->world_size,
      "reduce_scatter: input must be contiguous with world_size * output.numel() "
      "elements");
  const int64_t n = output.numel();
  if (!impl_->backend) {
    output.copy_(input.view({-1}).narrow(0, 0, n).view_as(output));
    return Work();
  }
  LARGO_WORK_STATE("reduce_scatter", input);
  return launch(state->what, [&] {
    if (impl_->backend_name == "nccl") {
      at::Tensor output_tensor = output;
      at::Tensor input_tensor = input;
      c10d::ReduceScatterOptions options;
      options.reduceOp = to_c10d(op);
      state->work = impl_->backend->_reduce_scatter_base(output_tensor, input_tensor, options);
      return Work(state);
    }
    // Gloo has no reduce-scatter here: all-reduce the whole input in place (it is the
    // caller's scratch, see the header) and keep this rank's part.
    std::vector<at::Tensor> tensors{input};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    state->work = impl_->backend->allreduce(tensors, options);
    const int rank = impl_->rank;
    state->then = [output, input, rank, n] {
      output.copy_(input.view({-1}).narrow(0, rank * n, n).view_as(output));
    };
    return Work(state);
  });
}

void ProcessGroup::reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  reduce_scatter_async(output, input, op).wait();
}

void ProcessGroup::barrier() {
  if (!impl_->backend) {
    return;
  }
  if (impl_->backend_name == "nccl") {
    at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    all_reduce(token);
    return;
  }
  // On Gloo, a one-element all-reduce: it gets the same timeout and error reporting as every
  // other collective.
  all_reduce(at::zeros({1}, at::kFloat));
}

// ---- point to point ------------------------------------------------------------------

namespace {

// Point-to-point tags live above the ones reduce() numbers from 1, so the two never pair.
constexpr int kPointToPointTagBase = 1 << 30;

} // namespace

int ProcessGroup::global_rank(int rank) const {
  if (rank < 0 || rank >= impl_->world_size) {
    throw Error(
        fmt::format("global_rank({}): expected a rank in [0, {})", rank, impl_->world_size));
  }
  return impl_->global_ranks.empty() ? rank : impl_->global_ranks[rank];
}

// A send or a receive: checks the peer and the tag, names the Work, starts it.
Work ProcessGroup::point_to_point(bool sending, const at::Tensor& tensor, int peer, int tag) {
  const char* what = sending ? "send" : "recv";
  if (peer < 0 || peer >= impl_->world_size || peer == impl_->rank) {
    throw Error(fmt::format(
        "{} on rank {} of {}: peer rank {} must be another rank of the group",
        what,
        impl_->rank,
        impl_->world_size,
        peer));
  }
  if (tag < 0 || tag >= kPointToPointTagBase) {
    throw Error(fmt::format("{}: tag {} is outside [0, 2^30)", what, tag));
  }
  TORCH_CHECK(tensor.is_contiguous(), what, ": the tensor must be contiguous");
  auto state = std::make_shared<Work::State>();
  state->what = fmt::format(
      "{} of {} {} rank {} (job rank {}) on rank {} of {} ({})",
      what,
      describe_bytes(tensor),
      sending ? "to" : "from",
      peer,
      global_rank(peer),
      impl_->rank,
      impl_->world_size,
      impl_->backend_name);
  state->timeout = impl_->collective_timeout;
  return launch(state->what, [&] {
    // On Gloo a CUDA tensor is sent from a host copy, or received into one and copied to
    // the device once the message is in (host_copy_for_gloo).
    const bool staged = impl_->backend_name == "gloo" && tensor.is_cuda();
    at::Tensor wire = tensor;
    if (staged) {
      wire = sending ? host_copy_for_gloo(tensor)
                     : at::empty_like(tensor, at::TensorOptions().device(at::kCPU));
    }
    std::vector<at::Tensor> tensors{wire};
    state->work = sending ? impl_->backend->send(tensors, peer, kPointToPointTagBase + tag)
                          : impl_->backend->recv(tensors, peer, kPointToPointTagBase + tag);
    if (staged && !sending) {
      state->then = [tensor, wire] {
        at::NoGradGuard no_grad;
        tensor.copy_(wire);
      };
    }
    return Work(state);
  });
}

Work ProcessGroup::send_async(const at::Tensor& tensor, int dst, int tag) {
  return point_to_point(/*sending=*/true, tensor, dst, tag);
}

void ProcessGroup::send(const at::Tensor& tensor, int dst, int tag) {
  send_async(tensor, dst, tag).wait();
}

Work ProcessGroup::recv_async(const at::Tensor& tensor, int src, int tag) {
  return point_to_point(/*sending=*/false, tensor, src, tag);
}

void ProcessGroup::recv(const at::Tensor& tensor, int src, int tag) {
  recv_async(tensor, src, tag).wait();
}

// ---- sub-groups ---------------------------------------------------------------------

namespace {

void check_group_ranks(const std::vector<int>& ranks, int world_size) {
  std::vector<bool> seen(static_cast<size_t>(world_size), false);
  if (ranks.empty()) {
    throw ConfigError("new_group: the list of ranks is empty; name at least one rank");
  }
  for (int rank : ranks) {
    if (rank < 0 || rank >= world_size) {
      throw ConfigError(
          fmt::format("new_group: rank {} is outside the group's ranks [0, {})", rank, world_size));
    }
    if (seen[static_cast<size_t>(rank)]) {
      throw ConfigError(fmt::format("new_group: rank {} is listed twice", rank));
    }
    seen[static_cast<size_t>(rank)] = true;
  }
}

} // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks) {
  check_group_ranks(ranks, impl_->world_size);
  const int group_id = impl_->next_group_id++;
  const auto own = std::find(ranks.begin(), ranks.end(), impl_->rank);
  if (own == ranks.end()) {
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->rank = static_cast<int>(own - ranks.begin());
  impl->world_size = static_cast<int>(ranks.size());
  impl->collective_timeout = impl_->collective_timeout;
  impl->master_addr = impl_->master_addr;
  impl->gloo_threads = impl_->gloo_threads;
  for (int rank : ranks) {
    impl->global_ranks.push_back(global_rank(rank));
  }
  if (ranks.size() == 1 || !impl_->backend) {
    return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
  }
  impl->backend_name = impl_->backend_name;
  impl->store =
      c10::make_intrusive<c10d::PrefixStore>(fmt::format("group{}", group_id), impl_->store);
  try {
    if (impl->backend_name == "gloo") {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(impl->collective_timeout);
      gloo_options->devices.push_back(gloo_device(impl->master_addr));
      gloo_options->threads = impl->gloo_threads;
      impl->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(
          impl->store, impl->rank, impl->world_size, gloo_options);
    } else {
#if defined(LARGO_WITH_NCCL)
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = impl->collective_timeout;
      impl->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          impl->store, impl->rank, impl->world_size, nccl_options);
#endif
    }
  } catch (const std::exception& e) {
    throw CommError(fmt::format(
        "rank {} could not connect the sub-group of ranks [{}] (group {} of its parent) to its "
        "peers: {}. Every rank of the parent group must call new_group with the same ranks in "
        "the same order",
        impl_->rank,
        fmt::join(ranks, ", "),
        group_id,
        e.what()));
  }
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

} // namespace largo::comm
