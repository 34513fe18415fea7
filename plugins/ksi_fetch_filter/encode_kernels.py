"""Compiled loops (numba) that write cold rows as Kafka v2 record batches: the mirror of ISK's
batch decoder, from flat columns (offsets, timestamps, keys, values, headers) to batch bytes,
with no Python object per record.

:func:`encode_batches` decides the batch boundaries exactly as the reference builder of
:mod:`.batches` does (timestamp type, LogAppendTime timestamps, byte estimates, the byte budget,
KIP-74's first batch, the claimed gap of the last batch) and writes every batch, CRC field left
zero, into one preallocated buffer. The caller seals each batch with the hardware CRC-32C of the
``crc32c`` package (an order of magnitude faster than a table loop here).

The helpers are not inlined by numba (``inline="always"``) but left to LLVM: measured here,
numba inlining gained nothing; copying keys and values by slice (a memcpy) doubled the speed of
1 KB records over a byte loop. The numba on-disk cache is keyed on this file only; the v2
layout constants are frozen in.
"""

from __future__ import annotations

import numpy as np

from bergstream.core.api import (
    LOG_APPEND_TIME,
    cached_njit,
    copy_bytes,
    put_zigzag,
    record_batch,
    varint_size,
    zigzag,
)

ATTRIBUTES_OFFSET = record_batch.ATTRIBUTES_OFFSET
BASE_OFFSET_OFFSET = record_batch.BASE_OFFSET_OFFSET
BASE_SEQUENCE_OFFSET = record_batch.BASE_SEQUENCE_OFFSET
BASE_TIMESTAMP_OFFSET = record_batch.BASE_TIMESTAMP_OFFSET
HEADER_SIZE = record_batch.HEADER_SIZE
LAST_OFFSET_DELTA_OFFSET = record_batch.LAST_OFFSET_DELTA_OFFSET
LENGTH_OFFSET = record_batch.LENGTH_OFFSET
LOG_OVERHEAD = record_batch.LOG_OVERHEAD
MAGIC_OFFSET = record_batch.MAGIC_OFFSET
MAGIC_V2 = record_batch.MAGIC_V2
MAX_TIMESTAMP_OFFSET = record_batch.MAX_TIMESTAMP_OFFSET
PARTITION_LEADER_EPOCH_OFFSET = record_batch.PARTITION_LEADER_EPOCH_OFFSET
PRODUCER_EPOCH_OFFSET = record_batch.PRODUCER_EPOCH_OFFSET
PRODUCER_ID_OFFSET = record_batch.PRODUCER_ID_OFFSET
RECORDS_COUNT_OFFSET = record_batch.RECORDS_COUNT_OFFSET
TIMESTAMP_TYPE_MASK = record_batch.TIMESTAMP_TYPE_MASK
LOG_APPEND = LOG_APPEND_TIME
#: Kafka's "no timestamp", which aiokafka's builder also uses as "no base timestamp yet".
NO_TIMESTAMP = -1

__all__ = [
    "DONE",
    "MORE_ROWS",
    "NO_ROOM",
    "RESULT_FIELDS",
    "encode_batches",
]

#: :func:`encode_batches` wrote every batch the rows give within the budget.
DONE = 0
#: ``out`` is too small: ``result[REQUIRED]`` bytes are needed (nothing usable written).
NO_ROOM = 1
#: The rows ran out before the budget did and more rows follow them: call again with more.
MORE_ROWS = 2

#: What :func:`encode_batches` writes into ``result``, in order.
RESULT_FIELDS = ("size", "batches", "records", "next_offset", "required")
SIZE, BATCHES, RECORDS, NEXT_OFFSET, REQUIRED = range(len(RESULT_FIELDS))

#: A record's varints and attributes, roughly: the reference builder's per-record estimate.
RECORD_OVERHEAD = 24
#: Per header, in the estimate.
HEADER_OVERHEAD = 4


@cached_njit(nogil=True)
def _varint_size(value: int) -> int:
    """Bytes of the zigzag varint of ``value``."""
    return varint_size(zigzag(value))


@cached_njit(nogil=True)
def _put_varint(out: np.ndarray, at: int, value: int) -> int:
    """Write the zigzag varint of ``value`` at ``at``; the position after it."""
    return put_zigzag(out, at, value)


@cached_njit(nogil=True)
def _timestamps(timestamp: int, base: int, most: int) -> tuple[int, int, int]:
    """The batch's base and max timestamps after one more record, and that record's delta, as
    aiokafka's compiled builder (the reference) sets them: it takes a base timestamp of -1 for
    "none yet", so records at -1 before the first other timestamp get delta 0 and read back
    with that later timestamp (a fidelity bug kept on purpose: bytes equal the reference's)."""
    if base == NO_TIMESTAMP:
        return timestamp, timestamp, 0
    return base, max(most, timestamp), timestamp - base


@cached_njit(nogil=True)
def _put_int(out: np.ndarray, at: int, value: int, size: int) -> None:
    """Write the low ``size`` bytes of ``value`` big-endian at ``at``."""
    for i in range(size):
        out[at + size - 1 - i] = (value >> (8 * i)) & 0xFF


@cached_njit(nogil=True)
def _put_field(
    out: np.ndarray, at: int, data: np.ndarray, start: int, length: int, valid: bool
) -> int:
    """Write a length-prefixed field (``data[start : start + length]``; length -1 when not
    ``valid``) at ``at``; the position after it."""
    if not valid:
        out[at] = 1  # zigzag(-1)
        return at + 1
    at = _put_varint(out, at, length)
    copy_bytes(out, at, data, start, length)
    return at + length


@cached_njit(nogil=True)
def _field_size(length: int, valid: bool) -> int:
    """Bytes of a length-prefixed field of ``length`` bytes (null when not ``valid``)."""
    if not valid:
        return 1
    return _varint_size(length) + length


@cached_njit(nogil=True)
def _body_size(
    row: int, first: int, timestamp_delta: int, offsets: np.ndarray,
    key_offsets: np.ndarray, key_valid: np.ndarray,
    value_offsets: np.ndarray, value_valid: np.ndarray, header_rows: np.ndarray,
    header_key_offsets: np.ndarray, header_value_offsets: np.ndarray,
    header_value_valid: np.ndarray,
) -> int:  # fmt: skip
    """Bytes of row ``row``'s record after its length varint, in a batch starting at ``first``,
    its timestamp ``timestamp_delta`` after the base timestamp."""
    size = 1  # attributes
    size += _varint_size(timestamp_delta)
    size += _varint_size(offsets[row] - offsets[first])
    size += _field_size(key_offsets[row + 1] - key_offsets[row], key_valid[row] != 0)
    size += _field_size(value_offsets[row + 1] - value_offsets[row], value_valid[row] != 0)
    size += _varint_size(header_rows[row + 1] - header_rows[row])
    for h in range(header_rows[row], header_rows[row + 1]):
        size += _field_size(header_key_offsets[h + 1] - header_key_offsets[h], True)
        size += _field_size(
            header_value_offsets[h + 1] - header_value_offsets[h], header_value_valid[h] != 0
        )
    return size


@cached_njit(nogil=True)
def _estimate(
    row: int, key_offsets: np.ndarray, key_valid: np.ndarray, value_offsets: np.ndarray,
    value_valid: np.ndarray, header_rows: np.ndarray, header_key_offsets: np.ndarray,
    header_value_offsets: np.ndarray, header_value_valid: np.ndarray,
) -> int:  # fmt: skip
    """The reference builder's size estimate of row ``row`` (batch boundaries depend on it)."""
    size = RECORD_OVERHEAD
    if key_valid[row]:
        size += key_offsets[row + 1] - key_offsets[row]
    if value_valid[row]:
        size += value_offsets[row + 1] - value_offsets[row]
    for h in range(header_rows[row], header_rows[row + 1]):
        size += HEADER_OVERHEAD + header_key_offsets[h + 1] - header_key_offsets[h]
        if header_value_valid[h]:
            size += header_value_offsets[h + 1] - header_value_offsets[h]
    return size


@cached_njit(nogil=True)
def _write_batch(
    out: np.ndarray, at: int, first: int, end: int, last_offset_delta: int, bodies: np.ndarray,
    offsets: np.ndarray, timestamps: np.ndarray, timestamp_types: np.ndarray,
    key_offsets: np.ndarray, key_data: np.ndarray, key_valid: np.ndarray,
    value_offsets: np.ndarray, value_data: np.ndarray, value_valid: np.ndarray,
    header_rows: np.ndarray, header_key_offsets: np.ndarray, header_key_data: np.ndarray,
    header_value_offsets: np.ndarray, header_value_data: np.ndarray,
    header_value_valid: np.ndarray,
) -> int:  # fmt: skip
    """Write rows ``[first, end)`` as one batch at ``at`` (CRC field zero), ``bodies[row]``
    the size of row's record after its length varint; where it ends."""
    base_offset = offsets[first]
    base_timestamp = NO_TIMESTAMP
    max_timestamp = NO_TIMESTAMP
    pos = at + HEADER_SIZE
    for row in range(first, end):
        base_timestamp, max_timestamp, delta = _timestamps(
            timestamps[row], base_timestamp, max_timestamp
        )
        pos = _put_varint(out, pos, bodies[row])
        out[pos] = 0  # record attributes
        pos = _put_varint(out, pos + 1, delta)
        pos = _put_varint(out, pos, offsets[row] - base_offset)
        pos = _put_field(
            out, pos, key_data, key_offsets[row], key_offsets[row + 1] - key_offsets[row],
            key_valid[row] != 0,
        )  # fmt: skip
        pos = _put_field(
            out, pos, value_data, value_offsets[row], value_offsets[row + 1] - value_offsets[row],
            value_valid[row] != 0,
        )  # fmt: skip
        pos = _put_varint(out, pos, header_rows[row + 1] - header_rows[row])
        for h in range(header_rows[row], header_rows[row + 1]):
            pos = _put_field(
                out, pos, header_key_data, header_key_offsets[h],
                header_key_offsets[h + 1] - header_key_offsets[h], True,
            )  # fmt: skip
            pos = _put_field(
                out, pos, header_value_data, header_value_offsets[h],
                header_value_offsets[h + 1] - header_value_offsets[h], header_value_valid[h] != 0,
            )  # fmt: skip
    attributes = TIMESTAMP_TYPE_MASK if timestamp_types[first] != 0 else 0
    _put_int(out, at + BASE_OFFSET_OFFSET, base_offset, 8)
    _put_int(out, at + LENGTH_OFFSET, pos - at - LOG_OVERHEAD, 4)
    _put_int(out, at + PARTITION_LEADER_EPOCH_OFFSET, -1, 4)
    out[at + MAGIC_OFFSET] = MAGIC_V2
    _put_int(out, at + MAGIC_OFFSET + 1, 0, 4)  # the CRC, sealed by the caller
    _put_int(out, at + ATTRIBUTES_OFFSET, attributes, 2)
    _put_int(out, at + LAST_OFFSET_DELTA_OFFSET, last_offset_delta, 4)
    _put_int(out, at + BASE_TIMESTAMP_OFFSET, base_timestamp, 8)
    _put_int(out, at + MAX_TIMESTAMP_OFFSET, max_timestamp, 8)
    _put_int(out, at + PRODUCER_ID_OFFSET, -1, 8)
    _put_int(out, at + PRODUCER_EPOCH_OFFSET, -1, 2)
    _put_int(out, at + BASE_SEQUENCE_OFFSET, -1, 4)
    _put_int(out, at + RECORDS_COUNT_OFFSET, end - first, 4)
    return pos


@cached_njit(nogil=True)
def encode_batches(
    offsets: np.ndarray, timestamps: np.ndarray, timestamp_types: np.ndarray,
    key_offsets: np.ndarray, key_data: np.ndarray, key_valid: np.ndarray,
    value_offsets: np.ndarray, value_data: np.ndarray, value_valid: np.ndarray,
    header_rows: np.ndarray, header_key_offsets: np.ndarray, header_key_data: np.ndarray,
    header_value_offsets: np.ndarray, header_value_data: np.ndarray,
    header_value_valid: np.ndarray,
    more_rows: bool, last_offset: int, tail: int, budget: int, batch_max_bytes: int,
    first_in_response: bool, out: np.ndarray, batch_starts: np.ndarray, result: np.ndarray,
) -> int:  # fmt: skip
    """Encode the rows (int64 ``offsets``, ``timestamps`` in ms, ``timestamp_types``; binary
    columns as int64 offsets into uint8 data with a uint8 validity per item; ``header_rows``
    the range of each row's headers in the header columns, whose keys are never null) as
    batches totalling at most ``budget`` bytes into ``out``, recording where each batch starts
    in ``batch_starts`` (room for ``out.size // HEADER_SIZE`` batches).

    ``last_offset`` is the offset of the read's last row; ``tail`` (-1: none) the offset a
    batch ending with that row claims up to; ``more_rows`` whether rows follow these ones.
    Writes :data:`RESULT_FIELDS` into ``result``; returns :data:`DONE`, :data:`NO_ROOM` or
    :data:`MORE_ROWS`.
    """
    rows = offsets.shape[0]
    pos = 0
    batches = 0
    records = 0
    next_offset = offsets[0]
    first = 0  # first pending row
    pending = 0  # pending rows: first .. first + pending - 1
    pending_size = HEADER_SIZE
    row = 0
    bodies = np.empty(rows, np.int64)  # each record's size, from sizing its batch to writing it
    while True:
        at_end = row == rows
        size = 0
        flush = pending > 0 and at_end
        if not at_end:
            size = _estimate(
                row, key_offsets, key_valid, value_offsets, value_valid, header_rows,
                header_key_offsets, header_value_offsets, header_value_valid,
            )  # fmt: skip
            limit = min(batch_max_bytes, max(budget - pos, 0))
            if pending > 0:
                same = timestamp_types[row] == timestamp_types[first] and (
                    timestamp_types[row] != LOG_APPEND or timestamps[row] == timestamps[first]
                )
                flush = not same or pending_size + size > limit
        if at_end and more_rows:
            result[REQUIRED] = 0
            return MORE_ROWS
        if flush:
            end = first + pending
            batch = HEADER_SIZE
            base_timestamp = NO_TIMESTAMP
            max_timestamp = NO_TIMESTAMP
            for r in range(first, end):
                base_timestamp, max_timestamp, delta = _timestamps(
                    timestamps[r], base_timestamp, max_timestamp
                )
                body = _body_size(
                    r, first, delta, offsets, key_offsets, key_valid, value_offsets,
                    value_valid, header_rows, header_key_offsets, header_value_offsets,
                    header_value_valid,
                )  # fmt: skip
                bodies[r] = body
                batch += _varint_size(body) + body
            last = offsets[end - 1]
            if tail >= 0 and last == last_offset:
                last = tail
            if pos > 0 and pos + batch > budget:
                break
            if pos == 0 and batch > budget and not first_in_response:
                break
            if pos + batch > out.shape[0]:
                result[REQUIRED] = pos + batch
                return NO_ROOM
            written = _write_batch(
                out, pos, first, end, last - offsets[first], bodies, offsets, timestamps,
                timestamp_types, key_offsets, key_data, key_valid, value_offsets, value_data,
                value_valid, header_rows, header_key_offsets, header_key_data,
                header_value_offsets, header_value_data, header_value_valid,
            )  # fmt: skip
            batch_starts[batches] = pos
            batches += 1
            pos = written
            records += pending
            next_offset = last + 1
            pending = 0
            pending_size = HEADER_SIZE
            if at_end or pos >= budget:
                break
        if at_end:
            break
        if pending == 0 and pos > 0 and pos + HEADER_SIZE + size > budget:
            break
        if pending == 0:
            first = row
        pending += 1
        pending_size += size
        row += 1
    result[SIZE] = pos
    result[BATCHES] = batches
    result[RECORDS] = records
    result[NEXT_OFFSET] = next_offset
    result[REQUIRED] = pos
    return DONE
