// The order in which gradient buckets start their collectives (DDP's all-reduce, ZeRO-2's
// reduce to the owners): bucket index order, each once every gradient in it is ready.
// Backward may finish the buckets in any order, and may differ between ranks (threads,
// unused parameters), but c10d requires every rank to issue its collectives in the same
// order; so a ready bucket waits for the ones before it.
#pragma once

#include <cstddef>
#include <vector>

namespace largo::parallel::detail {

// Launches, in index order from `next_bucket`, every bucket whose `pending` count is zero,
// stopping at the first that is not ready; `next_bucket` advances past those launched.
template <typename Bucket, typename Launch>
void launch_ready_buckets_in_order(
    std::vector<Bucket>& buckets, size_t& next_bucket, Launch&& launch) {
  while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
    launch(buckets[next_bucket]);
    ++next_bucket;
  }
}

} // namespace largo::parallel::detail
