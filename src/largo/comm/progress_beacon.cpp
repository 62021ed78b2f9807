#include "progress_beacon.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

namespace largo::comm::detail {
namespace {

struct Beacon {
  bool read = false; // false: the store did not answer
  int64_t heartbeat = -1;
  int64_t sequence = 0;
  std::string what; // the collective it last started
};

} // namespace

struct ProgressBeacon::Shared {
  std::string key_prefix;
  std::string store_server = "rank 0";
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds interval{1000};
  c10::intrusive_ptr<c10d::Store> store; // this beacon's own connection
  // Two locks: a collective takes only `state_mutex` (never waits on the store's I/O).
  std::mutex state_mutex;             // guards sequence and what
  std::mutex store_mutex;             // guards the store connection
  std::condition_variable changed_cv; // with state_mutex: a collective started
  bool changed = false;
  int64_t sequence = 0;
  std::string what = "no collective yet";
  std::atomic<bool> stop{false};

  // Publishes once per interval, and soon after a collective starts (at most 4 times per
  // interval, so a busy training loop does not flood rank 0's store).
  void beat() {
    auto last = std::chrono::steady_clock::now();
    for (int64_t heartbeat = 1; !stop.load(); ++heartbeat) {
      {
        std::unique_lock<std::mutex> lock(state_mutex);
        changed_cv.wait_for(lock, interval, [&] { return changed || stop.load(); });
        changed = false;
      }
      const auto earliest = last + interval / 4;
      if (std::chrono::steady_clock::now() < earliest) {
        std::this_thread::sleep_until(earliest);
      }
      last = std::chrono::steady_clock::now();
      try {
        publish(heartbeat);
      } catch (const std::exception&) {
        return; // the store is gone: the job is ending
      }
    }
  }

  std::string key_of(int of_rank) const {
    return fmt::format("{}largo/beacon/{}", key_prefix, of_rank);
  }

  void publish(int64_t heartbeat) {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(state_mutex);
      text = fmt::format("{} {} {}", heartbeat, sequence, what);
    }
    std::lock_guard<std::mutex> lock(store_mutex);
    store->set(key_of(rank), std::vector<uint8_t>(text.begin(), text.end()));
  }

  Beacon read(int other) {
    Beacon beacon;
    try {
      std::lock_guard<std::mutex> lock(store_mutex);
      if (!store->check({key_of(other)})) {
        beacon.read = true; // it has not published yet: no heartbeat
        return beacon;
      }
      const std::vector<uint8_t> bytes = store->get(key_of(other));
      std::istringstream in(std::string(bytes.begin(), bytes.end()));
      in >> beacon.heartbeat >> beacon.sequence;
      std::getline(in >> std::ws, beacon.what);
      beacon.read = true;
    } catch (const std::exception&) {
    }
    return beacon;
  }
};

ProgressBeacon::ProgressBeacon(
    const std::string& master_addr,
    int master_port,
    std::string key_prefix,
    std::string store_server,
    int rank,
    int world_size,
    std::chrono::milliseconds interval)
    : shared_(std::make_shared<Shared>()) {
  shared_->key_prefix = std::move(key_prefix);
  shared_->store_server = std::move(store_server);
  shared_->rank = rank;
  shared_->world_size = world_size;
  shared_->interval = interval;
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(master_port);
  options.isServer = false;
  options.waitWorkers = false;
  // Short: a diagnosis must not hang on a store whose server (rank 0) is stopped.
  options.timeout = std::max(std::chrono::milliseconds(3000), 3 * interval);
  shared_->store = c10::make_intrusive<c10d::TCPStore>(master_addr, options);
  shared_->publish(0);
  std::thread([shared = shared_] { shared->beat(); }).detach();
}

ProgressBeacon::~ProgressBeacon() {
  shared_->stop.store(true);
  shared_->changed_cv.notify_one();
}

int64_t ProgressBeacon::enter(const std::string& what) {
  int64_t sequence = 0;
  {
    std::lock_guard<std::mutex> lock(shared_->state_mutex);
    shared_->what = what;
    shared_->changed = true;
    sequence = ++shared_->sequence;
  }
  shared_->changed_cv.notify_one();
  return sequence;
}

std::string ProgressBeacon::diagnose(int64_t sequence, const std::string& what) const {
  const std::string store_silent = fmt::format(
      "{}, which serves the job's store, does not answer: it is stopped (SIGSTOP), hung or gone",
      shared_->store_server);
  std::vector<Beacon> before(shared_->world_size);
  for (int r = 0; r < shared_->world_size; ++r) {
    before[r] = r == shared_->rank ? Beacon{} : shared_->read(r);
  }
  const int any_other = shared_->rank == 0 ? 1 : 0;
  if (!before[any_other].read) {
    return store_silent; // (a store that cannot be read at all is gone for every rank)
  }
  std::this_thread::sleep_for(shared_->interval * 5 / 2);
  std::vector<std::string> findings;
  for (int r = 0; r < shared_->world_size; ++r) {
    if (r == shared_->rank) {
      continue;
    }
    const Beacon after = shared_->read(r);
    if (!after.read) {
      findings.push_back(store_silent);
      break;
    } else if (after.heartbeat == before[r].heartbeat) {
      findings.push_back(fmt::format(
          "rank {} stopped making progress (its heartbeat stopped) during its collective #{}, "
          "{}: it is stopped (SIGSTOP), hung or has died",
          r,
          after.sequence,
          after.what));
    } else if (after.sequence < sequence) {
      findings.push_back(fmt::format(
          "rank {} is running but has not reached collective #{}; its last was #{}, {}",
          r,
          sequence,
          after.sequence,
          after.what));
    }
  }
  if (findings.empty()) {
    return "every other rank is alive and has reached this collective, so a connection between "
           "them failed (network), or the ranks run different collectives";
  }
  std::string text;
  for (const auto& finding : findings) {
    text += (text.empty() ? "" : "; ") + finding;
  }
  return text;
}

} // namespace largo::comm::detail
