// A pickle reader for the subset of Python's pickle format that torch files use (private to
// the checkpoint layer; torch_file.h is the public entry point).
//
// Why not libtorch's own unpickler (torch::jit::Unpickler, torch::pickle_load): it reads what
// torch::pickle_save writes but not what Python's torch.save writes. Checked again with
// libtorch 2.11: pickle_load of a torch.save'd {"model": OrderedDict(...)} (every state_dict)
// fails with "Expected GenericDict but got None" (collections.OrderedDict becomes None); 1.13
// also lacked SETITEM (one-item dicts) and read only 8-byte LONG1 integers. It trusts its
// input too (an empty stack is popped without a check). This reader takes
// protocols 2-5, the containers and scalars a checkpoint holds, tensors rebuilt from their
// storages, and the type tags torch::pickle_save adds (restore_type_tag, build_intlist ...),
// and checks every read, so a damaged pickle is an error, never a crash.
//
// What comes back: dicts, lists, tuples, strings, ints, floats, bools, None and CPU tensors.
// Containers pickled without a type tag (anything Python wrote) get the narrowest element
// type that fits all their elements (a list of ints becomes an int list, a dict whose keys
// are all strings a Dict[str, ...]), so code written for Largo's own checkpoints reads a
// Python-saved copy of one the same way.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace largo::checkpoint::detail {

// Damaged or unsupported pickle content; the message names the byte offset where it was
// found. The caller adds the file's name.
class UnpickleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Returns the storage of `numel` elements of `dtype` that the archive holds under `key`
// ("data/<key>"); called once per key.
using StorageLoader =
    std::function<c10::Storage(const std::string& key, at::ScalarType dtype, int64_t numel)>;

c10::IValue unpickle(std::string_view pickle, const StorageLoader& load_storage);

} // namespace largo::checkpoint::detail
