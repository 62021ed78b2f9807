#include <largo/checkpoint/streaming_checkpoint.h>

#include <largo/core/atomic_file.h>
#include <largo/core/error.h>

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/serialization/pickler.h>

namespace largo::checkpoint {
namespace {

// `value` with every list as a plain list. libtorch's pickler writes an int, float, bool or
// tensor list as a call to torch.jit._pickle.build_intlist (…), which torch.load refuses in
// its default weights_only mode (PyTorch >= 2.6); a plain list pickles as a Python list.
// Tensors are the same objects (so shared storages stay shared).
c10::IValue with_plain_lists(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList plain(c10::AnyType::get());
    plain.reserve(value.toListRef().size());
    for (const c10::IValue& element : value.toListRef()) {
      plain.push_back(with_plain_lists(element));
    }
    return plain;
  }
  if (value.isGenericDict()) {
    const c10::impl::GenericDict dict = value.toGenericDict();
    c10::impl::GenericDict plain(dict.keyType(), c10::AnyType::get());
    plain.reserve(dict.size());
    for (const auto& entry : dict) {
      plain.insert(entry.key(), with_plain_lists(entry.value()));
    }
    return plain;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const c10::IValue& element : value.toTupleRef().elements()) {
      elements.push_back(with_plain_lists(element));
    }
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return value;
}

} // namespace

at::Tensor StreamingCheckpoint::defer(at::ScalarType dtype, std::vector<int64_t> shape,
                                      Producer produce) {
  // A storage of the right byte size whose data pointer is null: the pickler reads only its
  // size, dtype and device; the bytes come from the producer.
  int64_t numel = 1;
  for (int64_t size : shape) {
    numel *= size;
  }
  const size_t nbytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::DataPtr(nullptr, c10::Device(c10::kCPU)), /*allocator=*/nullptr,
                       /*resizable=*/false);
  at::Tensor placeholder = at::empty({0}, at::TensorOptions().dtype(dtype));
  placeholder.set_(storage, 0, shape, c10::contiguous_strides(shape));
  deferred_[storage.unsafeGetStorageImpl()] = {dtype, std::move(shape), std::move(produce)};
  return placeholder;
}

void StreamingCheckpoint::save(const std::filesystem::path& path, const StateDict& state) {
  std::vector<char> pickle_bytes;
  // No TorchScript type tags and no typed lists: the file holds only what torch.load's default
  // (weights_only) unpickler accepts, dicts, lists, tuples, numbers, strings and tensors.
  // load_checkpoint gives the containers back their element types (unpickler.h).
  torch::jit::Pickler pickler(
      [&](const char* data, size_t size) {
        pickle_bytes.insert(pickle_bytes.end(), data, data + size);
      },
      /*tensor_table=*/nullptr,
      /*type_renamer=*/nullptr,
      /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr,
      /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(with_plain_lists(c10::IValue(state)));
  pickler.stop();

  AtomicFileWriter file(path);
  caffe2::serialize::PyTorchStreamWriter archive([&](const void* data, size_t size) {
    file.write(data, size);
    return size;
  });
  // Tensors first, in the pickle's key order ("data/0", "data/1", ...), then the pickle: the
  // layout torch::pickle_save produces. (The pickler lists each storage once, as a tensor
  // over that storage; placeholders are recognized by their storage.)
  const std::vector<at::Tensor>& tensors = pickler.tensorData();
  for (size_t key = 0; key < tensors.size(); ++key) {
    const at::Tensor& tensor = tensors[key];
    const std::string record = fmt::format("data/{}", key);
    auto deferred = deferred_.find(tensor.storage().unsafeGetStorageImpl());
    if (deferred == deferred_.end()) {
      auto writable = torch::jit::getWriteableTensorData(tensor);
      archive.writeRecord(record, writable.data(), writable.sizeInBytes());
      continue;
    }
    const Deferred& announced = deferred->second;
    at::Tensor produced = announced.produce();
    if (produced.scalar_type() != announced.dtype || produced.sizes() != announced.shape) {
      throw CheckpointError(fmt::format(
          "streaming checkpoint {}: a tensor was announced as {} [{}] but produced as {} [{}]",
          path.string(), c10::toString(announced.dtype), fmt::join(announced.shape, ", "),
          c10::toString(produced.scalar_type()), fmt::join(produced.sizes(), ", ")));
    }
    produced = produced.contiguous().cpu();
    archive.writeRecord(record, produced.data_ptr(),
                        static_cast<size_t>(produced.numel()) * produced.element_size());
  }
  archive.writeRecord("data.pkl", pickle_bytes.data(), pickle_bytes.size());
  archive.writeEndOfFile();
  file.commit();
  deferred_.clear();
}

} // namespace largo::checkpoint
