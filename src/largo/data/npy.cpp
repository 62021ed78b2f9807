// The .npy format: a magic string, a version, a little-endian header length, a Python dict
// literal ({'descr': ..., 'fortran_order': ..., 'shape': (...)}) padded with spaces to a
// multiple of 64 bytes, then the raw elements.
#include "largo/data/npy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "largo/core/atomic_file.h"
#include "largo/core/error.h"

namespace largo::data {
namespace {

static_assert(
    std::endian::native == std::endian::little, "the .npy writer assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

DataError npy_error(const std::filesystem::path& path, const std::string& what) {
  return DataError(fmt::format("{}: not a readable .npy file: {}", path.string(), what));
}

// The byte-order mark, the type character and the byte count of a simple descr
// ("<i8" -> '<', 'i', 8). Throws for structured or unknown dtypes.
struct Descr {
  char byte_order = '<';
  char kind = '?';
  int64_t count = 0; // bytes, or characters for 'U'
};

Descr parse_descr(const std::string& descr) {
  Descr parsed;
  size_t pos = 0;
  if (!descr.empty() && std::strchr("<>|=", descr[0]) != nullptr) {
    parsed.byte_order = descr[0] == '=' ? '<' : descr[0];
    pos = 1;
  }
  if (pos >= descr.size()) {
    throw DataError(fmt::format("unsupported .npy dtype '{}'", descr));
  }
  parsed.kind = descr[pos];
  const std::string digits = descr.substr(pos + 1);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit) ||
      std::strchr("biufcUS", parsed.kind) == nullptr) {
    throw DataError(fmt::format(
        "unsupported .npy dtype '{}' (supported: strings <U/|S, bool, integers, floats){}",
        descr,
        parsed.kind == 'O' ? "; object arrays are pickles: save paths with "
                             "np.save(path, np.array(paths, dtype=str))"
                           : ""));
  }
  parsed.count = std::stoll(digits);
  return parsed;
}

int64_t descr_item_size(const std::string& descr) {
  const Descr parsed = parse_descr(descr);
  return parsed.kind == 'U' ? 4 * parsed.count : parsed.count;
}

// The value of `key` in the header dict: the text after "'key':" up to the next top-level
// comma (parentheses nest).
std::string header_value(const std::string& header, const std::string& key) {
  for (const char quote : {'\'', '"'}) {
    const std::string pattern = std::string(1, quote) + key + quote;
    size_t pos = header.find(pattern);
    if (pos == std::string::npos) {
      continue;
    }
    pos = header.find(':', pos + pattern.size());
    if (pos == std::string::npos) {
      break;
    }
    ++pos;
    int depth = 0;
    size_t end = pos;
    for (; end < header.size(); ++end) {
      const char c = header[end];
      if (c == '(' || c == '[') {
        ++depth;
      } else if (c == ')' || c == ']') {
        --depth;
      } else if ((c == ',' || c == '}') && depth == 0) {
        break;
      }
    }
    std::string value = header.substr(pos, end - pos);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t") + 1);
    return value;
  }
  throw DataError(fmt::format("the header has no '{}' entry", key));
}

std::vector<int64_t> parse_shape(const std::string& text) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') {
    throw DataError(fmt::format("shape '{}' is not a tuple", text));
  }
  std::vector<int64_t> shape;
  std::string number;
  for (const char c : text.substr(1, text.size() - 2) + ",") {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      number += c;
    } else if (c == ',') {
      if (!number.empty()) {
        shape.push_back(std::stoll(number));
      }
      number.clear();
    } else if (c != ' ' && c != 'L') {
      throw DataError(fmt::format("shape '{}' is not a tuple of integers", text));
    }
  }
  return shape;
}

std::string read_all(const std::filesystem::path& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) { // opens on Linux, fails on reading
    throw npy_error(path, "it is a directory, not a .npy file");
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw npy_error(path, "cannot open it (missing or not readable)");
  }
  try {
    return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure& error) {
    throw npy_error(path, fmt::format("cannot read it: {}", error.what()));
  }
}

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// UTF-8 -> code points; throws for malformed input.
std::vector<uint32_t> decode_utf8(const std::string& text) {
  std::vector<uint32_t> code_points;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const int length = lead < 0x80         ? 1
                       : (lead >> 5) == 6  ? 2
                       : (lead >> 4) == 14 ? 3
                       : (lead >> 3) == 30 ? 4
                                           : 0;
    if (length == 0 || i + length > text.size()) {
      throw DataError(fmt::format("write_npy_strings: '{}' is not valid UTF-8", text));
    }
    uint32_t code_point = length == 1 ? lead : lead & (0x7F >> length);
    for (int k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next >> 6) != 2) {
        throw DataError(fmt::format("write_npy_strings: '{}' is not valid UTF-8", text));
      }
      code_point = (code_point << 6) | (next & 0x3F);
    }
    code_points.push_back(code_point);
    i += static_cast<size_t>(length);
  }
  return code_points;
}

uint64_t load_unsigned(const char* bytes, int64_t size, bool swap) {
  uint64_t value = 0;
  for (int64_t b = 0; b < size; ++b) {
    const auto byte =
        static_cast<uint64_t>(static_cast<unsigned char>(bytes[swap ? size - 1 - b : b]));
    value |= byte << (8 * b);
  }
  return value;
}

void check_one_dimensional(const NpyArray& array, const std::filesystem::path& path) {
  if (array.shape.size() != 1) {
    throw DataError(fmt::format(
        "{}: expected a 1-D array, got shape ({})", path.string(), fmt::join(array.shape, ", ")));
  }
}

} // namespace

int64_t NpyArray::numel() const {
  int64_t count = 1;
  for (const int64_t dim : shape) {
    count *= dim;
  }
  return count;
}

int64_t NpyArray::item_size() const {
  return descr_item_size(descr);
}

NpyArray read_npy(const std::filesystem::path& path) {
  const std::string bytes = read_all(path);
  if (bytes.size() < kMagicSize + 4 || bytes.compare(0, kMagicSize, kMagic, kMagicSize) != 0) {
    throw npy_error(path, "it does not start with NumPy's magic string \\x93NUMPY");
  }
  const int major = static_cast<unsigned char>(bytes[kMagicSize]);
  const size_t length_bytes = major == 1 ? 2 : 4;
  if (major < 1 || major > 3 || bytes.size() < kMagicSize + 2 + length_bytes) {
    throw npy_error(path, fmt::format("format version {} is not 1, 2 or 3", major));
  }
  const size_t header_length =
      load_unsigned(&bytes[kMagicSize + 2], static_cast<int64_t>(length_bytes), false);
  const size_t data_offset = kMagicSize + 2 + length_bytes + header_length;
  if (data_offset > bytes.size()) {
    throw npy_error(path, "the header is cut short");
  }
  const std::string header = bytes.substr(kMagicSize + 2 + length_bytes, header_length);
  NpyArray array;
  try {
    std::string descr = header_value(header, "descr");
    if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"')) {
      throw DataError(fmt::format("descr {} is not a simple dtype string", descr));
    }
    array.descr = descr.substr(1, descr.size() - 2);
    array.fortran_order = header_value(header, "fortran_order") == "True";
    array.shape = parse_shape(header_value(header, "shape"));
    parse_descr(array.descr);
  } catch (const DataError& error) {
    throw npy_error(path, error.what());
  }
  const size_t expected = static_cast<size_t>(array.numel() * array.item_size());
  if (bytes.size() - data_offset != expected) {
    throw npy_error(
        path,
        fmt::format(
            "the header promises {} bytes of {} data (shape ({})) but the file holds {}",
            expected,
            array.descr,
            fmt::join(array.shape, ", "),
            bytes.size() - data_offset));
  }
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(data_offset), bytes.end());
  return array;
}

std::vector<std::string> npy_strings(const NpyArray& array, const std::filesystem::path& path) {
  check_one_dimensional(array, path);
  const Descr descr = parse_descr(array.descr);
  if (descr.kind != 'U' && descr.kind != 'S') {
    throw DataError(fmt::format(
        "{}: expected an array of strings (dtype <U or |S), got dtype {}",
        path.string(),
        array.descr));
  }
  const int64_t item = array.item_size();
  std::vector<std::string> values;
  values.reserve(static_cast<size_t>(array.numel()));
  for (int64_t i = 0; i < array.numel(); ++i) {
    const char* element = array.data.data() + i * item;
    std::string value;
    if (descr.kind == 'S') {
      value.assign(element, strnlen(element, static_cast<size_t>(item)));
    } else {
      for (int64_t c = 0; c < descr.count; ++c) {
        const auto code_point =
            static_cast<uint32_t>(load_unsigned(element + 4 * c, 4, descr.byte_order == '>'));
        if (code_point == 0) {
          break;
        }
        append_utf8(value, code_point);
      }
    }
    values.push_back(std::move(value));
  }
  return values;
}

std::vector<int64_t> npy_integers(const NpyArray& array, const std::filesystem::path& path) {
  check_one_dimensional(array, path);
  const Descr descr = parse_descr(array.descr);
  const int64_t item = array.item_size();
  const bool integer = (descr.kind == 'i' || descr.kind == 'u' || descr.kind == 'b') && item <= 8;
  const bool floating = descr.kind == 'f' && (item == 4 || item == 8);
  if (!integer && !floating) {
    throw DataError(fmt::format(
        "{}: expected an array of integers (e.g. dtype <i8 or <i4), got dtype {}",
        path.string(),
        array.descr));
  }
  const bool swap = descr.byte_order == '>';
  std::vector<int64_t> values;
  values.reserve(static_cast<size_t>(array.numel()));
  for (int64_t i = 0; i < array.numel(); ++i) {
    const uint64_t raw = load_unsigned(array.data.data() + i * item, item, swap);
    if (floating) {
      const double value = item == 4 ? double(std::bit_cast<float>(static_cast<uint32_t>(raw)))
                                     : std::bit_cast<double>(raw);
      // Labels saved through a float array: whole numbers in int64's range only.
      if (!(std::abs(value) < 9.0e18) || value != std::floor(value)) {
        throw DataError(fmt::format(
            "{}: element {} is {}, not a whole number; labels must be integers",
            path.string(),
            i,
            value));
      }
      values.push_back(static_cast<int64_t>(value));
    } else if (descr.kind == 'i' && item < 8) {
      const int shift = static_cast<int>(64 - 8 * item); // sign-extend
      values.push_back(static_cast<int64_t>(raw << shift) >> shift);
    } else {
      values.push_back(static_cast<int64_t>(raw));
    }
  }
  return values;
}

void write_npy(
    const std::filesystem::path& path,
    const std::string& descr,
    const std::vector<int64_t>& shape,
    const void* data,
    size_t num_bytes) {
  int64_t numel = 1;
  for (const int64_t dim : shape) {
    numel *= dim;
  }
  const int64_t expected = numel * descr_item_size(descr);
  if (static_cast<int64_t>(num_bytes) != expected) {
    throw DataError(fmt::format(
        "write_npy({}): {} bytes given for {} elements of {} ({} bytes expected)",
        path.string(),
        num_bytes,
        numel,
        descr,
        expected));
  }
  const std::string shape_text = shape.size() == 1 ? fmt::format("({},)", shape[0])
                                                   : fmt::format("({})", fmt::join(shape, ", "));
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape_text);
  // Pad with spaces so the data starts on a 64-byte boundary, ending the header with '\n'.
  const bool version2 = header.size() + 1 + kMagicSize + 4 > 65535;
  const size_t prefix = kMagicSize + 2 + (version2 ? 4 : 2);
  const size_t padded = (prefix + header.size() + 1 + 63) / 64 * 64 - prefix;
  header.append(padded - header.size() - 1, ' ');
  header += '\n';

  std::string file(kMagic, kMagicSize);
  file += static_cast<char>(version2 ? 2 : 1);
  file += '\0';
  const size_t length = header.size();
  for (size_t b = 0; b < (version2 ? 4U : 2U); ++b) {
    file += static_cast<char>((length >> (8 * b)) & 0xFF);
  }
  file += header;
  AtomicFileWriter writer(path);
  writer.write(file.data(), file.size());
  writer.write(data, num_bytes);
  writer.commit();
}

void write_npy(const std::filesystem::path& path, const at::Tensor& tensor) {
  std::string descr;
  switch (tensor.scalar_type()) {
  case at::kBool:
    descr = "|b1";
    break;
  case at::kByte:
    descr = "|u1";
    break;
  case at::kChar:
    descr = "|i1";
    break;
  case at::kShort:
    descr = "<i2";
    break;
  case at::kInt:
    descr = "<i4";
    break;
  case at::kLong:
    descr = "<i8";
    break;
  case at::kHalf:
    descr = "<f2";
    break;
  case at::kFloat:
    descr = "<f4";
    break;
  case at::kDouble:
    descr = "<f8";
    break;
  default:
    throw DataError(fmt::format(
        "write_npy({}): dtype {} has no .npy equivalent here; convert to float32 first",
        path.string(),
        c10::toString(tensor.scalar_type())));
  }
  const at::Tensor contiguous = tensor.cpu().contiguous();
  write_npy(path, descr, contiguous.sizes().vec(), contiguous.data_ptr(), contiguous.nbytes());
}

void write_npy_strings(const std::filesystem::path& path, const std::vector<std::string>& values) {
  std::vector<std::vector<uint32_t>> decoded;
  size_t width = 1; // NumPy's minimum string width is 1 (dtype <U1 for empty strings)
  for (const std::string& value : values) {
    decoded.push_back(decode_utf8(value));
    width = std::max(width, decoded.back().size());
  }
  std::vector<uint32_t> data(width * values.size(), 0);
  for (size_t i = 0; i < decoded.size(); ++i) {
    std::copy(
        decoded[i].begin(),
        decoded[i].end(),
        data.begin() + static_cast<std::ptrdiff_t>(i * width));
  }
  write_npy(
      path,
      fmt::format("<U{}", width),
      {static_cast<int64_t>(values.size())},
      data.data(),
      data.size() * sizeof(uint32_t));
}

} // namespace largo::data
