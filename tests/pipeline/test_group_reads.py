"""The group of raw topics reads a micro-batch one of two ways, and both copy exactly what Kafka
holds: the workers reading their offset ranges with librdkafka, and Spark's Kafka source when
the pipeline has Java client settings (``kafka_options``). Two topics with keys, headers, null
values and transactions (aborted ones left out), two runs each (the second adds records).
And the offsets of many topics asked at once equal each topic's own, a missing topic named."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from bergstream.core.lake import load_catalog
from bergstream.pipeline.kafka import admin_client, topic_offsets, topics_offsets
from bergstream.pipeline.kafka_fetch import FETCHED_SCHEMA, FetchSettings, OffsetRange, fetch_range
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import worker_fetch_settings
from bergstream.pipeline.topic_runs import run_topics
from bergstream.pipeline.topics import TopicSelection
from tests.kits.lake import Produced, produce, produce_transactions

pytestmark = pytest.mark.slow

PARTITIONS = 2


def _records(count: int, tag: str, first: int = 0) -> list[Produced]:
    return [
        Produced(
            i % PARTITIONS,
            None if i % 5 == 0 else f"{tag}-{i}".encode(),
            None if i % 11 == 0 else f"{tag} value {i}".encode() * (i % 4),
            ((("h", b"1"), ("h", None)) if i % 3 == 0 else ()),
            1_700_000_000_000 + i,
        )
        for i in range(first, first + count)
    ]


def _kafka_rows(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every committed record of ``topic`` as the row contract's columns (read with
    ``fetch_range``, which ``test_kafka_fetch`` holds equal to Spark's source)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        ]
    finally:
        consumer.close()
    settings = FetchSettings({"bootstrap.servers": bootstrap}, topic)
    batches = [
        batch
        for partition, end in enumerate(ends)
        for batch in fetch_range(settings, OffsetRange(partition, 0, end))
    ]
    return _sorted(pa.Table.from_batches(batches, FETCHED_SCHEMA))


def _sorted(rows: pa.Table) -> list[dict[str, Any]]:
    found = rows.select(FETCHED_SCHEMA.names).cast(FETCHED_SCHEMA).to_pylist()
    return sorted(found, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))


def _quiet(line: str) -> None:
    pass


@pytest.mark.parametrize("reader", ["workers", "spark-source"])
def test_the_groups_two_readers_copy_exactly_the_committed_records(
    reader: str,
    spark: Any,
    make_lake: Callable[..., PipelineLake],
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
) -> None:
    options = {"client.id": "bergstream-group-test"} if reader == "spark-source" else {}
    namespace = f"group_{reader.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    lake = make_lake(pipeline={"kafka_options": options}, namespace=namespace)
    assert (worker_fetch_settings(lake, "t") is None) == bool(options)
    topics = [create_topic(PARTITIONS, prefix="group") for _ in range(2)]
    for number, topic in enumerate(topics):
        produce(kafka_bootstrap, topic, _records(30 + 10 * number, topic))
        again = _records(7, f"tx-{topic}", first=100)
        produce_transactions(kafka_bootstrap, topic, [("abort", again), ("commit", again)])
    catalog = load_catalog(lake)
    for round_ in range(2):
        if round_:
            for topic in topics:
                produce(kafka_bootstrap, topic, _records(9, topic, first=200))
        lines: list[str] = []
        result = run_topics(
            spark,
            lake,
            TopicSelection.of(topics, None),
            once=True,
            typing_for=lambda topic: None,
            mode_for=lambda topic: None,
            report=lines.append,
        )
        assert not result.failures, result.summary()
        assert any("copying 2 topic(s) in one query" in line for line in lines), lines
        for topic in topics:
            table = catalog.load_table(lake.table_identifier(topic))
            assert _sorted(table.scan().to_arrow()) == _kafka_rows(kafka_bootstrap, topic)


def test_the_offsets_of_many_topics_at_once_equal_each_topics_own(
    spark: Any, lake: PipelineLake, kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    topics = [create_topic(partitions, prefix="offsets") for partitions in (2, 3)]
    for topic in topics:
        produce(kafka_bootstrap, topic, _records(12, topic))
    missing = f"offsets-missing-{uuid.uuid4().hex[:8]}"
    with admin_client(spark, lake.config, {}) as admin:
        found, failures = topics_offsets(spark, lake.config, {}, [*topics, missing], admin)
        assert found == {t: topic_offsets(spark, lake.config, {}, t, admin) for t in topics}
    assert list(failures) == [missing]
    assert f"topic '{missing}' does not exist on Kafka" in failures[missing]
    assert sum(found[topics[1]].end.values()) == 12
