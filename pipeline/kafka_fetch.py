"""A typed micro-batch's records read from Kafka by Spark's Python workers themselves.

Spark's Kafka source hands a ``mapInArrow`` function its rows only after turning every record
into a Spark row and then into Arrow for the Python worker: for 300k values of 550 B that
transfer cost more CPU than the Python decode and Parquet write together (measured: the JVM read
plus Arrow hand-over 3.6 s, 4.8 CPU s; librdkafka in the workers 2.0 s, 3.9 CPU s). So for a
typed batch the driver plans offset ranges (from the table's boundary to the micro-batch's end
in Spark's offset log) and each worker reads its ranges with confluent-kafka (librdkafka) into
row-contract Arrow batches, the very columns Spark's source would have given: read-committed
(aborted records and transaction markers skipped), the record's partition, offset, timestamp
and its type (0 create time, 1 log-append time, Kafka's ids), key, headers (an empty list when
there are none) and value.

Offsets Kafka deleted before a worker got to them (retention) fail the task with
:class:`KafkaFetchError` when ``fail_on_data_loss`` is set, as Spark's source does; otherwise
the range goes on from the log start.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

__all__ = [
    "FETCHED_SCHEMA",
    "FetchSettings",
    "KafkaFetchError",
    "OffsetRange",
    "fetch_range",
    "fetched_batches",
    "fetched_ranges",
    "plan_tasks",
    "split_ranges",
]

#: The row contract's source columns, typed as Spark's ``mapInArrow`` gives them.
FETCHED_SCHEMA = pa.schema(
    [
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        ("kafka_timestamp_type", pa.int32()),
        ("kafka_key", pa.binary()),
        (
            "kafka_headers",
            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
        ),
        ("kafka_value", pa.binary()),
    ]
)
#: Records per Arrow batch handed on (Spark's own ``arrow.maxRecordsPerBatch`` default).
BATCH_RECORDS = 10_000
#: Ranges shorter than this are not split further to keep every core busy.
MIN_SPLIT_OFFSETS = 50_000
#: librdkafka's offset meaning "the partition's log start".
_OFFSET_BEGINNING = -2
#: librdkafka's timestamp types (``TIMESTAMP_CREATE_TIME``, ``TIMESTAMP_LOG_APPEND_TIME``)
#: as Kafka's ``TimestampType`` ids, which Spark's source reports.
_TIMESTAMP_TYPES = {1: 0, 2: 1}
_NO_TIMESTAMP_TYPE = -1
_POLL_SECONDS = 1.0


class KafkaFetchError(RuntimeError):
    """A worker could not read the offsets its range names."""


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``start`` (inclusive; -2: the log start) to ``until`` (exclusive) of one
    partition (of ``topic`` when a task reads several topics; else the settings' topic)."""

    partition: int
    start: int
    until: int
    topic: str | None = None


@dataclass(frozen=True)
class FetchSettings:
    """How workers read a topic (picklable): librdkafka client settings, the topic, whether
    deleted offsets fail the task, and how long a read may go without a record."""

    client: Mapping[str, str] = field(repr=False)  # may hold credentials
    topic: str
    fail_on_data_loss: bool = True
    timeout_seconds: float = 120.0

    def consumer_config(self) -> dict[str, object]:
        """The consumer's settings: ``client`` plus what a bounded read-committed read
        needs (no group membership, no committed offsets, errors on deleted offsets)."""
        return {
            # A typed batch is mostly read in bulk: fetch big (librdkafka's 1 MiB per
            # partition took 11 µs a record), unless the client settings say otherwise.
            "fetch.max.bytes": 64 << 20,
            "max.partition.fetch.bytes": 16 << 20,
            **self.client,
            "group.id": f"bergstream-pipeline-fetch-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
        }


def _size(offsets: OffsetRange) -> int:
    return offsets.until - max(offsets.start, 0)


def _order(offsets: OffsetRange) -> tuple[str, int, int]:
    """A task reads its ranges topic by topic, each partition's in offset order."""
    return offsets.topic or "", offsets.partition, offsets.start


def split_ranges(ranges: list[OffsetRange], tasks: int) -> list[OffsetRange]:
    """``ranges`` (empty ones dropped) cut into pieces, the largest first, until there are at
    least ``tasks`` of them or no piece has :data:`MIN_SPLIT_OFFSETS` offsets to spare: a topic
    with fewer partitions than Spark has cores still keeps every core busy."""
    pieces = [r for r in ranges if _size(r) > 0]
    while len(pieces) < tasks:
        wide = 2 * MIN_SPLIT_OFFSETS
        splittable = [r for r in pieces if r.start >= 0 and _size(r) >= wide]
        if not splittable:
            break
        widest = max(splittable, key=_size)
        middle = widest.start + _size(widest) // 2
        pieces.remove(widest)
        pieces += [replace(widest, until=middle), replace(widest, start=middle)]
    return sorted(pieces, key=_order)


def plan_tasks(ranges: list[OffsetRange], tasks: int) -> tuple[tuple[OffsetRange, ...], ...]:
    """``ranges`` split (:func:`split_ranges`) and dealt into at most ``tasks`` tasks of about
    the same number of offsets, each task's ranges in topic, partition and offset order. Each Spark
    task of ``mapInArrow`` costs about 0.3 s of a core before its function runs (measured), so
    a batch runs as many tasks as Spark has cores, not one per partition."""
    pieces = split_ranges(ranges, tasks)
    bins: list[list[OffsetRange]] = [[] for _ in range(min(max(tasks, 1), len(pieces)))]
    loads = [0] * len(bins)
    for piece in sorted(pieces, key=_size, reverse=True):
        lightest = loads.index(min(loads))
        bins[lightest].append(piece)
        loads[lightest] += _size(piece)
    return tuple(tuple(sorted(found, key=_order)) for found in bins if found)


class _Columns:
    """Record fields gathered into Arrow arrays, :data:`BATCH_RECORDS` at a time."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.clear()

    def clear(self) -> None:
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.types: list[int] = []
        self.keys: list[bytes | None] = []
        self.headers: list[list[tuple[str, bytes | None]]] = []
        self.values: list[bytes | None] = []

    def extend(self, messages: list[Any]) -> None:
        """Add ``messages`` (confluent-kafka's, records only), one column at a time: a
        comprehension per field costs less than a call per record."""
        stamps = [m.timestamp() for m in messages]
        self.offsets += [m.offset() for m in messages]
        self.timestamps += [millis * 1000 for _, millis in stamps]
        self.types += [_TIMESTAMP_TYPES.get(kind, _NO_TIMESTAMP_TYPE) for kind, _ in stamps]
        self.keys += [m.key() for m in messages]
        self.headers += [m.headers() or [] for m in messages]  # (key, value) tuples
        self.values += [m.value() for m in messages]

    def batch(self) -> pa.RecordBatch:
        count = len(self.offsets)
        columns = [
            pa.array([self.partition] * count, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps, pa.int64()).cast(FETCHED_SCHEMA.field(2).type),
            pa.array(self.types, pa.int32()),
            pa.array(self.keys, pa.binary()),
            pa.array(self.headers, FETCHED_SCHEMA.field(5).type),
            pa.array(self.values, pa.binary()),
        ]
        self.clear()
        return pa.RecordBatch.from_arrays(columns, schema=FETCHED_SCHEMA)


def fetch_range(settings: FetchSettings, offsets: OffsetRange) -> Iterator[pa.RecordBatch]:
    """The committed records of ``offsets`` (of its topic, else ``settings``') as row-contract
    batches, in offset order. Raises
    :class:`KafkaFetchError` when Kafka cannot be read for ``settings.timeout_seconds`` or
    deleted offsets of the range (with ``fail_on_data_loss``)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    if offsets.start >= 0 and offsets.until <= offsets.start:
        return
    topic = offsets.topic or settings.topic
    consumer = Consumer(settings.consumer_config())
    where = f"partition {offsets.partition} of topic '{topic}'"
    try:
        start = offsets.start
        if start < 0:
            # librdkafka's own lookup of the log start took 0.5 s before the first record
            # (measured); asking for the watermarks took 10 ms.
            start, _ = consumer.get_watermark_offsets(
                TopicPartition(topic, offsets.partition), settings.timeout_seconds
            )
            if start >= offsets.until:
                return
        consumer.assign([TopicPartition(topic, offsets.partition, start)])
        columns = _Columns(offsets.partition)
        idle, done, next_offset = 0.0, False, start
        while not done:
            # Never ask for more records than the range has left: librdkafka waits for the
            # count asked (or the poll's end) before it answers.
            wanted = min(BATCH_RECORDS, offsets.until - next_offset)
            messages = consumer.consume(max(1, wanted), _POLL_SECONDS)
            records = []
            for message in messages:
                error = message.error()
                if error is None:
                    offset = message.offset()
                    if offset >= offsets.until:
                        done = True
                        break
                    records.append(message)
                    next_offset = offset + 1
                    if next_offset == offsets.until:
                        done = True
                        break
                elif error.code() == KafkaError._PARTITION_EOF:
                    # The read-committed end of the log. The range's end was planned at or
                    # below it, so what is left of the range is transaction markers or
                    # aborted records; an end below the range's (a lagging leader) waits.
                    if message.offset() >= offsets.until:
                        done = True
                        break
                elif error.code() == KafkaError._AUTO_OFFSET_RESET:
                    if settings.fail_on_data_loss:
                        raise KafkaFetchError(
                            f"Kafka deleted offsets of {where} (retention) from "
                            f"{offsets.start} on before the pipeline copied them; set "
                            "lake.pipeline.fail_on_data_loss: false to go on from the log start"
                        )
                    consumer.assign([TopicPartition(topic, offsets.partition, _OFFSET_BEGINNING)])
                elif error.fatal() or not error.retriable():
                    raise KafkaFetchError(f"reading {where} failed: {error.str()}")
            columns.extend(records)
            idle = 0.0 if messages else idle + _POLL_SECONDS
            if not done and idle >= settings.timeout_seconds:
                raise KafkaFetchError(
                    f"offsets {offsets.start}..{offsets.until - 1} of {where}: nothing arrived "
                    f"for {idle:.0f} s; is Kafka reachable with the pipeline's client settings?"
                )
            if len(columns.offsets) >= BATCH_RECORDS or (done and columns.offsets):
                yield columns.batch()
    except KafkaException as error:
        raise KafkaFetchError(f"reading {where} failed: {error}") from None
    finally:
        consumer.close()


def fetched_batches(
    settings: FetchSettings,
    tasks: tuple[tuple[OffsetRange, ...], ...],
    picks: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The records of the ``tasks`` that ``picks`` name (batches of ``id`` rows indexing
    ``tasks``, as a ``mapInArrow`` function over ``spark.range`` gets them), one range after
    the other."""
    for _, batch in fetched_ranges(settings, tasks, picks):
        yield batch


def fetched_ranges(
    settings: FetchSettings,
    tasks: tuple[tuple[OffsetRange, ...], ...],
    picks: Iterator[pa.RecordBatch],
) -> Iterator[tuple[OffsetRange, pa.RecordBatch]]:
    """:func:`fetched_batches`, each batch with the range it comes from (a task of several
    topics tells them apart by the range's topic)."""
    for batch in picks:
        for index in batch.column("id").to_pylist():
            for offsets in tasks[index]:
                for records in fetch_range(settings, offsets):
                    yield offsets, records
