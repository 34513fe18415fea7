"""The ``isk`` service end to end: ``bergstream run`` over a real Kafka, read by PyIceberg's
RestCatalog (vended S3 settings, through the S3 gateway), DuckDB's iceberg extension and
ClickHouse (chDB's DataLakeCatalog database), time travel included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.kits.clickhouse import clickhouse_rows
from tests.kits.isk_gateway import (
    Gateway,
    attach_isk,
    duckdb_connection,
    mixed_records,
    produce,
)
from tests.support import consume_rows, sort_rows

pytestmark = pytest.mark.slow


def scan(gateway: Gateway, topic: str) -> list[dict[str, Any]]:
    table = gateway.catalog().load_table(f"hotset.{topic}")
    return sort_rows(table.scan().to_arrow().to_pylist())


def test_table_lists_and_scans_as_consumed(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(45))
    catalog = gateway.catalog()
    assert ("hotset",) in catalog.list_namespaces()
    assert ("hotset", topic) in catalog.list_tables("hotset")
    expected = consume_rows(kafka_bootstrap, topic, 45)
    rows = scan(gateway, topic)
    assert rows == expected
    assert {row["kafka_partition"] for row in rows} == {0, 1}
    assert any(row["kafka_key"] is None for row in rows)
    assert any(row["kafka_key"] == b"" for row in rows)
    assert any(row["kafka_value"] is None for row in rows)
    assert any(len(row["kafka_headers"]) >= 2 for row in rows)


def test_zero_lag(gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    for i in range(20):
        value = b"lag-%d" % i
        produce(kafka_bootstrap, topic, [{"partition": i % 2, "key": b"k", "value": value}])
        rows = scan(gateway, topic)  # a fresh LoadTable after the ack
        assert len(rows) == i + 1
        last = [row for row in rows if row["kafka_partition"] == i % 2][-1]
        assert last["kafka_value"] == value and last["kafka_offset"] == i // 2


def test_same_state_gives_the_same_metadata_location(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(19))
    catalog = gateway.catalog()
    first = catalog.load_table(f"hotset.{topic}")
    first.scan().to_arrow()  # reading files changes nothing
    second = gateway.catalog().load_table(f"hotset.{topic}")
    assert second.metadata_location == first.metadata_location
    assert second.metadata == first.metadata
    produce(kafka_bootstrap, topic, mixed_records(1))
    third = catalog.load_table(f"hotset.{topic}")
    assert third.metadata_location != first.metadata_location


def test_missing_table_is_no_such_table(gateway: Gateway) -> None:
    from pyiceberg.exceptions import NoSuchTableError

    with pytest.raises(NoSuchTableError):
        gateway.catalog().load_table("hotset.no-such-topic-here")


def test_duckdb_reads_the_table(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(37))
    expected = consume_rows(kafka_bootstrap, topic, 37)
    connection = duckdb_connection()
    try:
        attach_isk(connection, gateway.catalog_url)
        count, values, offsets, headers = connection.execute(
            "SELECT count(*), count(kafka_value), sum(kafka_offset), sum(len(kafka_headers)) "
            f'FROM isk.hotset."{topic}"'
        ).fetchone()
        # the last record of each partition, as DuckDB sees it
        tail = connection.execute(
            "SELECT kafka_partition, max(kafka_offset) "
            f'FROM isk.hotset."{topic}" GROUP BY kafka_partition ORDER BY 1'
        ).fetchall()
    finally:
        connection.close()
    assert count == len(expected)
    assert values == sum(row["kafka_value"] is not None for row in expected)
    assert offsets == sum(row["kafka_offset"] for row in expected)
    assert headers == sum(len(row["kafka_headers"]) for row in expected)
    assert tail == [
        (p, max(row["kafka_offset"] for row in expected if row["kafka_partition"] == p))
        for p in (0, 1)
    ]


def test_an_earlier_snapshot_reads_as_it_was(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Time travel over live Kafka data: after new records, a later LoadTable still lists the
    earlier snapshot, and PyIceberg and DuckDB read exactly the earlier rows from it."""
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(23))
    earlier_rows = consume_rows(kafka_bootstrap, topic, 23)
    earlier = gateway.catalog().load_table(f"hotset.{topic}").current_snapshot()
    assert earlier is not None
    produce(kafka_bootstrap, topic, mixed_records(9))
    table = gateway.catalog().load_table(f"hotset.{topic}")
    current = table.current_snapshot()
    assert current is not None and current.snapshot_id != earlier.snapshot_id
    assert [s.snapshot_id for s in table.snapshots()] == [earlier.snapshot_id, current.snapshot_id]
    assert current.parent_snapshot_id == earlier.snapshot_id
    assert current.summary is not None and current.summary["added-records"] == "9"
    rows = sort_rows(table.scan(snapshot_id=earlier.snapshot_id).to_arrow().to_pylist())
    assert rows == earlier_rows
    assert len(table.scan().to_arrow()) == 32

    connection = duckdb_connection()
    try:
        attach_isk(connection, gateway.catalog_url)
        then, now = (
            connection.execute(
                f'SELECT count(*), sum(kafka_offset) FROM isk.hotset."{topic}"{at}'
            ).fetchone()
            for at in (f" AT (VERSION => {earlier.snapshot_id})", "")
        )
    finally:
        connection.close()
    assert then == (23, sum(row["kafka_offset"] for row in earlier_rows))
    assert now is not None and now[0] == 32


def test_clickhouse_reads_the_table_and_an_earlier_snapshot(
    gateway: Gateway, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """ClickHouse parses the metadata file names ISK serves (``<version>-<uuid>``), reads the
    live table, and an earlier snapshot by id as it was."""
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(29))
    earlier_rows = consume_rows(kafka_bootstrap, topic, 29)
    earlier = gateway.catalog().load_table(f"hotset.{topic}").current_snapshot()
    assert earlier is not None
    produce(kafka_bootstrap, topic, mixed_records(6))
    expected = consume_rows(kafka_bootstrap, topic, 35)
    sql = (
        "SELECT count(), sum(kafka_offset), count(kafka_value), sum(length(kafka_headers)) "
        f"FROM isk.`hotset.{topic}`"
    )
    [[now], [then], tables] = clickhouse_rows(
        gateway,
        [
            sql,
            f"{sql} SETTINGS iceberg_snapshot_id = {earlier.snapshot_id}",
            "SHOW TABLES FROM isk",
        ],
    )
    listed = {name for (name,) in tables}

    def summary(rows: list[dict[str, Any]]) -> tuple[int, int, int, int]:
        values = sum(row["kafka_value"] is not None for row in rows)
        headers = sum(len(row["kafka_headers"]) for row in rows)
        return (len(rows), sum(row["kafka_offset"] for row in rows), values, headers)

    assert tuple(int(v) for v in now) == summary(expected)
    assert tuple(int(v) for v in then) == summary(earlier_rows)
    assert f"hotset.{topic}" in listed, sorted(listed)[:20]
