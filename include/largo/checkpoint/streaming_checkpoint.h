// Writing a checkpoint whose tensors do not all fit in memory at once: the file torch.load
// (and load_checkpoint) reads, written tensor by tensor.
//
// The state is given with *placeholders* where the large tensors go (defer() returns one:
// a tensor with the right dtype and shape but no data). save() pickles the structure, then
// writes each tensor's bytes in the order the pickle refers to them, calling a
// placeholder's producer only when its turn comes and dropping the result right after. A
// consolidated ZeRO checkpoint is written this way, one parameter's state gathered at a
// time, so no process ever holds the whole model state (FairScale's consolidation holds it
// all on one rank, a known cause of out-of-memory failures).
//
// The file layout is libtorch's own (a zip archive with data.pkl and data/<key> records, as
// torch::pickle_save writes): no new format.
#pragma once

#include <largo/checkpoint/checkpoint_file.h>

#include <filesystem>
#include <functional>
#include <map>
#include <vector>

namespace largo::checkpoint {

class StreamingCheckpoint {
 public:
  using Producer = std::function<at::Tensor()>;

  // A placeholder for a tensor of `dtype` and `shape` whose data `produce` returns (a CPU or
  // device tensor of that dtype and shape) when save() reaches it.
  at::Tensor defer(at::ScalarType dtype, std::vector<int64_t> shape, Producer produce);

  // Writes `state` (which may hold placeholders from defer() and ordinary tensors) to `path`
  // atomically. Producers run in the order the structure lists their placeholders (a dict's
  // insertion order), each exactly once. Throws CheckpointError when a producer returns a
  // tensor of another dtype or shape.
  void save(const std::filesystem::path& path, const StateDict& state);

 private:
  struct Deferred {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    Producer produce;
  };
  std::map<const void*, Deferred> deferred_; // keyed by the placeholder's storage
};

} // namespace largo::checkpoint
