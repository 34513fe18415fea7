"""The layout of a Kafka record batch, magic v2 (Kafka >= 0.11): where each header field sits,
what the attribute bits mean, and helpers to read, write and re-seal header fields in place.

A batch is a 61-byte header followed by its records (compressed as one block if the batch is)::

    base_offset int64 | length int32 | partition_leader_epoch int32 | magic int8 | crc uint32 |
    attributes int16 | last_offset_delta int32 | base_timestamp int64 | max_timestamp int64 |
    producer_id int64 | producer_epoch int16 | base_sequence int32 | records_count int32 | records

``length`` counts the bytes after itself, so a batch takes ``LOG_OVERHEAD + length`` bytes. The
CRC-32C covers everything from ``attributes`` to the end of the batch. Names follow Kafka's
``DefaultRecordBatch``: ``X_OFFSET`` is where field X starts, ``X_LENGTH`` its size in bytes.

The offsets, lengths and masks are plain module-level ints on purpose: numba-compiled loops
(ISK's compiled batch kernels) read them as compile-time constants.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from bergstream.core.kafka_wire.crc import crc32c

__all__ = [
    "ATTRIBUTES_LENGTH",
    "ATTRIBUTES_OFFSET",
    "BASE_OFFSET_LENGTH",
    "BASE_OFFSET_OFFSET",
    "BASE_SEQUENCE_LENGTH",
    "BASE_SEQUENCE_OFFSET",
    "BASE_TIMESTAMP_LENGTH",
    "BASE_TIMESTAMP_OFFSET",
    "COMPRESSION_CODEC_MASK",
    "CONTROL_FLAG_MASK",
    "CRC_LENGTH",
    "CRC_OFFSET",
    "CRC_START",
    "DELETE_HORIZON_FLAG_MASK",
    "HEADER_SIZE",
    "LAST_OFFSET_DELTA_LENGTH",
    "LAST_OFFSET_DELTA_OFFSET",
    "LENGTH_LENGTH",
    "LENGTH_OFFSET",
    "LOG_OVERHEAD",
    "MAGIC_LENGTH",
    "MAGIC_OFFSET",
    "MAGIC_V2",
    "MAX_TIMESTAMP_LENGTH",
    "MAX_TIMESTAMP_OFFSET",
    "MIN_LENGTH",
    "PARTITION_LEADER_EPOCH_LENGTH",
    "PARTITION_LEADER_EPOCH_OFFSET",
    "PRODUCER_EPOCH_LENGTH",
    "PRODUCER_EPOCH_OFFSET",
    "PRODUCER_ID_LENGTH",
    "PRODUCER_ID_OFFSET",
    "RECORDS_COUNT_LENGTH",
    "RECORDS_COUNT_OFFSET",
    "TIMESTAMP_TYPE_MASK",
    "TRANSACTIONAL_FLAG_MASK",
    "Buffer",
    "CompressionType",
    "ControlRecordType",
    "batch_end",
    "control_record_key",
    "control_record_type",
    "read_field",
    "write_crc",
    "write_field",
]

Buffer = bytes | bytearray | memoryview

BASE_OFFSET_OFFSET = 0
BASE_OFFSET_LENGTH = 8
LENGTH_OFFSET = BASE_OFFSET_OFFSET + BASE_OFFSET_LENGTH
LENGTH_LENGTH = 4
PARTITION_LEADER_EPOCH_OFFSET = LENGTH_OFFSET + LENGTH_LENGTH
PARTITION_LEADER_EPOCH_LENGTH = 4
MAGIC_OFFSET = PARTITION_LEADER_EPOCH_OFFSET + PARTITION_LEADER_EPOCH_LENGTH
MAGIC_LENGTH = 1
CRC_OFFSET = MAGIC_OFFSET + MAGIC_LENGTH
CRC_LENGTH = 4
ATTRIBUTES_OFFSET = CRC_OFFSET + CRC_LENGTH
ATTRIBUTES_LENGTH = 2
LAST_OFFSET_DELTA_OFFSET = ATTRIBUTES_OFFSET + ATTRIBUTES_LENGTH
LAST_OFFSET_DELTA_LENGTH = 4
BASE_TIMESTAMP_OFFSET = LAST_OFFSET_DELTA_OFFSET + LAST_OFFSET_DELTA_LENGTH
BASE_TIMESTAMP_LENGTH = 8
MAX_TIMESTAMP_OFFSET = BASE_TIMESTAMP_OFFSET + BASE_TIMESTAMP_LENGTH
MAX_TIMESTAMP_LENGTH = 8
PRODUCER_ID_OFFSET = MAX_TIMESTAMP_OFFSET + MAX_TIMESTAMP_LENGTH
PRODUCER_ID_LENGTH = 8
PRODUCER_EPOCH_OFFSET = PRODUCER_ID_OFFSET + PRODUCER_ID_LENGTH
PRODUCER_EPOCH_LENGTH = 2
BASE_SEQUENCE_OFFSET = PRODUCER_EPOCH_OFFSET + PRODUCER_EPOCH_LENGTH
BASE_SEQUENCE_LENGTH = 4
RECORDS_COUNT_OFFSET = BASE_SEQUENCE_OFFSET + BASE_SEQUENCE_LENGTH
RECORDS_COUNT_LENGTH = 4

#: Bytes of the header; the records start here.
HEADER_SIZE = RECORDS_COUNT_OFFSET + RECORDS_COUNT_LENGTH
#: Bytes before the part ``length`` counts: the base offset and the length itself.
LOG_OVERHEAD = LENGTH_OFFSET + LENGTH_LENGTH
#: Smallest valid ``length``: a header without records.
MIN_LENGTH = HEADER_SIZE - LOG_OVERHEAD
#: Where the bytes the CRC covers begin (they run to the end of the batch).
CRC_START = ATTRIBUTES_OFFSET
#: The magic byte of the v2 format, the only one read or written here.
MAGIC_V2 = 2

COMPRESSION_CODEC_MASK = 0x07
#: Set: LogAppendTime (every record carries the batch's max timestamp); clear: CreateTime.
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
#: Set on batches of transaction markers, which hold one control record and no data.
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40


class CompressionType(IntEnum):
    """The codec of a batch's records, the low bits of its attributes (Kafka's CompressionType
    ids)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class ControlRecordType(IntEnum):
    """What a transaction marker says, the ``type`` in its control record's key."""

    ABORT = 0
    COMMIT = 1


_FIELDS: dict[int, struct.Struct] = {
    BASE_OFFSET_OFFSET: struct.Struct(">q"),
    LENGTH_OFFSET: struct.Struct(">i"),
    PARTITION_LEADER_EPOCH_OFFSET: struct.Struct(">i"),
    MAGIC_OFFSET: struct.Struct(">b"),
    CRC_OFFSET: struct.Struct(">I"),
    ATTRIBUTES_OFFSET: struct.Struct(">h"),
    LAST_OFFSET_DELTA_OFFSET: struct.Struct(">i"),
    BASE_TIMESTAMP_OFFSET: struct.Struct(">q"),
    MAX_TIMESTAMP_OFFSET: struct.Struct(">q"),
    PRODUCER_ID_OFFSET: struct.Struct(">q"),
    PRODUCER_EPOCH_OFFSET: struct.Struct(">h"),
    BASE_SEQUENCE_OFFSET: struct.Struct(">i"),
    RECORDS_COUNT_OFFSET: struct.Struct(">i"),
}
#: A control record's key: version int16, type int16 (:class:`ControlRecordType`).
_CONTROL_KEY = struct.Struct(">hh")


def read_field(data: Buffer, field: int, position: int = 0) -> int:
    """The header field starting at ``field`` (an ``*_OFFSET`` of this module) of the batch at
    ``position`` of ``data``; the CRC reads unsigned, every other field signed."""
    value: int = _FIELDS[field].unpack_from(data, position + field)[0]
    return value


def write_field(data: bytearray | memoryview, field: int, value: int, position: int = 0) -> None:
    """Write ``value`` into the header field starting at ``field`` (an ``*_OFFSET`` of this
    module) of the batch at ``position`` of ``data``. The CRC is not updated: see
    :func:`write_crc`."""
    _FIELDS[field].pack_into(data, position + field, value)


def write_crc(batch: bytearray | memoryview) -> None:
    """Recompute the CRC of ``batch`` (exactly one whole batch) and store it, after an edit of
    its attributes or of anything after them."""
    write_field(batch, CRC_OFFSET, crc32c(memoryview(batch)[CRC_START:]))


def batch_end(data: Buffer, position: int = 0) -> int | None:
    """Where the batch starting at ``position`` of ``data`` ends, or None when no complete batch
    starts there: too few bytes left (a fetch may be cut mid-batch) or a ``length`` smaller
    than a header."""
    if position + MAGIC_OFFSET + MAGIC_LENGTH > len(data):
        return None
    length = read_field(data, LENGTH_OFFSET, position)
    end = position + LOG_OVERHEAD + length
    if length < MIN_LENGTH or end > len(data):
        return None
    return end


def control_record_key(kind: ControlRecordType) -> bytes:
    """The key of a control record (a transaction marker) of type ``kind``, version 0."""
    return _CONTROL_KEY.pack(0, kind)


def control_record_type(key: bytes | None) -> int | None:
    """The type of a control record from its key (compare with :class:`ControlRecordType`),
    or None when the key is missing or too short to hold one."""
    if key is None or len(key) < _CONTROL_KEY.size:
        return None
    _version, kind = _CONTROL_KEY.unpack_from(key)
    return int(kind)
