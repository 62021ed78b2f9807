#!/usr/bin/env python3
"""Independent reader for TensorBoard event files, used by the C++ tests to check that
largo::train::TensorBoardWriter writes what TensorBoard reads.

Standard library only (neither tensorboard nor protobuf is installed here): it re-implements
CRC32C (table-based, reflected polynomial 0x82F63B78), checks the TFRecord framing and both
masked CRCs of every record, and decodes the tensorflow.Event fields Largo writes.

Usage:
  read_tfevents.py EVENT_FILE    print the events as a JSON list on stdout; exit 1 with a
                                 message on stderr if the file is malformed
  read_tfevents.py --self-test   check CRC32C against the standard test vector
"""

import json
import math
import struct
import sys

_POLYNOMIAL = 0x82F63B78  # CRC32C (Castagnoli), bit-reflected


def _make_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLYNOMIAL if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class FormatError(Exception):
    pass


def read_records(blob: bytes):
    """Yields the payload of each TFRecord in `blob`, checking lengths and CRCs."""
    offset = 0
    index = 0
    while offset < len(blob):
        if offset + 12 > len(blob):
            raise FormatError(f"record {index}: truncated header at byte {offset}")
        length_bytes = blob[offset:offset + 8]
        (length,) = struct.unpack("<Q", length_bytes)
        (length_crc,) = struct.unpack("<I", blob[offset + 8:offset + 12])
        if length_crc != masked_crc32c(length_bytes):
            raise FormatError(f"record {index}: bad length CRC at byte {offset}")
        start = offset + 12
        end = start + length
        if end + 4 > len(blob):
            raise FormatError(f"record {index}: truncated payload at byte {start}")
        payload = blob[start:end]
        (payload_crc,) = struct.unpack("<I", blob[end:end + 4])
        if payload_crc != masked_crc32c(payload):
            raise FormatError(f"record {index}: bad payload CRC at byte {end}")
        yield payload
        offset = end + 4
        index += 1


def read_varint(data: bytes, offset: int):
    value = 0
    shift = 0
    while True:
        if offset >= len(data):
            raise FormatError("truncated varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift >= 70:
            raise FormatError("varint longer than 10 bytes")


def parse_fields(data: bytes):
    """Splits a protobuf message into (field_number, wire_type, raw value) triples:
    an int for varints, bytes for fixed32 / fixed64 / length-delimited."""
    fields = []
    offset = 0
    while offset < len(data):
        key, offset = read_varint(data, offset)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, offset = read_varint(data, offset)
        elif wire_type == 1:
            value, offset = data[offset:offset + 8], offset + 8
        elif wire_type == 2:
            length, offset = read_varint(data, offset)
            value, offset = data[offset:offset + length], offset + length
        elif wire_type == 5:
            value, offset = data[offset:offset + 4], offset + 4
        else:
            raise FormatError(f"unsupported wire type {wire_type} (field {field})")
        if offset > len(data):
            raise FormatError(f"field {field} runs past the end of its message")
        fields.append((field, wire_type, value))
    return fields


def expect(wire_type, wanted, name):
    if wire_type != wanted:
        raise FormatError(f"{name}: wire type {wire_type}, expected {wanted}")


def as_double(raw: bytes) -> float:
    return struct.unpack("<d", raw)[0]


def as_float(raw: bytes) -> float:
    return struct.unpack("<f", raw)[0]


def as_int64(varint: int) -> int:
    return varint - (1 << 64) if varint >= 1 << 63 else varint


def packed_doubles(raw: bytes):
    if len(raw) % 8:
        raise FormatError("packed doubles: length not a multiple of 8")
    return list(struct.unpack(f"<{len(raw) // 8}d", raw))


def decode_histogram(data: bytes):
    names = {1: "min", 2: "max", 3: "num", 4: "sum", 5: "sum_squares"}
    histo = {"bucket_limit": [], "bucket": []}
    for field, wire_type, raw in parse_fields(data):
        if field in names:
            expect(wire_type, 1, f"HistogramProto.{names[field]}")
            histo[names[field]] = as_double(raw)
        elif field == 6:
            expect(wire_type, 2, "HistogramProto.bucket_limit")
            histo["bucket_limit"] += packed_doubles(raw)
        elif field == 7:
            expect(wire_type, 2, "HistogramProto.bucket")
            histo["bucket"] += packed_doubles(raw)
    if len(histo["bucket_limit"]) != len(histo["bucket"]):
        raise FormatError("HistogramProto: bucket_limit and bucket differ in length")
    return histo


def decode_value(data: bytes):
    value = {}
    for field, wire_type, raw in parse_fields(data):
        if field == 1:
            expect(wire_type, 2, "Summary.Value.tag")
            value["tag"] = raw.decode("utf-8")
        elif field == 2:
            expect(wire_type, 5, "Summary.Value.simple_value")
            value["simple_value"] = as_float(raw)
        elif field == 5:
            expect(wire_type, 2, "Summary.Value.histo")
            value["histo"] = decode_histogram(raw)
    return value


def decode_event(data: bytes):
    event = {}
    for field, wire_type, raw in parse_fields(data):
        if field == 1:
            expect(wire_type, 1, "Event.wall_time")
            event["wall_time"] = as_double(raw)
        elif field == 2:
            expect(wire_type, 0, "Event.step")
            event["step"] = as_int64(raw)
        elif field == 3:
            expect(wire_type, 2, "Event.file_version")
            event["file_version"] = raw.decode("utf-8")
        elif field == 5:
            expect(wire_type, 2, "Event.summary")
            event["summary"] = [decode_value(value_raw)
                                for value_field, value_wire, value_raw in parse_fields(raw)
                                if value_field == 1]
    return event


def _json_safe(obj):
    """JSON has no NaN/Infinity: spell them as strings so any JSON parser reads the output."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {key: _json_safe(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(value) for value in obj]
    return obj


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "--self-test":
        got = crc32c(b"123456789")
        if got != 0xE3069283:
            print(f"crc32c('123456789') = {got:#010x}, expected 0xe3069283", file=sys.stderr)
            return 1
        print("ok")
        return 0
    with open(argv[1], "rb") as f:
        blob = f.read()
    try:
        events = [decode_event(payload) for payload in read_records(blob)]
        if not events or events[0].get("file_version") != "brain.Event:2":
            raise FormatError("first record is not a file_version 'brain.Event:2' event")
    except FormatError as error:
        print(f"{argv[1]}: {error}", file=sys.stderr)
        return 1
    json.dump(_json_safe(events), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
