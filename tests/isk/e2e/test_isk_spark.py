"""Spark reads an ISK hotset table through the gateway, unmodified: Iceberg's REST catalog and
S3FileIO (vended S3 settings) against ``bergstream run``'s ``isk`` service."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.kits.isk_gateway import (
    Gateway,
    attach_spark_catalog,
    in_micros,
    mixed_records,
    produce,
    shared_spark,
)
from tests.support import consume_rows, sort_rows

pytestmark = pytest.mark.slow

# Timestamps as µs since the epoch: collecting a timestamptz turns it into a naive datetime in
# the Python process's local zone, so compare the exact integer instead.
SELECT_ROWS = (
    "SELECT kafka_partition, kafka_offset, unix_micros(kafka_timestamp) AS kafka_timestamp_us, "
    "kafka_timestamp_type, kafka_key, kafka_headers, kafka_value FROM {table}"
)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """The run's one Spark session."""
    with shared_spark() as session:
        yield session


@pytest.fixture(scope="module")
def catalog(spark: Any, gateway: Gateway) -> str:
    """An Iceberg REST catalog on the module's gateway, attached at runtime under a fresh name;
    S3 settings come only from the table's vended config."""
    return attach_spark_catalog(spark, gateway.catalog_url)


def table_name(catalog: str, topic: str) -> str:
    return f"{catalog}.hotset.`{topic}`"


def as_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def spark_rows(spark: Any, table: str) -> list[dict[str, Any]]:
    """Rows of ``table`` as Spark collects them, in the row contract (µs timestamps)."""
    rows = []
    for row in spark.sql(SELECT_ROWS.format(table=table)).collect():
        rows.append(
            {
                "kafka_partition": row.kafka_partition,
                "kafka_offset": row.kafka_offset,
                "kafka_timestamp": row.kafka_timestamp_us,
                "kafka_timestamp_type": row.kafka_timestamp_type,
                "kafka_key": as_bytes(row.kafka_key),
                "kafka_headers": [
                    {"key": header.key, "value": as_bytes(header.value)}
                    for header in row.kafka_headers or ()
                ],
                "kafka_value": as_bytes(row.kafka_value),
            }
        )
    return sort_rows(rows)


def test_spark_reads_the_table_as_consumed(
    spark: Any,
    catalog: str,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(45))
    expected = in_micros(consume_rows(kafka_bootstrap, topic, 45))
    table = table_name(catalog, topic)

    assert spark_rows(spark, table) == expected
    assert spark.sql(f"SELECT count(*) FROM {table}").first()[0] == 45
    # spark.table goes the same way as SQL
    assert spark.table(table).count() == 45
    assert {row["kafka_partition"] for row in expected} == {0, 1}
    assert any(row["kafka_key"] is None for row in expected)
    assert any(row["kafka_key"] == b"" for row in expected)
    assert any(row["kafka_value"] is None for row in expected)
    assert any([h["key"] for h in row["kafka_headers"]].count("h") == 2 for row in expected)


def test_spark_metadata_tables(
    spark: Any,
    catalog: str,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(21))
    table = table_name(catalog, topic)

    snapshots = spark.sql(f"SELECT snapshot_id, summary FROM {table}.snapshots").collect()
    assert snapshots
    current = spark.sql(
        f"SELECT snapshot_id FROM {table}.history WHERE is_current_ancestor"
    ).collect()
    assert current
    files = spark.sql(f"SELECT file_path, record_count, file_size_in_bytes FROM {table}.files")
    rows = files.collect()
    assert sum(row.record_count for row in rows) == 21
    # sealed chunks of 8 plus each partition's unsealed tail, all read through the S3 gateway
    assert len(rows) >= 4 and all(row.file_path.startswith("s3://") for row in rows)
    assert all(row.file_size_in_bytes > 0 for row in rows)


def test_spark_missing_table_is_no_such_table(spark: Any, catalog: str) -> None:
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException) as raised:
        spark.table(table_name(catalog, "no-such-topic-here")).count()
    assert "TABLE_OR_VIEW_NOT_FOUND" in str(raised.value)
    with pytest.raises(AnalysisException) as raised:
        spark.sql(f"SELECT * FROM {table_name(catalog, 'no-such-topic-here')}.snapshots").collect()
    assert "TABLE_OR_VIEW_NOT_FOUND" in str(raised.value)


def test_spark_zero_lag(
    spark: Any,
    catalog: str,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
) -> None:
    topic = new_topic(partitions=2)
    table = table_name(catalog, topic)
    for i in range(5):
        value = b"lag-%d" % i
        produce(kafka_bootstrap, topic, [{"partition": i % 2, "key": b"k", "value": value}])
        rows = spark_rows(spark, table)  # cache-enabled=false: a fresh LoadTable per query
        assert len(rows) == i + 1
        last = [row for row in rows if row["kafka_partition"] == i % 2][-1]
        assert last["kafka_value"] == value and last["kafka_offset"] == i // 2
        assert spark.sql(f"SELECT count(*) FROM {table}").first()[0] == i + 1


def test_spark_time_travel_and_incremental_reads(
    spark: Any,
    catalog: str,
    gateway: Gateway,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
) -> None:
    """``VERSION AS OF`` and ``TIMESTAMP AS OF`` read an earlier snapshot as it was, and Spark's
    incremental append scan between two snapshot ids returns exactly the records produced
    between the two LoadTables."""
    topic = new_topic(partitions=2)
    table = table_name(catalog, topic)
    snapshots: list[int] = []
    for batch in (21, 13, 6):  # three LoadTables, each after new records
        produce(kafka_bootstrap, topic, mixed_records(batch))
        spark.sql(f"REFRESH TABLE {table}")
        (newest,) = spark.sql(
            f"SELECT snapshot_id FROM {table}.snapshots WHERE operation = 'append' "
            "ORDER BY committed_at DESC LIMIT 1"
        ).collect()
        snapshots.append(newest.snapshot_id)
    everything = in_micros(consume_rows(kafka_bootstrap, topic, 40))
    listed = spark.sql(
        f"SELECT snapshot_id, committed_at, operation FROM {table}.snapshots ORDER BY committed_at"
    ).collect()
    # Each LoadTable's APPEND, after a REPLACE when ISK rebuilt a chunk window the tail left
    # (windows of 8 offsets here) as one file: the same rows, which incremental reads skip.
    history = [row for row in listed if row.operation == "append"]
    assert [row.snapshot_id for row in history] == snapshots
    assert {row.operation for row in listed} <= {"append", "replace"}

    first = spark_rows(spark, f"{table} VERSION AS OF {snapshots[0]}")
    assert len(first) == 21 and all(row in everything for row in first)
    at = history[1].committed_at.isoformat(sep=" ")
    second = spark_rows(spark, f"{table} TIMESTAMP AS OF '{at}'")
    assert len(second) == 34 and all(row in second for row in first)
    assert spark_rows(spark, table) == everything

    between = (
        spark.read.option("start-snapshot-id", str(snapshots[0]))
        .option("end-snapshot-id", str(snapshots[2]))
        .table(table)
        .collect()
    )
    seen = sorted((row.kafka_partition, row.kafka_offset) for row in between)
    earlier = {(row["kafka_partition"], row["kafka_offset"]) for row in first}
    assert seen == sorted(
        (row["kafka_partition"], row["kafka_offset"])
        for row in everything
        if (row["kafka_partition"], row["kafka_offset"]) not in earlier
    )
    assert len(seen) == 19
