"""Raw rows of many topics written as their tables' data files by Spark's Python workers, in
one job per micro-batch (the ``mapInArrow`` step of :mod:`~bergstream.pipeline.topic_group`).

The rows come one of two ways. Where librdkafka can read Kafka with the lake's client settings
(:func:`~bergstream.pipeline.stream.worker_fetch_settings`), each of as many tasks as Spark has
cores reads its share of the batch's offset ranges, topic after topic, itself
(:func:`write_fetched_group_files`); otherwise Spark's Kafka source hands its rows over, one
task per Kafka partition coalesced to one per core (:func:`write_group_files`). Measured on
50 topics of 20k records of 1 KB (two partitions each, local[2]): Spark's source read and handed
them over in 10.4 s, the workers read them in 4.5 s; Spark's source pays a Java consumer, its
connection and its first fetch for each Kafka partition, one after the other within a task.

Either way a topic's rows go, as the row contract's Arrow schema (field ids as Parquet
metadata), into that table's data location with
:class:`~bergstream.pipeline.typed_files.TaskFiles` (one file per Kafka partition and time
bucket, as the typed tables' workers write them). The driver gets back one row per file (topic,
path, partition values, size, rows) and commits each table's files in one append of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bergstream.pipeline.kafka_fetch import FetchSettings, OffsetRange, fetched_ranges
from bergstream.pipeline.typed_files import FileTarget, TaskFiles, WrittenFile

__all__ = [
    "GROUP_FILES_SCHEMA",
    "write_fetched_group_files",
    "write_group_files",
    "written_by_topic",
]

#: What a worker answers per file it wrote (Spark DDL of ``mapInArrow``'s output).
GROUP_FILES_SCHEMA = (
    "topic string, path string, kafka_partition int, time_bucket int, size long, records long"
)

_ANSWER = pa.schema(
    [
        ("topic", pa.string()),
        ("path", pa.string()),
        ("kafka_partition", pa.int32()),
        ("time_bucket", pa.int32()),
        ("size", pa.int64()),
        ("records", pa.int64()),
    ]
)


def write_group_files(
    targets: Mapping[str, FileTarget], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function over Spark's Kafka rows (bind ``targets``, each topic's
    table, with ``functools.partial``): write batches of raw rows with a ``topic`` column into
    their topic's table files; yields one row per file (:data:`GROUP_FILES_SCHEMA`). A task
    that fails deletes what it wrote."""
    yield _write_parts(targets, (part for batch in batches for part in _by_topic(batch)))


def write_fetched_group_files(
    targets: Mapping[str, FileTarget],
    settings: FetchSettings,
    tasks: tuple[tuple[OffsetRange, ...], ...],
    picks: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function over ``spark.range`` ids picking ``tasks`` (bind the first
    three with ``functools.partial``): read each picked task's offset ranges (each naming its
    topic) from Kafka with librdkafka (:func:`~bergstream.pipeline.kafka_fetch.fetched_ranges`)
    and write them into their topic's table files; yields one row per file. A task that fails
    deletes what it wrote."""
    parts = (
        (offsets.topic or settings.topic, pa.Table.from_batches([batch]))
        for offsets, batch in fetched_ranges(settings, tasks, picks)
    )
    yield _write_parts(targets, parts)


def _by_topic(batch: pa.RecordBatch) -> list[tuple[str, pa.Table]]:
    """``batch``'s rows by their ``topic`` column, in the order the topics come."""
    rows = pa.Table.from_batches([batch])
    if not rows.num_rows:
        return []
    topics = rows.column("topic")
    first = topics[0].as_py()
    if pc.all(pc.equal(topics, first)).as_py():
        return [(first, rows)]
    values = np.asarray(topics.to_pylist(), dtype=object)
    return [
        (topic, rows.take(np.flatnonzero(values == topic)))
        for topic in dict.fromkeys(values.tolist())
    ]


def _write_parts(
    targets: Mapping[str, FileTarget], parts: Iterable[tuple[str, pa.Table]]
) -> pa.RecordBatch:
    """Write each (topic, rows) into the topic's table files; one answer row per file."""
    files: dict[str, TaskFiles] = {}
    written: list[tuple[str, WrittenFile]] = []
    current: str | None = None
    try:
        for topic, part in parts:
            target = targets[topic]
            if topic != current and current is not None:
                # A task reads its Kafka partitions one after the other (several when the
                # batch is coalesced): done with one topic's once another's rows come.
                files[current].finish()
            current = topic
            if topic not in files:
                files[topic] = TaskFiles(target)
            files[topic].write(part.select(target.schema.names).cast(target.schema))
        for topic, task_files in files.items():
            written.extend((topic, w) for w in task_files.close())
    except BaseException:
        for task_files in files.values():
            task_files.abandon()
        raise
    return pa.RecordBatch.from_pydict(
        {
            "topic": [topic for topic, _ in written],
            "path": [w.path for _, w in written],
            "kafka_partition": [w.kafka_partition for _, w in written],
            "time_bucket": [w.time_bucket for _, w in written],
            "size": [w.size for _, w in written],
            "records": [w.records for _, w in written],
        },
        schema=_ANSWER,
    )


def written_by_topic(rows: list[object]) -> dict[str, list[WrittenFile]]:
    """The files of the workers' answer rows (Spark ``Row``\\ s of :data:`GROUP_FILES_SCHEMA`),
    by topic."""
    found: dict[str, list[WrittenFile]] = {}
    for row in rows:
        fields = row.asDict()  # type: ignore[attr-defined]
        found.setdefault(fields["topic"], []).append(
            WrittenFile(
                fields["path"],
                fields["kafka_partition"],
                fields["time_bucket"],
                fields["size"],
                fields["records"],
            )
        )
    return found
