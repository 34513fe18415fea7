"""Record batches rebuilt from cold rows, with the original offsets and timestamps, within a
fetch's byte budget."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bergstream.core.api import LOG_APPEND_TIME, BatchInfo, Record, build_batch, record_batch
from bergstream.plugins.ksi_fetch_filter.batch_encoder import encode_cold_batches
from bergstream.plugins.ksi_fetch_filter.coldset import ColdRead

_RECORD_OVERHEAD = 24  # varints and attributes of one record, roughly
_CHUNK = 512


@dataclass(frozen=True, slots=True)
class ColdBatches:
    """Encoded batches and the offset a consumer fetches next."""

    data: bytes
    next_offset: int
    records: int


def _estimate(record: Record) -> int:
    size = _RECORD_OVERHEAD + len(record.key or b"") + len(record.value or b"")
    for key, value in record.headers:
        size += 4 + len(key.encode()) + len(value or b"")
    return size


def _rows(read: ColdRead) -> Iterator[tuple[int, Record]]:
    segment = read.segment
    for start in range(read.start, read.stop, _CHUNK):
        yield from segment.records(start, min(start + _CHUNK, read.stop))


def claim_gap(batch: bytes, last_offset: int) -> bytes:
    """``batch`` with its last offset delta moved up to ``last_offset`` (as a compacted batch
    claims the offsets of records removed after its last one), CRC updated."""
    out = bytearray(batch)
    base_offset = record_batch.read_field(out, record_batch.BASE_OFFSET_OFFSET)
    record_batch.write_field(out, record_batch.LAST_OFFSET_DELTA_OFFSET, last_offset - base_offset)
    record_batch.write_crc(out)
    return bytes(out)


def _same_batch(first: tuple[int, Record], row: tuple[int, Record]) -> bool:
    if row[0] != first[0]:
        return False
    # With LogAppendTime a consumer gives every record the batch's max timestamp.
    return row[0] != LOG_APPEND_TIME or row[1].timestamp == first[1].timestamp


def build_cold_batches_reference(
    read: ColdRead, budget: int, batch_max_bytes: int, *, first_in_response: bool
) -> ColdBatches:
    """:func:`build_cold_batches` one :class:`Record` at a time through the reference builder
    (``build_batch``): what the compiled encoder is tested against, byte for byte."""
    out = bytearray()
    pending: list[tuple[int, Record]] = []
    pending_size = record_batch.HEADER_SIZE
    count = 0
    next_offset = int(read.segment.offsets[read.start])
    done = False

    def flush() -> bool:
        nonlocal pending, pending_size, count, next_offset
        if not pending:
            return True
        batch = build_batch(
            (record for _, record in pending),
            BatchInfo(base_offset=pending[0][1].offset, timestamp_type=pending[0][0]),
        )
        last = pending[-1][1].offset
        if read.tail is not None and last == read.segment.offsets[read.stop - 1]:
            batch = claim_gap(batch, read.tail)
            last = read.tail
        if out and len(out) + len(batch) > budget:
            return False
        if not out and len(batch) > budget and not first_in_response:
            return False
        out.extend(batch)
        count += len(pending)
        next_offset = last + 1
        pending = []
        pending_size = record_batch.HEADER_SIZE
        return True

    for row in _rows(read):
        size = _estimate(row[1])
        limit = min(batch_max_bytes, max(budget - len(out), 0))
        if pending and (not _same_batch(pending[0], row) or pending_size + size > limit):
            if not flush():
                done = True
                break
            if len(out) >= budget:
                done = True
                break
        if not pending and out and len(out) + record_batch.HEADER_SIZE + size > budget:
            done = True
            break
        pending.append(row)
        pending_size += size
    if not done:
        flush()
    return ColdBatches(bytes(out), next_offset, count)


def build_cold_batches(
    read: ColdRead, budget: int, batch_max_bytes: int, *, first_in_response: bool
) -> ColdBatches:
    """Encode rows of ``read`` as batches totalling at most ``budget`` bytes; with
    ``first_in_response`` the first batch is returned even when it alone is larger (KIP-74),
    so a consumer always progresses. When the rows end the partition's cold rows, the last
    batch claims the offsets up to the boundary. Written from the segment's Arrow columns by
    the compiled encoder (:mod:`.batch_encoder`), byte for byte as the reference builder."""
    encoded = encode_cold_batches(
        read, budget, batch_max_bytes, first_in_response=first_in_response
    )
    return ColdBatches(encoded.data, encoded.next_offset, encoded.records)
