#include "largo/data/matlab_file.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "largo/core/error.h"

namespace largo::data {
namespace {

// Data types (miINT8 ...) and array classes (mxDOUBLE_CLASS ...) of the format.
constexpr uint32_t kMiMatrix = 14;
constexpr uint32_t kMiCompressed = 15;
constexpr uint32_t kMiInt32 = 5;
constexpr uint32_t kMiUInt32 = 6;

// The at:: dtype of a numeric miType (1..13 but 4 and 8..11's gaps), or nothing.
std::optional<at::ScalarType> type_of_data(uint32_t type) {
  switch (type) {
    case 1: return at::kChar;   // miINT8
    case 2: return at::kByte;   // miUINT8
    case 3: return at::kShort;  // miINT16
    case 4: return at::kUInt16; // miUINT16
    case 5: return at::kInt;    // miINT32
    case 6: return at::kUInt32; // miUINT32
    case 7: return at::kFloat;  // miSINGLE
    case 9: return at::kDouble; // miDOUBLE
    case 12: return at::kLong;  // miINT64
    case 13: return at::kUInt64; // miUINT64
    default: return std::nullopt;
  }
}

// The at:: dtype of a numeric array class (mxDOUBLE_CLASS = 6 ... mxUINT64_CLASS = 15).
std::optional<at::ScalarType> type_of_class(uint32_t array_class) {
  static const std::map<uint32_t, at::ScalarType> classes = {
      {6, at::kDouble}, {7, at::kFloat}, {8, at::kChar},    {9, at::kByte},  {10, at::kShort},
      {11, at::kUInt16}, {12, at::kInt},  {13, at::kUInt32}, {14, at::kLong}, {15, at::kUInt64}};
  const auto it = classes.find(array_class);
  return it == classes.end() ? std::nullopt : std::optional<at::ScalarType>(it->second);
}

// Reads data elements out of a byte range; every failure names the file.
class ElementReader {
 public:
  ElementReader(const uint8_t* begin, const uint8_t* end, std::string file)
      : at_(begin), end_(end), file_(std::move(file)) {}

  bool done() const {
    return at_ >= end_;
  }

  struct Element {
    uint32_t type;
    const uint8_t* data;
    uint32_t bytes;
  };

  // The next tag and its data, the reader moved past the padding to 8 bytes (none after a
  // compressed element, whose length is exact).
  Element next() {
    need(8, "a data element's tag");
    uint32_t type = word(at_);
    uint32_t bytes = word(at_ + 4);
    if ((type >> 16) != 0) { // small data element: 2-byte length and type, data in 4 bytes
      bytes = type >> 16;
      type &= 0xffff;
      const Element element{type, at_ + 4, bytes};
      at_ += 8;
      return element;
    }
    at_ += 8;
    need(bytes, "a data element");
    const Element element{type, at_, bytes};
    const uint64_t padded = type == kMiCompressed ? bytes : (uint64_t{bytes} + 7) / 8 * 8;
    at_ += std::min<uint64_t>(padded, static_cast<uint64_t>(end_ - at_));
    return element;
  }

  [[noreturn]] void corrupt(const std::string& what) const {
    throw DataError(fmt::format(
        "MAT-file {}: {}; the file is truncated or corrupt, download it again", file_, what));
  }

 private:
  static uint32_t word(const uint8_t* p) {
    uint32_t value;
    std::memcpy(&value, p, sizeof(value)); // little-endian files only (checked in the header)
    return value;
  }
  void need(uint64_t bytes, const char* what) const {
    if (static_cast<uint64_t>(end_ - at_) < bytes) {
      corrupt(fmt::format("it ends inside {}", what));
    }
  }

  const uint8_t* at_;
  const uint8_t* end_;
  std::string file_;
};

std::vector<uint8_t> inflate(const uint8_t* data, uint32_t bytes, const ElementReader& reader) {
  z_stream stream{};
  if (inflateInit(&stream) != Z_OK) {
    reader.corrupt("zlib could not start");
  }
  stream.next_in = const_cast<Bytef*>(data);
  stream.avail_in = bytes;
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  int status = Z_OK;
  while (status != Z_STREAM_END) {
    stream.next_out = chunk.data();
    stream.avail_out = static_cast<uInt>(chunk.size());
    status = ::inflate(&stream, Z_NO_FLUSH);
    if (status != Z_OK && status != Z_STREAM_END) {
      inflateEnd(&stream);
      reader.corrupt(fmt::format("a compressed variable does not inflate (zlib: {})", status));
    }
    out.insert(out.end(), chunk.data(), chunk.data() + (chunk.size() - stream.avail_out));
    if (status == Z_OK && stream.avail_in == 0 && stream.avail_out != 0) {
      inflateEnd(&stream);
      reader.corrupt("a compressed variable ends early");
    }
  }
  inflateEnd(&stream);
  return out;
}

// A miMATRIX element's subelements: flags, dimensions, name, real part.
std::pair<std::string, MatlabArray> read_matrix(
    const uint8_t* data, uint32_t bytes, const std::string& file) {
  ElementReader reader(data, data + bytes, file);
  const auto flags = reader.next();
  if (flags.type != kMiUInt32 || flags.bytes < 8) {
    reader.corrupt("a variable's array flags are missing");
  }
  uint32_t flag_word;
  std::memcpy(&flag_word, flags.data, sizeof(flag_word));
  const auto dims_element = reader.next();
  if (dims_element.type != kMiInt32 || dims_element.bytes % 4 != 0) {
    reader.corrupt("a variable's dimensions are missing");
  }
  MatlabArray array;
  for (uint32_t i = 0; i < dims_element.bytes / 4; ++i) {
    int32_t dim;
    std::memcpy(&dim, dims_element.data + 4 * i, sizeof(dim));
    array.dims.push_back(dim);
  }
  const auto name_element = reader.next();
  const std::string name(reinterpret_cast<const char*>(name_element.data), name_element.bytes);
  const auto array_type = type_of_class(flag_word & 0xff);
  const bool complex = (flag_word & 0x800) != 0;
  if (!array_type || complex) {
    return {name, MatlabArray{}}; // not numeric or complex: refused only if asked for
  }
  const auto real = reader.next();
  const auto stored_type = type_of_data(real.type);
  int64_t count = 1;
  for (int64_t dim : array.dims) {
    count *= dim;
  }
  if (!stored_type || static_cast<int64_t>(real.bytes) != count * at::elementSize(*stored_type)) {
    reader.corrupt(fmt::format("variable '{}' holds {} bytes for {} values", name, real.bytes, count));
  }
  at::Tensor stored = at::empty({count}, *stored_type);
  std::memcpy(stored.data_ptr(), real.data, real.bytes);
  array.values = stored.to(*array_type);
  return {name, array};
}

std::vector<uint8_t> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw DataError(fmt::format("cannot open MAT-file {}", path.string()));
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void check_header(const std::vector<uint8_t>& bytes, const std::string& file) {
  const std::string text(bytes.begin(), bytes.begin() + std::min<size_t>(bytes.size(), 116));
  if (bytes.size() < 128 || text.rfind("MATLAB 5.0 MAT-file", 0) != 0) {
    throw DataError(fmt::format(
        "{} is not a MATLAB 5.0 MAT-file{}; save it with MATLAB's -v7 (or scipy.io.savemat)",
        file,
        text.rfind("MATLAB 7.3 MAT-file", 0) == 0 ? " (it is -v7.3, an HDF5 file)" : ""));
  }
  if (bytes[126] != 'I' || bytes[127] != 'M') {
    throw DataError(fmt::format("MAT-file {} is big-endian, which is not read", file));
  }
}

} // namespace

std::map<std::string, MatlabArray> read_matlab_arrays(
    const std::filesystem::path& path, const std::vector<std::string>& names) {
  const std::string file = path.string();
  const std::vector<uint8_t> bytes = read_file(path);
  check_header(bytes, file);
  std::map<std::string, MatlabArray> found;
  ElementReader reader(bytes.data() + 128, bytes.data() + bytes.size(), file);
  while (!reader.done()) {
    auto element = reader.next();
    std::vector<uint8_t> inflated;
    if (element.type == kMiCompressed) {
      inflated = inflate(element.data, element.bytes, reader);
      ElementReader inner(inflated.data(), inflated.data() + inflated.size(), file);
      element = inner.next();
    }
    if (element.type != kMiMatrix) {
      continue; // not a variable
    }
    auto [name, array] = read_matrix(element.data, element.bytes, file);
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      if (!array.values.defined()) {
        throw DataError(fmt::format(
            "MAT-file {}: variable '{}' is not a real numeric array", file, name));
      }
      found[name] = std::move(array);
    }
  }
  for (const std::string& name : names) {
    if (found.count(name) == 0) {
      throw DataError(fmt::format("MAT-file {} has no variable '{}'", file, name));
    }
  }
  return found;
}

} // namespace largo::data
