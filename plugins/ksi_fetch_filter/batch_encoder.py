"""Cold rows -> Kafka v2 record batches straight from the segment's Arrow columns: the compiled
loop of :mod:`.encode_kernels` writes every batch into one buffer, then each batch is sealed
with the hardware CRC-32C. No Python object per record; the bytes are those of the reference
builder (:func:`.batches.build_cold_batches_reference`).

Only the rows a fetch can use are prepared: a first guess from the segment's bytes per row and
the budget, doubled while the kernel asks for more rows.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bergstream.core.api import ROW_ARROW_SCHEMA, crc32c, record_batch
from bergstream.plugins.ksi_fetch_filter.coldset import ColdRead
from bergstream.plugins.ksi_fetch_filter.encode_kernels import (
    BATCHES,
    DONE,
    MORE_ROWS,
    NEXT_OFFSET,
    NO_ROOM,
    RECORDS,
    REQUIRED,
    RESULT_FIELDS,
    SIZE,
    encode_batches,
)

__all__ = ["EncodedBatches", "encode_cold_batches"]

_CRC = struct.Struct(">I")
_CRC_FIELD = record_batch.CRC_OFFSET
_CRC_START = record_batch.CRC_START
_HEADER_SIZE = record_batch.HEADER_SIZE
#: Bytes of a record besides its key, value and header bytes, at most (length, attributes,
#: timestamp and offset deltas, key and value lengths, header count), and of a header.
_RECORD_MAX_OVERHEAD = 5 + 1 + 10 + 10 + 5 + 5 + 5
_HEADER_MAX_OVERHEAD = 10
_FIRST_OUT_SLACK = 1 << 16
_OFFSETS_TYPES = {
    pa.binary(): np.int32,
    pa.string(): np.int32,
    pa.large_binary(): np.int64,
    pa.large_string(): np.int64,
}


@dataclass(frozen=True, slots=True)
class EncodedBatches:
    """Encoded batches and the offset a consumer fetches next."""

    data: bytes
    next_offset: int
    records: int


@dataclass(frozen=True, slots=True)
class _Binary:
    """A binary or string column as the kernel reads it."""

    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64, len + 1, into data
    valid: np.ndarray  # uint8

    @property
    def span(self) -> int:
        """Bytes of its items."""
        return int(self.offsets[-1] - self.offsets[0])


def _binary(column: pa.Array | pa.ChunkedArray, what: str) -> _Binary:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    dtype = _OFFSETS_TYPES.get(array.type)
    if dtype is None:
        try:
            array = array.cast(pa.large_binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise ValueError(
                f"coldset column {what} is {array.type}, not binary: the row contract needs"
                " binary keys, values and header values and string header keys"
            ) from error
        dtype = np.int64
    length = len(array)
    buffers = array.buffers()
    if buffers[1] is None:  # an empty array may come without offsets
        offsets = np.zeros(length + 1, np.int64)
    else:
        raw = np.frombuffer(buffers[1], dtype=dtype)
        offsets = raw[array.offset : array.offset + length + 1].astype(np.int64)
    data = np.frombuffer(buffers[2] if buffers[2] is not None else b"", dtype=np.uint8)
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
    else:
        valid = np.ones(length, np.uint8)
    return _Binary(data, offsets, valid)


def _headers(column: pa.ChunkedArray) -> tuple[np.ndarray, _Binary, _Binary]:
    """Each row's range in the header columns (a null list has no headers), the keys and the
    values of all headers."""
    lists = column.combine_chunks()
    counts = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False)
    rows = np.zeros(len(lists) + 1, np.int64)
    np.cumsum(counts, out=rows[1:])
    items = lists.flatten()  # skips what null lists hide, minds the slice offset
    fields = dict(zip((field.name for field in items.type), items.flatten(), strict=True))
    keys = _binary(fields["key"], "kafka_headers[].key")
    if not keys.valid.all():
        raise ValueError(
            "a header key is null in the coldset; the row contract keeps header keys as"
            " strings (rewrite the rows with the key, empty if need be)"
        )
    return rows, keys, _binary(fields["value"], "kafka_headers[].value")


def _encode(
    read: ColdRead, stop: int, budget: int, batch_max_bytes: int, first_in_response: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Run the kernel on rows ``read.start:stop``: (out, batch starts, result), or None when
    the rows ran out before the budget."""
    segment = read.segment
    start = read.start
    count = stop - start
    part = segment.payload.slice(start, count)
    keys = _binary(part.column("kafka_key"), "kafka_key")
    values = _binary(part.column("kafka_value"), "kafka_value")
    header_rows, header_keys, header_values = _headers(part.column("kafka_headers"))
    offsets = segment.offsets[start:stop]
    timestamps = segment.timestamps[start:stop]
    timestamp_types = segment.timestamp_types[start:stop]
    payload = keys.span + values.span + header_keys.span + header_values.span
    most = (
        payload
        + count * (_HEADER_SIZE + _RECORD_MAX_OVERHEAD)
        + (len(header_keys.offsets) - 1) * _HEADER_MAX_OVERHEAD
    )
    capacity = max(min(most, budget + _FIRST_OUT_SLACK), _HEADER_SIZE)
    tail = -1 if read.tail is None else read.tail
    result = np.zeros(len(RESULT_FIELDS), np.int64)
    while True:
        out = np.empty(capacity, np.uint8)
        starts = np.empty(capacity // _HEADER_SIZE + 1, np.int64)
        status = encode_batches(
            offsets, timestamps, timestamp_types,
            keys.offsets, keys.data, keys.valid,
            values.offsets, values.data, values.valid,
            header_rows, header_keys.offsets, header_keys.data,
            header_values.offsets, header_values.data, header_values.valid,
            stop < read.stop, int(segment.offsets[read.stop - 1]), tail, budget, batch_max_bytes,
            first_in_response, out, starts, result,
        )  # fmt: skip
        if status == DONE:
            return out, starts, result
        if status == MORE_ROWS:
            return None
        assert status == NO_ROOM
        capacity = max(int(result[REQUIRED]), 2 * capacity)


def encode_cold_batches(
    read: ColdRead, budget: int, batch_max_bytes: int, *, first_in_response: bool
) -> EncodedBatches:
    """Encode rows of ``read`` as batches totalling at most ``budget`` bytes, as
    :func:`.batches.build_cold_batches` documents, byte for byte as its reference builder."""
    segment = read.segment
    per_row = max(segment.nbytes // max(len(segment), 1), 1)
    rows = budget // per_row * 2 + 64
    while True:
        stop = min(read.start + rows, read.stop)
        encoded = _encode(read, stop, budget, batch_max_bytes, first_in_response)
        if encoded is not None:
            break
        rows *= 2
    out, starts, result = encoded
    size = int(result[SIZE])
    view = memoryview(out)
    bounds = [*starts[: int(result[BATCHES])].tolist(), size]
    for begin, end in pairwise(bounds):
        _CRC.pack_into(out, begin + _CRC_FIELD, crc32c(view[begin + _CRC_START : end]))
    return EncodedBatches(out[:size].tobytes(), int(result[NEXT_OFFSET]), int(result[RECORDS]))


def warm_up() -> None:
    """Compile the encoder's kernels (or load them from numba's on-disk cache) now, so the first
    cold Fetch does not wait for it: one row with a key, a value and a header, encoded once."""
    from bergstream.plugins.ksi_fetch_filter.segments import decode_segment

    row = {
        "kafka_partition": 0,
        "kafka_offset": 0,
        "kafka_timestamp": datetime.fromtimestamp(0, UTC),
        "kafka_timestamp_type": 0,
        "kafka_key": b"k",
        "kafka_headers": [{"key": "h", "value": b"v"}],
        "kafka_value": b"v",
    }
    table = pa.Table.from_pylist([row], schema=ROW_ARROW_SCHEMA)
    segment = decode_segment(table, 0)
    encode_cold_batches(ColdRead(segment, 0, 1, None), 1 << 16, 1 << 16, first_in_response=True)
