// CRC32C, TFRecord framing and protobuf wire encoders; see protobuf_wire.h.
#include "protobuf_wire.h"

#include <array>
#include <bit>

namespace largo::train::wire {
namespace {

// Byte-at-a-time lookup table for the reflected Castagnoli polynomial, built at compile
// time. Event files are small (a few records per step), so slicing-by-8 or the SSE4.2
// instruction would buy nothing worth the extra code.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  constexpr uint32_t kReflectedPolynomial = 0x82F63B78u;
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 1u) ? (crc >> 1) ^ kReflectedPolynomial : crc >> 1;
    }
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

} // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) {
    crc = kCrc32cTable[(crc ^ static_cast<uint8_t>(c)) & 0xFFu] ^ (crc >> 8);
  }
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view bytes) {
  constexpr uint32_t kMaskDelta = 0xA282EAD8u;
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

void append_tfrecord(std::string& out, std::string_view payload) {
  std::string length_bytes;
  append_fixed64(length_bytes, static_cast<uint64_t>(payload.size()));
  out += length_bytes;
  append_fixed32(out, masked_crc32c(length_bytes));
  out += payload;
  append_fixed32(out, masked_crc32c(payload));
}

void append_varint(std::string& out, uint64_t value) {
  while (value >= 0x80u) {
    out.push_back(static_cast<char>((value & 0x7Fu) | 0x80u));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void append_key(std::string& out, uint32_t field_number, WireType wire_type) {
  append_varint(out, (static_cast<uint64_t>(field_number) << 3) | static_cast<uint64_t>(wire_type));
}

// Shifts rather than memcpy so the bytes are little-endian whatever the host order.
void append_fixed32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
  }
}

void append_fixed64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xFFu));
  }
}

void append_int64_field(std::string& out, uint32_t field_number, int64_t value) {
  append_key(out, field_number, WireType::kVarint);
  append_varint(out, static_cast<uint64_t>(value));
}

void append_double_field(std::string& out, uint32_t field_number, double value) {
  append_key(out, field_number, WireType::kFixed64);
  append_fixed64(out, std::bit_cast<uint64_t>(value));
}

void append_float_field(std::string& out, uint32_t field_number, float value) {
  append_key(out, field_number, WireType::kFixed32);
  append_fixed32(out, std::bit_cast<uint32_t>(value));
}

void append_bytes_field(std::string& out, uint32_t field_number, std::string_view bytes) {
  append_key(out, field_number, WireType::kLengthDelimited);
  append_varint(out, bytes.size());
  out += bytes;
}

void append_packed_doubles_field(
    std::string& out, uint32_t field_number, std::span<const double> values) {
  append_key(out, field_number, WireType::kLengthDelimited);
  append_varint(out, values.size() * sizeof(uint64_t));
  for (const double value : values) {
    append_fixed64(out, std::bit_cast<uint64_t>(value));
  }
}

} // namespace largo::train::wire
