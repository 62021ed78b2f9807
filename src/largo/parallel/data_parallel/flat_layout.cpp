#include <largo/parallel/data_parallel/flat_layout.h>

#include <largo/core/error.h>

#include <fmt/format.h>

#include <algorithm>

namespace largo::parallel {

FlatLayout::FlatLayout(std::vector<int64_t> numels, int world_size)
    : numels_(std::move(numels)), world_size_(world_size) {
  if (world_size_ < 1) {
    throw ConfigError(fmt::format("FlatLayout: world size must be >= 1, got {}", world_size_));
  }
  offsets_.reserve(numels_.size());
  for (int64_t numel : numels_) {
    if (numel < 0) {
      throw ConfigError(fmt::format("FlatLayout: negative element count {}", numel));
    }
    offsets_.push_back(total_numel_);
    total_numel_ += numel;
  }
  shard_numel_ = (total_numel_ + world_size_ - 1) / world_size_;
}

std::vector<ShardPiece> FlatLayout::pieces_of_rank(int rank) const {
  std::vector<ShardPiece> pieces;
  const int64_t shard_begin = static_cast<int64_t>(rank) * shard_numel_;
  const int64_t shard_end = shard_begin + shard_numel_;
  // The tensors overlapping [shard_begin, shard_end): offsets are sorted, so start at the
  // last tensor beginning at or before shard_begin.
  auto first = std::upper_bound(offsets_.begin(), offsets_.end(), shard_begin);
  size_t index = first == offsets_.begin() ? 0 : static_cast<size_t>(first - offsets_.begin() - 1);
  for (; index < numels_.size() && offsets_[index] < shard_end; ++index) {
    const int64_t begin = std::max(offsets_[index], shard_begin);
    const int64_t end = std::min(offsets_[index] + numels_[index], shard_end);
    if (end > begin) {
      pieces.push_back({index, begin - offsets_[index], begin, end - begin});
    }
  }
  return pieces;
}

std::vector<std::pair<int, ShardPiece>> FlatLayout::pieces_of_tensor(size_t tensor_index) const {
  std::vector<std::pair<int, ShardPiece>> pieces;
  const int64_t begin = offsets_[tensor_index];
  const int64_t end = begin + numels_[tensor_index];
  if (shard_numel_ == 0 || end == begin) {
    return pieces;
  }
  for (int64_t rank = begin / shard_numel_; rank < world_size_ && rank * shard_numel_ < end;
       ++rank) {
    const int64_t piece_begin = std::max(begin, rank * shard_numel_);
    const int64_t piece_end = std::min(end, (rank + 1) * shard_numel_);
    if (piece_end > piece_begin) {
      pieces.emplace_back(static_cast<int>(rank),
                          ShardPiece{tensor_index, piece_begin - begin, piece_begin,
                                     piece_end - piece_begin});
    }
  }
  return pieces;
}

} // namespace largo::parallel
