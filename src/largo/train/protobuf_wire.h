// Private helpers for writing TensorBoard event files without a protobuf library:
// CRC32C (Castagnoli) as TFRecord framing needs it, and the few protobuf wire-format
// encoders that a tensorflow.Event needs. Not part of the public API.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace largo::train::wire {

// CRC32C of `bytes` (reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF).
// crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view bytes);

// TFRecord stores CRCs "masked" so that a CRC computed over data that itself contains
// CRCs is not trivially related to them: rotate right by 15, then add a constant.
uint32_t masked_crc32c(std::string_view bytes);

// Appends one TFRecord to `out`: uint64 little-endian payload length, uint32 masked
// CRC32C of those 8 length bytes, the payload, uint32 masked CRC32C of the payload.
void append_tfrecord(std::string& out, std::string_view payload);

// Protobuf wire types used here (varint, 64-bit, length-delimited, 32-bit).
enum class WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Base-128 varint, least significant group first; negative int64 values take 10 bytes,
// as protobuf encodes them (two's complement reinterpreted as uint64).
void append_varint(std::string& out, uint64_t value);

// Field key = (field_number << 3) | wire_type, itself a varint.
void append_key(std::string& out, uint32_t field_number, WireType wire_type);

void append_fixed32(std::string& out, uint32_t value); // little-endian
void append_fixed64(std::string& out, uint64_t value); // little-endian

// Whole fields (key + value) for the scalar types protobuf messages use.
void append_int64_field(std::string& out, uint32_t field_number, int64_t value);
void append_double_field(std::string& out, uint32_t field_number, double value);
void append_float_field(std::string& out, uint32_t field_number, float value);
// A string, bytes or an already-serialized sub-message: key, varint length, bytes.
void append_bytes_field(std::string& out, uint32_t field_number, std::string_view bytes);
// A `repeated double` field with [packed=true]: one length-delimited run of fixed64s.
void append_packed_doubles_field(
    std::string& out, uint32_t field_number, std::span<const double> values);

} // namespace largo::train::wire
