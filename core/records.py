"""Kafka record batches (magic 2): parse, rebuild and transform, on aiokafka's C record codec.

Used by filters that change records in flight and by code that builds batches with original
offsets. A rebuilt batch keeps everything Kafka put in the original: base offset, partition leader
epoch, compression, timestamp type, transactional flag and producer state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from bergstream.core.kafka_wire.record_batch import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    CONTROL_FLAG_MASK,
    HEADER_SIZE,
    MAGIC_OFFSET,
    MAGIC_V2,
    PARTITION_LEADER_EPOCH_OFFSET,
    TIMESTAMP_TYPE_MASK,
    batch_end,
    read_field,
    write_crc,
    write_field,
)

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    """One record with its absolute offset and timestamp (ms)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """Batch-level fields a rebuilt batch must keep."""

    base_offset: int = 0
    partition_leader_epoch: int = -1
    compression_type: int = 0
    timestamp_type: int = 0
    is_transactional: bool = False
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1


class RecordBatchError(ValueError):
    """Bytes that are not a well-formed v2 record batch."""


def split_batches(data: bytes | memoryview) -> Iterator[memoryview]:
    """Yield each complete batch in a records blob; a trailing partial batch is ignored
    (brokers may cut a fetch response mid-batch)."""
    view = memoryview(data)
    pos = 0
    while (end := batch_end(view, pos)) is not None:
        yield view[pos:end]
        pos = end


def batch_info(batch: bytes | memoryview) -> BatchInfo:
    """Read the batch-level fields of one v2 batch."""
    parsed = _parse(batch)
    return BatchInfo(
        base_offset=parsed.base_offset,
        partition_leader_epoch=read_field(batch, PARTITION_LEADER_EPOCH_OFFSET),
        compression_type=parsed.compression_type,
        timestamp_type=parsed.timestamp_type,
        is_transactional=parsed.is_transactional,
        producer_id=parsed.producer_id,
        producer_epoch=parsed.producer_epoch,
        base_sequence=parsed.base_sequence,
    )


def is_control_batch(batch: bytes | memoryview) -> bool:
    """Whether ``batch`` is a control batch (transaction markers), which must pass unchanged."""
    return bool(read_field(batch, ATTRIBUTES_OFFSET) & CONTROL_FLAG_MASK)


def _parse(batch: bytes | memoryview) -> DefaultRecordBatch:
    if len(batch) < HEADER_SIZE or batch[MAGIC_OFFSET] != MAGIC_V2:
        raise RecordBatchError("not a v2 record batch (magic 2 needed, Kafka >= 0.11 clients)")
    return DefaultRecordBatch(bytes(batch))


def read_records(batch: bytes | memoryview) -> list[Record]:
    """Decode every record of one batch, with absolute offsets and timestamps."""
    parsed = _parse(batch)
    return [
        Record(
            offset=record.offset,
            timestamp=record.timestamp,
            key=record.key,
            value=record.value,
            headers=tuple(record.headers),
        )
        for record in parsed
    ]


def build_batch(records: Iterable[Record], info: BatchInfo) -> bytes:
    """Encode ``records`` as one batch with ``info``'s batch-level fields.

    Offsets are written relative to ``info.base_offset``; with LogAppendTime the broker's
    timestamp type bit is kept, so consumers see the original timestamps.
    """
    builder = DefaultRecordBatchBuilder(
        magic=MAGIC_V2,
        compression_type=info.compression_type,
        is_transactional=int(info.is_transactional),
        producer_id=info.producer_id,
        producer_epoch=info.producer_epoch,
        base_sequence=info.base_sequence,
        batch_size=2**31 - 1,
    )
    count = 0
    for record in records:
        builder.append(
            record.offset - info.base_offset,
            timestamp=record.timestamp,
            key=record.key,
            value=record.value,
            headers=list(record.headers),
        )
        count += 1
    if count == 0:
        raise RecordBatchError("a record batch needs at least one record")
    out = builder.build()
    write_field(out, BASE_OFFSET_OFFSET, info.base_offset)
    write_field(out, PARTITION_LEADER_EPOCH_OFFSET, info.partition_leader_epoch)
    if info.timestamp_type:
        attributes = read_field(out, ATTRIBUTES_OFFSET)
        write_field(out, ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
        write_crc(out)
    return bytes(out)


def map_records(data: bytes, transform: Callable[[Record], Record]) -> bytes:
    """Apply ``transform`` to every record of every data batch in a records blob.

    Control batches pass unchanged; each data batch is rebuilt with its own batch-level fields.
    """
    out = bytearray()
    for batch in split_batches(data):
        if is_control_batch(batch):
            out += batch
            continue
        info = batch_info(batch)
        out += build_batch((transform(r) for r in read_records(batch)), info)
    return bytes(out)


def with_header(record: Record, key: str, value: bytes | None) -> Record:
    """``record`` with one more header appended (existing headers and their order kept)."""
    return replace(record, headers=(*record.headers, (key, value)))
