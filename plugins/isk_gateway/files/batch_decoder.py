"""Kafka record batches -> Arrow rows of the row contract, decoded by compiled loops
(:mod:`.batch_kernels`) straight into Arrow buffers: no Python object per record or per batch.

Semantics are the ones of a ``read_committed`` Java consumer given the fetch's aborted
transactions: control batches are skipped, and data batches of aborted transactions are dropped.
Offsets outside ``[start_offset, end_offset)`` are dropped too (a fetch may begin before the asked
offset). With LogAppendTime every record of a batch carries the batch's max timestamp (type 1).
A batch whose CRC does not match, or that is not magic v2, raises :class:`SynthesisError`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.codec import gzip_decode, lz4_decode, snappy_decode, zstd_decode

from bergstream.core.api import LOG_APPEND_TIME, ROW_ARROW_SCHEMA, crc32c, record_batch
from bergstream.plugins.isk_gateway.files.batch_kernels import (
    ATTRIBUTES,
    BASE_OFFSET,
    BASE_TIMESTAMP,
    END,
    ERRORS,
    LAST_OFFSET_DELTA,
    MAGIC,
    MAX_TIMESTAMP,
    POSITION,
    PRODUCER_ID,
    RECORD_COUNT,
    STORED_CRC,
    decode_records,
    scan_batches,
)
from bergstream.plugins.isk_gateway.kafka.buffers import BufferLease, pooled_array

__all__ = [
    "AbortedTransaction",
    "SynthesisError",
    "batch_bounds",
    "decode_batches",
    "warm_up",
]

#: (producer_id, first_offset), as a Fetch response's ``aborted_transactions`` lists them.
AbortedTransaction = tuple[int, int]

_NO_END = np.iinfo(np.int64).max
_DECOMPRESS = {
    record_batch.CompressionType.GZIP: gzip_decode,
    record_batch.CompressionType.SNAPPY: snappy_decode,
    record_batch.CompressionType.LZ4: lz4_decode,
    record_batch.CompressionType.ZSTD: zstd_decode,
}
_HEADERS_TYPE: pa.DataType = ROW_ARROW_SCHEMA.field("kafka_headers").type
_HEADER_STRUCT: pa.StructType = _HEADERS_TYPE.value_type
_TIMESTAMP_TYPE: pa.DataType = ROW_ARROW_SCHEMA.field("kafka_timestamp").type


class SynthesisError(ValueError):
    """Record bytes or a request that cannot be synthesized into a data file."""


def _as_array(records: bytes | bytearray | memoryview) -> np.ndarray:
    return np.frombuffer(records, dtype=np.uint8)


def _scan(buf: np.ndarray) -> np.ndarray:
    batches = scan_batches(buf)
    if batches.shape[0]:
        if batches[-1, MAGIC] != record_batch.MAGIC_V2:
            raise SynthesisError("not a v2 record batch (magic 2 needed, Kafka >= 0.11 clients)")
        view = memoryview(buf)
        computed = np.fromiter(
            (
                crc32c(view[position + record_batch.CRC_START : end])
                for position, end in zip(
                    batches[:, POSITION].tolist(), batches[:, END].tolist(), strict=True
                )
            ),
            dtype=np.int64,
            count=batches.shape[0],
        )
        bad = np.flatnonzero(computed != batches[:, STORED_CRC])
        if bad.size:
            raise SynthesisError(
                f"record batch at offset {int(batches[bad[0], BASE_OFFSET])} fails its CRC"
            )
    return batches


def batch_bounds(
    records: bytes | bytearray | memoryview,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Base offsets, next offsets (last offset + 1) and end positions (bytes) of the complete
    v2 batches at the start of ``records``, without decoding their records or checking CRCs."""
    batches = scan_batches(_as_array(records))
    if batches.shape[0] and batches[-1, MAGIC] != record_batch.MAGIC_V2:
        batches = batches[:-1]
    base = batches[:, BASE_OFFSET]
    return base, base + batches[:, LAST_OFFSET_DELTA] + 1, batches[:, END]


def _is_abort_marker(buf: np.ndarray, batch: np.ndarray) -> bool:
    """Whether a control batch is an ABORT marker (its first record's key type is 0)."""
    data = bytes(buf[batch[POSITION] + record_batch.HEADER_SIZE : batch[END]])
    codec = int(batch[ATTRIBUTES]) & record_batch.COMPRESSION_CODEC_MASK
    if codec:
        data = _decompressed(data, codec, int(batch[BASE_OFFSET]))
    segments = np.array([[0, 0, len(data), 1, 0, 0, 0, 0, 0]], dtype=np.int64)
    key = _decode(_as_array(data), _as_array(b""), segments, 0, _NO_END).column("kafka_key")
    return (
        record_batch.control_record_type(key[0].as_py() if len(key) else None)
        == record_batch.ControlRecordType.ABORT
    )


def _kept_batches(
    buf: np.ndarray,
    batches: np.ndarray,
    start_offset: int,
    end_offset: int,
    aborted_transactions: Iterable[AbortedTransaction] | None,
) -> np.ndarray:
    """The data batches a read_committed consumer returns that overlap the range."""
    attributes = batches[:, ATTRIBUTES]
    last_offsets = batches[:, BASE_OFFSET] + batches[:, LAST_OFFSET_DELTA]
    control = (attributes & record_batch.CONTROL_FLAG_MASK) != 0
    keep = ~control & (last_offsets >= start_offset) & (batches[:, BASE_OFFSET] < end_offset)
    aborted = sorted((first, producer) for producer, first in aborted_transactions or ())
    if not aborted:
        return batches[keep]
    # Only a fetch listing aborted transactions needs the consumer's walk, batch by batch.
    heapq.heapify(aborted)
    aborted_producers: set[int] = set()
    for index in range(batches.shape[0]):
        producer = int(batches[index, PRODUCER_ID])
        if producer < 0:
            continue
        while aborted and aborted[0][0] <= last_offsets[index]:
            aborted_producers.add(heapq.heappop(aborted)[1])
        if control[index]:
            if _is_abort_marker(buf, batches[index]):
                aborted_producers.discard(producer)
        elif (
            attributes[index] & record_batch.TRANSACTIONAL_FLAG_MASK
            and producer in aborted_producers
        ):
            keep[index] = False
    return batches[keep]


def _decompressed(data: bytes, codec: int, base_offset: int) -> bytes:
    decompress = _DECOMPRESS.get(codec)
    if decompress is None:
        raise SynthesisError(f"record batch at offset {base_offset} has unknown codec {codec}")
    try:
        return bytes(decompress(data))
    except Exception as error:  # each codec library raises its own errors
        raise SynthesisError(
            f"record batch at offset {base_offset} does not decompress "
            f"({record_batch.CompressionType(codec).name.lower()}): {error}"
        ) from error


def _segments(buf: np.ndarray, batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows for :func:`decode_records` and the buffer of decompressed batch bodies."""
    count = batches.shape[0]
    segments = np.empty((count, 9), dtype=np.int64)
    attributes = batches[:, ATTRIBUTES]
    log_append = (attributes & record_batch.TIMESTAMP_TYPE_MASK) != 0
    segments[:, 0] = 0
    segments[:, 1] = batches[:, POSITION] + record_batch.HEADER_SIZE
    segments[:, 2] = batches[:, END]
    segments[:, 3] = batches[:, RECORD_COUNT]
    segments[:, 4] = batches[:, BASE_OFFSET]
    segments[:, 5] = batches[:, BASE_TIMESTAMP]
    segments[:, 6] = batches[:, MAX_TIMESTAMP]
    segments[:, 7] = log_append
    segments[:, 8] = np.where(log_append, LOG_APPEND_TIME, 0)
    compressed = np.flatnonzero(attributes & record_batch.COMPRESSION_CODEC_MASK)
    if not compressed.size:
        return segments, _as_array(b"")
    bodies: list[bytes] = []
    position = 0
    for index in compressed:
        batch = batches[index]
        body = _decompressed(
            buf[batch[POSITION] + record_batch.HEADER_SIZE : batch[END]].tobytes(),
            int(batch[ATTRIBUTES]) & record_batch.COMPRESSION_CODEC_MASK,
            int(batch[BASE_OFFSET]),
        )
        bodies.append(body)
        segments[index, 0:3] = (1, position, position + len(body))
        position += len(body)
    return segments, _as_array(b"".join(bodies))


def _bitmap(valid: np.ndarray) -> tuple[pa.Buffer | None, int]:
    nulls = int(valid.size - np.count_nonzero(valid))
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(valid.astype(bool), bitorder="little")), nulls


def _binary(
    data_type: pa.DataType, offsets: np.ndarray, data: np.ndarray, valid: np.ndarray
) -> pa.Array:
    bitmap, nulls = _bitmap(valid)
    buffers = [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(data_type, offsets.size - 1, buffers, null_count=nulls)


def _decode(
    plain: np.ndarray,
    decompressed: np.ndarray,
    segments: np.ndarray,
    start_offset: int,
    end_offset: int,
    partition: int = 0,
    lease: BufferLease | None = None,
) -> pa.Table:
    totals = np.zeros(6, dtype=np.int64)
    empty8, empty64, empty32 = (np.empty(0, dtype) for dtype in (np.uint8, np.int64, np.int32))
    status = decode_records(
        plain, decompressed, segments, start_offset, end_offset, False, totals,
        empty64, empty64, empty32, empty64, empty8, empty8, empty64, empty8, empty8,
        empty64, empty64, empty8, empty8, empty64, empty8, empty8,
    )  # fmt: skip
    if status < 0:
        raise SynthesisError(f"malformed record batch: {ERRORS[status]}")
    rows, key_bytes, value_bytes, headers, header_key_bytes, header_value_bytes = map(int, totals)
    offsets = pooled_array(rows, np.int64)
    timestamps = pooled_array(rows, np.int64)
    timestamp_types = pooled_array(rows, np.int32)
    key_offsets, value_offsets = pooled_array(rows + 1, np.int64), pooled_array(rows + 1, np.int64)
    take = pooled_array if lease is None else lease.take
    key_data, value_data = take(key_bytes), take(value_bytes)
    key_valid, value_valid = pooled_array(rows, np.uint8), pooled_array(rows, np.uint8)
    header_list_offsets = pooled_array(rows + 1, np.int64)
    header_key_offsets = pooled_array(headers + 1, np.int64)
    header_value_offsets = pooled_array(headers + 1, np.int64)
    header_key_data = pooled_array(header_key_bytes, np.uint8)
    header_key_valid = pooled_array(headers, np.uint8)
    header_value_data = pooled_array(header_value_bytes, np.uint8)
    header_value_valid = pooled_array(headers, np.uint8)
    decode_records(
        plain, decompressed, segments, start_offset, end_offset, True, totals,
        offsets, timestamps, timestamp_types, key_offsets, key_data, key_valid,
        value_offsets, value_data, value_valid, header_list_offsets, header_key_offsets,
        header_key_data, header_key_valid, header_value_offsets, header_value_data,
        header_value_valid,
    )  # fmt: skip
    header_keys = _binary(pa.large_string(), header_key_offsets, header_key_data, header_key_valid)
    if headers:
        try:
            header_keys.validate(full=True)
        except pa.ArrowInvalid as error:
            raise SynthesisError(f"a record header key is not UTF-8: {error}") from None
    header_values = _binary(
        pa.large_binary(), header_value_offsets, header_value_data, header_value_valid
    )
    header_structs = pa.StructArray.from_arrays(
        [header_keys, header_values], fields=list(_HEADER_STRUCT)
    )
    try:
        micros = pc.multiply_checked(pa.array(timestamps), 1000)
    except pa.ArrowInvalid as error:
        raise SynthesisError(f"a record timestamp is out of range: {error}") from None
    return pa.Table.from_arrays(
        [
            pa.repeat(pa.scalar(partition, pa.int32()), rows),
            pa.array(offsets),
            micros.cast(_TIMESTAMP_TYPE),
            pa.array(timestamp_types),
            _binary(pa.large_binary(), key_offsets, key_data, key_valid),
            pa.LargeListArray.from_arrays(
                pa.array(header_list_offsets), header_structs, type=_HEADERS_TYPE
            ),
            _binary(pa.large_binary(), value_offsets, value_data, value_valid),
        ],
        schema=ROW_ARROW_SCHEMA,
    )


def decode_batches(
    records: bytes | bytearray | memoryview,
    partition: int,
    start_offset: int = 0,
    end_offset: int | None = None,
    aborted_transactions: Iterable[AbortedTransaction] | None = None,
    lease: BufferLease | None = None,
) -> pa.Table:
    """Decode a partition's record batches into an Arrow table in ``ROW_ARROW_SCHEMA``.

    Keeps records with ``start_offset <= offset < end_offset`` (``end_offset`` None: no upper
    bound; pass the last stable offset for read_committed). ``aborted_transactions`` is the
    fetch's list of ``(producer_id, first_offset)``: their data batches are dropped as a
    read_committed consumer drops them. Control batches never yield rows. A trailing partial
    batch is ignored. Raises :class:`SynthesisError` on a batch that is not magic v2, whose CRC
    does not match, that does not decompress or whose records are malformed.

    With a ``lease``, the key and value bytes are written into buffers taken from it (reused
    between chunks): the caller releases it once nothing refers to the table.
    """
    buf = _as_array(records)
    end = _NO_END if end_offset is None else end_offset
    batches = _scan(buf)
    kept = _kept_batches(buf, batches, start_offset, end, aborted_transactions)
    segments, decompressed = _segments(buf, kept)
    return _decode(buf, decompressed, segments, start_offset, end, partition, lease)


def warm_up() -> None:
    """Compile the kernels (or load them from numba's on-disk cache) now, so the first query
    does not wait for it: a few seconds on a fresh install, a fraction of one after."""
    # One batch of one record: a header of zeros but for length, magic and count, then the
    # record (length 6, attributes, timestamp delta, offset delta, null key, empty value, no
    # headers).
    record = bytes([12, 0, 0, 0, 1, 0, 0])
    blob = bytearray(record_batch.HEADER_SIZE) + record
    record_batch.write_field(
        blob, record_batch.LENGTH_OFFSET, len(blob) - record_batch.LOG_OVERHEAD
    )
    record_batch.write_field(blob, record_batch.MAGIC_OFFSET, record_batch.MAGIC_V2)
    record_batch.write_field(blob, record_batch.RECORDS_COUNT_OFFSET, 1)
    record_batch.write_crc(blob)
    decode_batches(bytes(blob), 0)
