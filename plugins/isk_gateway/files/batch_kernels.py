"""Compiled loops over Kafka v2 record batches (numba): the batch headers of a fetch's bytes, and
the records of those batches as flat columns, with no Python object per record.

Two kernels, both ``nogil`` so several partitions decode at once on threads:

- :func:`scan_batches` walks the batches of a records blob and returns one row of header fields
  per complete batch (a trailing partial batch is left out, as brokers cut fetches mid-batch).
  CRCs are checked by the caller with the hardware CRC-32C of the ``crc32c`` package, an order
  of magnitude faster than a table loop.
- :func:`decode_records` walks the records of chosen batch bodies ("segments": the bytes after
  a batch header, decompressed if the batch was compressed). Called once with ``fill=False`` it
  only counts rows and bytes, so the caller can allocate exact outputs; called again with
  ``fill=True`` it writes them. Malformed bytes give a negative status, never a crash.

The caller (:mod:`.batch_decoder`) turns the outputs into Arrow buffers without a copy.
"""

from __future__ import annotations

import numpy as np

from bergstream.core.api import cached_njit, copy_bytes, read_varint, record_batch, unzigzag

# Module-level ints: numba freezes them into the compiled code. Its on-disk cache is keyed on
# this file only, which is fine as Kafka never changes the v2 layout.
ATTRIBUTES_LENGTH = record_batch.ATTRIBUTES_LENGTH
ATTRIBUTES_OFFSET = record_batch.ATTRIBUTES_OFFSET
BASE_OFFSET_LENGTH = record_batch.BASE_OFFSET_LENGTH
BASE_OFFSET_OFFSET = record_batch.BASE_OFFSET_OFFSET
BASE_TIMESTAMP_LENGTH = record_batch.BASE_TIMESTAMP_LENGTH
BASE_TIMESTAMP_OFFSET = record_batch.BASE_TIMESTAMP_OFFSET
CRC_LENGTH = record_batch.CRC_LENGTH
CRC_OFFSET = record_batch.CRC_OFFSET
HEADER_SIZE = record_batch.HEADER_SIZE
LAST_OFFSET_DELTA_LENGTH = record_batch.LAST_OFFSET_DELTA_LENGTH
LAST_OFFSET_DELTA_OFFSET = record_batch.LAST_OFFSET_DELTA_OFFSET
LENGTH_LENGTH = record_batch.LENGTH_LENGTH
LENGTH_OFFSET = record_batch.LENGTH_OFFSET
LOG_OVERHEAD = record_batch.LOG_OVERHEAD
MAGIC_LENGTH = record_batch.MAGIC_LENGTH
MAGIC_OFFSET = record_batch.MAGIC_OFFSET
MAGIC_V2 = record_batch.MAGIC_V2
MAX_TIMESTAMP_LENGTH = record_batch.MAX_TIMESTAMP_LENGTH
MAX_TIMESTAMP_OFFSET = record_batch.MAX_TIMESTAMP_OFFSET
MIN_LENGTH = record_batch.MIN_LENGTH
PRODUCER_ID_LENGTH = record_batch.PRODUCER_ID_LENGTH
PRODUCER_ID_OFFSET = record_batch.PRODUCER_ID_OFFSET
RECORDS_COUNT_LENGTH = record_batch.RECORDS_COUNT_LENGTH
RECORDS_COUNT_OFFSET = record_batch.RECORDS_COUNT_OFFSET

__all__ = [
    "BATCH_FIELDS",
    "ERRORS",
    "decode_records",
    "scan_batches",
]

#: Columns of :func:`scan_batches`' output, in order.
BATCH_FIELDS = (
    "position",
    "end",
    "magic",
    "stored_crc",
    "base_offset",
    "attributes",
    "last_offset_delta",
    "base_timestamp",
    "max_timestamp",
    "producer_id",
    "record_count",
)
(
    POSITION,
    END,
    MAGIC,
    STORED_CRC,
    BASE_OFFSET,
    ATTRIBUTES,
    LAST_OFFSET_DELTA,
    BASE_TIMESTAMP,
    MAX_TIMESTAMP,
    PRODUCER_ID,
    RECORD_COUNT,
) = range(len(BATCH_FIELDS))

#: Why :func:`decode_records` stopped, by its negative status.
ERRORS = {
    -1: "a varint runs past its record or is longer than 10 bytes",
    -2: "a record's length runs past its batch",
    -3: "a key, value or header runs past its record",
    -4: "a record's fields do not add up to its length",
    -5: "a negative header count",
    -6: "a batch holds bytes after its last record",
    -7: "a header key has a negative length",
}


@cached_njit(nogil=True, inline="always")
def _int(buf: np.ndarray, pos: int, size: int) -> int:
    """The big-endian signed integer of ``size`` bytes at ``pos``."""
    value = np.int64(0)
    for i in range(size):
        value = (value << 8) | np.int64(buf[pos + i])
    if size < 8:
        sign = np.int64(1) << (8 * size - 1)
        value = (value ^ sign) - sign
    return value


@cached_njit(nogil=True)
def scan_batches(buf: np.ndarray) -> np.ndarray:
    """One row of :data:`BATCH_FIELDS` per complete batch of ``buf``, in order. A batch whose
    magic is not 2 ends the scan (its row has the magic; later fields are 0)."""
    size = buf.size
    out = np.zeros((min(size // HEADER_SIZE + 1, 4096), len(BATCH_FIELDS)), dtype=np.int64)
    count = 0
    pos = 0
    while pos + MAGIC_OFFSET + MAGIC_LENGTH <= size:
        length = _int(buf, pos + LENGTH_OFFSET, LENGTH_LENGTH)
        end = pos + LOG_OVERHEAD + length
        if length < MIN_LENGTH or end > size:
            break
        if count == out.shape[0]:
            grown = np.zeros((2 * count, len(BATCH_FIELDS)), dtype=np.int64)
            grown[:count] = out
            out = grown
        row = out[count]
        row[POSITION] = pos
        row[END] = end
        row[MAGIC] = buf[pos + MAGIC_OFFSET]
        count += 1
        if buf[pos + MAGIC_OFFSET] != MAGIC_V2:
            break
        row[STORED_CRC] = _int(buf, pos + CRC_OFFSET, CRC_LENGTH) & 0xFFFFFFFF
        row[BASE_OFFSET] = _int(buf, pos + BASE_OFFSET_OFFSET, BASE_OFFSET_LENGTH)
        row[ATTRIBUTES] = _int(buf, pos + ATTRIBUTES_OFFSET, ATTRIBUTES_LENGTH)
        row[LAST_OFFSET_DELTA] = _int(buf, pos + LAST_OFFSET_DELTA_OFFSET, LAST_OFFSET_DELTA_LENGTH)
        row[BASE_TIMESTAMP] = _int(buf, pos + BASE_TIMESTAMP_OFFSET, BASE_TIMESTAMP_LENGTH)
        row[MAX_TIMESTAMP] = _int(buf, pos + MAX_TIMESTAMP_OFFSET, MAX_TIMESTAMP_LENGTH)
        row[PRODUCER_ID] = _int(buf, pos + PRODUCER_ID_OFFSET, PRODUCER_ID_LENGTH)
        row[RECORD_COUNT] = _int(buf, pos + RECORDS_COUNT_OFFSET, RECORDS_COUNT_LENGTH)
        pos = end
    return out[:count]


@cached_njit(nogil=True, inline="always")
def _varint(buf: np.ndarray, pos: int, end: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` and the position after it; position -1 if malformed (bits
    beyond 64 are dropped, as Kafka's own reader does)."""
    raw, pos, _ = read_varint(buf, pos, end)
    if pos < 0:
        return 0, -1
    return unzigzag(raw), pos


@cached_njit(nogil=True, inline="always")
def _field(buf: np.ndarray, pos: int, end: int) -> tuple[int, int, int]:
    """A length-prefixed field at ``pos``: its length (-1: null), where its bytes start, and the
    position after it; that position is -1 or -3 (:data:`ERRORS`) if the field is malformed."""
    length, pos = _varint(buf, pos, end)
    if pos < 0:
        return 0, 0, -1
    if length > end - pos:
        return 0, 0, -3
    return length, pos, pos + max(length, 0)


@cached_njit(nogil=True, inline="always")
def _append(
    buf: np.ndarray,
    start: int,
    length: int,
    fill: bool,
    data: np.ndarray,
    offsets: np.ndarray,
    valid: np.ndarray,
    index: int,
    filled: int,
) -> int:
    """Item ``index`` of a binary column holding ``filled`` bytes so far: the ``length`` bytes
    at ``start`` (-1: null), written only with ``fill``. Returns the column's byte count."""
    if length > 0:
        if fill:
            copy_bytes(data, filled, buf, start, length)
        filled += length
    if fill:
        valid[index] = 1 if length >= 0 else 0
        offsets[index + 1] = filled
    return filled


@cached_njit(nogil=True)
def decode_records(
    plain: np.ndarray,
    decompressed: np.ndarray,
    segments: np.ndarray,
    start_offset: int,
    end_offset: int,
    fill: bool,
    totals: np.ndarray,
    offsets: np.ndarray,
    timestamps: np.ndarray,
    timestamp_types: np.ndarray,
    key_offsets: np.ndarray,
    key_data: np.ndarray,
    key_valid: np.ndarray,
    value_offsets: np.ndarray,
    value_data: np.ndarray,
    value_valid: np.ndarray,
    header_list_offsets: np.ndarray,
    header_key_offsets: np.ndarray,
    header_key_data: np.ndarray,
    header_key_valid: np.ndarray,
    header_value_offsets: np.ndarray,
    header_value_data: np.ndarray,
    header_value_valid: np.ndarray,
) -> int:
    """Walk the records of ``segments`` (rows of: source 0 = ``plain`` or 1 = ``decompressed``,
    start, end, record count, base offset, base timestamp, max timestamp, log-append-time flag,
    timestamp type) keeping offsets in ``[start_offset, end_offset)``.

    Always sets ``totals`` to (rows, key bytes, value bytes, headers, header key bytes, header
    value bytes); with ``fill`` also writes the outputs, which must be sized from a counting
    call. Returns 0, or a negative status of :data:`ERRORS`.
    """
    rows = 0
    key_bytes = 0
    value_bytes = 0
    headers = 0
    header_key_bytes = 0
    header_value_bytes = 0
    if fill:
        key_offsets[0] = 0
        value_offsets[0] = 0
        header_list_offsets[0] = 0
        header_key_offsets[0] = 0
        header_value_offsets[0] = 0
    for s in range(segments.shape[0]):
        buf = plain if segments[s, 0] == 0 else decompressed
        pos = segments[s, 1]
        seg_end = segments[s, 2]
        base_offset = segments[s, 4]
        base_timestamp = segments[s, 5]
        max_timestamp = segments[s, 6]
        log_append = segments[s, 7] != 0
        timestamp_type = segments[s, 8]
        for _ in range(segments[s, 3]):
            length, pos = _varint(buf, pos, seg_end)
            if pos < 0:
                return -1
            if length < 1 or length > seg_end - pos:
                return -2
            record_end = pos + length
            pos += 1  # record attributes (unused)
            timestamp_delta, pos = _varint(buf, pos, record_end)
            if pos < 0:
                return -1
            offset_delta, pos = _varint(buf, pos, record_end)
            if pos < 0:
                return -1
            offset = base_offset + offset_delta
            keep = start_offset <= offset < end_offset
            key_length, key_start, pos = _field(buf, pos, record_end)
            if pos < 0:
                return pos
            value_length, value_start, pos = _field(buf, pos, record_end)
            if pos < 0:
                return pos
            header_count, pos = _varint(buf, pos, record_end)
            if pos < 0:
                return -1
            if header_count < 0:
                return -5
            for _h in range(header_count):
                header_key_length, header_key_start, pos = _field(buf, pos, record_end)
                if pos < 0:
                    return pos
                if header_key_length < 0:
                    return -7
                header_value_length, header_value_start, pos = _field(buf, pos, record_end)
                if pos < 0:
                    return pos
                if keep:
                    header_key_bytes = _append(
                        buf, header_key_start, header_key_length, fill, header_key_data,
                        header_key_offsets, header_key_valid, headers, header_key_bytes,
                    )  # fmt: skip
                    header_value_bytes = _append(
                        buf, header_value_start, header_value_length, fill, header_value_data,
                        header_value_offsets, header_value_valid, headers, header_value_bytes,
                    )  # fmt: skip
                    headers += 1
            if pos != record_end:
                return -4
            if not keep:
                continue
            if fill:
                offsets[rows] = offset
                timestamps[rows] = max_timestamp if log_append else base_timestamp + timestamp_delta
                timestamp_types[rows] = timestamp_type
                header_list_offsets[rows + 1] = headers
            key_bytes = _append(
                buf, key_start, key_length, fill, key_data, key_offsets, key_valid, rows, key_bytes
            )
            value_bytes = _append(
                buf, value_start, value_length, fill, value_data, value_offsets, value_valid, rows,
                value_bytes,
            )  # fmt: skip
            rows += 1
        if pos != seg_end:
            return -6
    totals[0] = rows
    totals[1] = key_bytes
    totals[2] = value_bytes
    totals[3] = headers
    totals[4] = header_key_bytes
    totals[5] = header_value_bytes
    return 0
