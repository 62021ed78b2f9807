// Where a list of tensors lies in one flat buffer, and how that buffer is cut into equal
// shards, one per rank: the arithmetic under every ZeRO stage.
//
//   tensors     [ a: 5 ][ b: 3 ][ c: 4 ]             total 12
//   flat buffer  a a a a a b b b c c c c . .         padded to a multiple of world size (14)
//   shards (2)  [ rank 0: 7      ][ rank 1: 7     ]
//   pieces      rank 0: a[0:5) b[0:2)   rank 1: b[2:3) c[0:4)
//
// A tensor may straddle shards: each rank owns a contiguous piece of it. Per-tensor
// quantities (LARC's norms, weight-decay groups) follow from the pieces. Pure arithmetic:
// no collectives, no tensors.
#pragma once

#include <cstdint>
#include <vector>

namespace largo::parallel {

// The part of tensor `tensor_index` that one rank owns: elements
// [tensor_offset, tensor_offset + numel) of the flattened tensor, which sit at
// [flat_offset, flat_offset + numel) of the flat buffer.
struct ShardPiece {
  size_t tensor_index = 0;
  int64_t tensor_offset = 0;
  int64_t flat_offset = 0;
  int64_t numel = 0;
};

class FlatLayout {
 public:
  // `numels`: the element counts of the tensors, in buffer order. Throws ConfigError for a
  // world size < 1 or a negative count.
  FlatLayout(std::vector<int64_t> numels, int world_size);

  int world_size() const {
    return world_size_;
  }
  size_t num_tensors() const {
    return numels_.size();
  }
  int64_t numel(size_t tensor_index) const {
    return numels_[tensor_index];
  }
  // Offset of tensor `tensor_index` in the flat buffer.
  int64_t offset(size_t tensor_index) const {
    return offsets_[tensor_index];
  }
  // Sum of the tensors' element counts.
  int64_t total_numel() const {
    return total_numel_;
  }
  // total_numel rounded up to a multiple of the world size: the flat buffer's length.
  int64_t padded_numel() const {
    return shard_numel_ * world_size_;
  }
  // Elements per rank: padded_numel / world_size. Rank r owns [r * shard, (r + 1) * shard).
  int64_t shard_numel() const {
    return shard_numel_;
  }
  // The pieces of the tensors that `rank` owns, in tensor order (empty pieces left out).
  std::vector<ShardPiece> pieces_of_rank(int rank) const;
  // The pieces of one tensor, one per rank that owns some of it, in rank order (each piece's
  // owner is the returned rank).
  std::vector<std::pair<int, ShardPiece>> pieces_of_tensor(size_t tensor_index) const;

 private:
  std::vector<int64_t> numels_;
  std::vector<int64_t> offsets_;
  int64_t total_numel_ = 0;
  int64_t shard_numel_ = 0;
  int world_size_ = 1;
};

} // namespace largo::parallel
