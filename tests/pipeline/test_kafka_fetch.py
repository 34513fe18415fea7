"""Workers reading a typed batch's offsets themselves (``kafka_fetch``) give exactly the rows
Spark's Kafka source gives for the same offsets: keys, headers, timestamps and their types,
read-committed over aborted and committed transactions, ranges that end on a marker; and
deleted offsets fail or are skipped as ``fail_on_data_loss`` says."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from bergstream.pipeline.batch_rows import BatchRows, batch_ranges
from bergstream.pipeline.kafka_fetch import (
    FETCHED_SCHEMA,
    MIN_SPLIT_OFFSETS,
    FetchSettings,
    KafkaFetchError,
    OffsetRange,
    fetch_range,
    plan_tasks,
    split_ranges,
)
from bergstream.pipeline.stream import kafka_rows
from tests.kits.lake import Produced, produce, produce_transactions

pytestmark = pytest.mark.slow

_COLUMNS = FETCHED_SCHEMA.names


def _records(partition: int, count: int, tag: str) -> list[Produced]:
    return [
        Produced(
            partition,
            None if i % 5 == 0 else (b"" if i % 7 == 0 else f"{tag}-{i}".encode()),
            None if i % 11 == 0 else f"{tag} value {i}".encode() * (i % 4),
            ((("h", b"1"), ("h", None), ("e", b"")) if i % 3 == 0 else ()),
            1_700_000_000_000 + i if i % 2 == 0 else None,
        )
        for i in range(count)
    ]


def _spark_rows(spark: Any, bootstrap: str, topic: str, offsets: OffsetRange) -> list[dict]:
    """Spark's Kafka source's rows of ``offsets``, as the pipeline selects them."""
    import json

    source = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("assign", json.dumps({topic: [offsets.partition]}))
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        .option("startingOffsets", json.dumps({topic: {str(offsets.partition): offsets.start}}))
        .option("endingOffsets", json.dumps({topic: {str(offsets.partition): offsets.until}}))
        .load()
    )
    frame = kafka_rows(source)
    return frame.toArrow().cast(FETCHED_SCHEMA).to_pylist()


def _fetched(settings: FetchSettings, offsets: OffsetRange) -> list[dict]:
    batches = list(fetch_range(settings, offsets))
    for batch in batches:
        assert batch.schema == FETCHED_SCHEMA
    return pa.Table.from_batches(batches, FETCHED_SCHEMA).to_pylist()


def _end(bootstrap: str, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
        return int(high)
    finally:
        consumer.close()


def test_fetched_rows_equal_sparks_over_transactions_and_ranges_that_end_on_markers(
    spark: Any, kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(partitions=2)
    produce(kafka_bootstrap, topic, _records(0, 40, "plain") + _records(1, 25, "plain"))
    produce_transactions(
        kafka_bootstrap,
        topic,
        [
            ("abort", _records(0, 30, "a1")),
            ("commit", _records(0, 20, "c1") + _records(1, 5, "c1")),
            ("abort", _records(0, 10, "a2")),
            ("commit", _records(0, 15, "c2")),
        ],
    )
    settings = FetchSettings({"bootstrap.servers": kafka_bootstrap}, topic)
    ends = {p: _end(kafka_bootstrap, topic, p) for p in (0, 1)}
    # Whole partitions (log start to the end, a commit marker last), and ranges that begin
    # and end in the middle of aborted records and on markers.
    ranges = [
        OffsetRange(0, 0, ends[0]),
        OffsetRange(1, 0, ends[1]),
        OffsetRange(0, 35, 75),
        OffsetRange(0, 70, 71),
        OffsetRange(0, 41, ends[0] - 1),
    ]
    for offsets in ranges:
        expected = _spark_rows(spark, kafka_bootstrap, topic, offsets)
        assert _fetched(settings, offsets) == expected, offsets
    whole = _fetched(settings, OffsetRange(0, -2, ends[0]))
    assert len(whole) == 40 + 20 + 15  # the aborted 40 left out
    assert whole == _spark_rows(spark, kafka_bootstrap, topic, OffsetRange(0, 0, ends[0]))
    assert {row["kafka_timestamp_type"] for row in whole} == {0}
    assert [h["value"] for h in whole[0]["kafka_headers"]] == [b"1", None, b""]


def test_log_append_time_and_empty_ranges(
    spark: Any, kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(partitions=1, **{"message.timestamp.type": "LogAppendTime"})
    produce(kafka_bootstrap, topic, _records(0, 12, "l"))
    settings = FetchSettings({"bootstrap.servers": kafka_bootstrap}, topic)
    rows = _fetched(settings, OffsetRange(0, 0, 12))
    assert rows == _spark_rows(spark, kafka_bootstrap, topic, OffsetRange(0, 0, 12))
    assert {row["kafka_timestamp_type"] for row in rows} == {1}
    assert _fetched(settings, OffsetRange(0, 5, 5)) == []


def test_deleted_offsets_fail_or_are_skipped(
    kafka_bootstrap: str, create_topic: Callable[..., str], admin: Any
) -> None:
    from confluent_kafka import TopicPartition

    topic = create_topic(partitions=1)
    produce(kafka_bootstrap, topic, _records(0, 30, "d"))
    deleted = admin.delete_records([TopicPartition(topic, 0, 20)])
    for future in deleted.values():
        future.result(timeout=30)
    strict = FetchSettings({"bootstrap.servers": kafka_bootstrap}, topic, fail_on_data_loss=True)
    with pytest.raises(KafkaFetchError, match="fail_on_data_loss: false"):
        _fetched(strict, OffsetRange(0, 10, 30))
    lenient = FetchSettings({"bootstrap.servers": kafka_bootstrap}, topic, fail_on_data_loss=False)
    assert [r["kafka_offset"] for r in _fetched(lenient, OffsetRange(0, 10, 30))] == list(
        range(20, 30)
    )


def test_an_unreachable_kafka_fails_the_range_with_the_cause() -> None:
    settings = FetchSettings({"bootstrap.servers": "127.0.0.1:1"}, "nowhere", timeout_seconds=2.0)
    with pytest.raises(KafkaFetchError, match="nothing arrived for 2 s"):
        _fetched(settings, OffsetRange(0, 0, 10))


def test_workers_read_the_ranges_of_a_batch_through_spark(
    spark: Any, kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(partitions=3)
    produce(kafka_bootstrap, topic, [r for p in range(3) for r in _records(p, 20, f"w{p}")])
    frame = spark.createDataFrame([], "x int")
    rows = BatchRows(
        frame,
        FetchSettings({"bootstrap.servers": kafka_bootstrap}, topic),
        tuple(batch_ranges({0: 5, 1: 20}, {0: 20, 1: 20, 2: 20})),
    )

    def identity(batches: Any) -> Any:
        yield from batches

    got = rows.map_in_arrow(identity, "kafka_partition int, kafka_offset long").collect()
    offsets = sorted((r["kafka_partition"], r["kafka_offset"]) for r in got)
    assert offsets == [(0, o) for o in range(5, 20)] + [(2, o) for o in range(20)]


def test_batch_ranges_start_at_the_boundary_or_the_log_start() -> None:
    assert batch_ranges({0: 10, 1: 7}, {0: 12, 1: 7, 2: 4}) == [
        OffsetRange(0, 10, 12),
        OffsetRange(2, -2, 4),
    ]
    assert batch_ranges({0: 10}, {0: 10}) == []


def test_split_ranges_keeps_every_core_busy_without_slicing_small_ranges() -> None:
    wide = 4 * MIN_SPLIT_OFFSETS
    pieces = split_ranges([OffsetRange(0, 100, 100 + wide)], 4)
    assert len(pieces) == 4
    assert pieces[0].start == 100 and pieces[-1].until == 100 + wide
    assert all(a.until == b.start for a, b in itertools.pairwise(pieces))
    small = [OffsetRange(0, 0, MIN_SPLIT_OFFSETS), OffsetRange(1, -2, 10**9)]
    assert split_ranges(small, 8) == small
    assert split_ranges([OffsetRange(0, 5, 5)], 2) == []


def test_tasks_get_about_the_same_number_of_offsets() -> None:
    ranges = [OffsetRange(p, 0, size) for p, size in enumerate([900, 500, 400, 300, 100, 0])]
    tasks = plan_tasks(ranges, 2)
    loads = sorted(sum(r.until - r.start for r in task) for task in tasks)
    assert len(loads) == 2 and loads[1] - loads[0] <= 300  # the largest range alone is 900
    assert {r for task in tasks for r in task} == set(ranges[:5])
    for task in tasks:
        assert list(task) == sorted(task, key=lambda r: (r.partition, r.start))
    assert plan_tasks(ranges[:1], 8) == ((ranges[0],),)
    assert plan_tasks([], 2) == ()


def test_a_task_of_several_topics_reads_them_topic_by_topic() -> None:
    ranges = [
        OffsetRange(1, 0, 300, topic="b"),
        OffsetRange(0, 0, 200, topic="a"),
        OffsetRange(0, 0, 100, topic="b"),
        OffsetRange(1, -2, 400, topic="a"),
        OffsetRange(0, 0, 250, topic="c"),
    ]
    tasks = plan_tasks(ranges, 2)
    assert len(tasks) == 2
    assert {r for task in tasks for r in task} == set(ranges)
    for task in tasks:  # each topic's ranges together, partitions in order
        assert list(task) == sorted(task, key=lambda r: (r.topic, r.partition, r.start))
    # A wide range is cut to keep the cores busy; its pieces keep their topic.
    wide = OffsetRange(0, 0, 4 * MIN_SPLIT_OFFSETS, topic="c")
    pieces = split_ranges([OffsetRange(0, 0, 10, topic="b"), wide], 3)
    assert [r.topic for r in pieces] == ["b", "c", "c"]
    assert pieces[1].until == pieces[2].start and pieces[2].until == wide.until
