"""Trino 476 reads ISK hotset tables through the gateway, unmodified: its Iceberg connector with
only the REST catalog's URI, vended credentials and the S3 endpoint/region/path-style settings;
rows, metadata tables, zero lag, time travel and the CLI."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from bergstream.core.api import KEY_ID, TIMESTAMP_TYPE_ID, VALUE_ID
from bergstream.devstack.stack.trino import TrinoError
from tests.isk.trino.trino_rows import contract, trino_rows
from tests.kits.isk_gateway import mixed_records, produce
from tests.kits.trino import TrinoCatalog
from tests.support import consume_rows

pytestmark = pytest.mark.slow


def test_trino_reads_the_table_as_consumed(
    catalog: TrinoCatalog, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(45))
    expected = contract(consume_rows(kafka_bootstrap, topic, 45))
    table = catalog.table("hotset", topic)

    assert trino_rows(catalog, table) == expected
    assert catalog.trino.query(f"SELECT count(*) FROM {table}").scalar() == 45
    offsets = catalog.trino.query(
        f"SELECT kafka_partition, sum(kafka_offset), count(kafka_value) FROM {table} "
        "GROUP BY kafka_partition ORDER BY 1"
    ).rows
    assert offsets == [
        (p, sum(r["kafka_offset"] for r in expected if r["kafka_partition"] == p),
         sum(r["kafka_value"] is not None for r in expected if r["kafka_partition"] == p))
        for p in (0, 1)
    ]  # fmt: skip
    assert any(row["kafka_key"] is None for row in expected)
    assert any(row["kafka_key"] == b"" for row in expected)
    assert any(len(row["kafka_headers"]) >= 2 for row in expected)
    # a filter on partition and offset, which Trino prunes files by, counts the same rows
    pushed = catalog.trino.query(
        f"SELECT count(*) FROM {table} WHERE kafka_partition = 1 AND kafka_offset >= 10"
    ).scalar()
    assert pushed == sum(
        1 for r in expected if r["kafka_partition"] == 1 and r["kafka_offset"] >= 10
    )


def test_trino_lists_namespaces_and_tables(
    catalog: TrinoCatalog, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(3))
    schemas = {row[0] for row in catalog.trino.query(f"SHOW SCHEMAS FROM {catalog.name}").rows}
    assert "hotset" in schemas
    tables = {row[0] for row in catalog.trino.query(f"SHOW TABLES FROM {catalog.name}.hotset").rows}
    assert topic in tables


def test_trino_metadata_tables(
    catalog: TrinoCatalog, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(21))
    query = catalog.trino.query

    snapshots = query(
        f"SELECT snapshot_id, operation FROM {catalog.table('hotset', topic, '$snapshots')}"
    ).rows
    assert snapshots
    history = query(
        "SELECT snapshot_id FROM "
        f"{catalog.table('hotset', topic, '$history')} WHERE is_current_ancestor"
    ).rows
    assert history and history[-1][0] in {row[0] for row in snapshots}
    files = query(
        "SELECT file_path, record_count, file_size_in_bytes, null_value_counts, "
        f"lower_bounds, upper_bounds FROM {catalog.table('hotset', topic, '$files')}"
    ).dicts()
    assert sum(f["record_count"] for f in files) == 21
    # sealed chunks of 8 plus each partition's unsealed tail, all read through the S3 gateway
    assert len(files) >= 4 and all(f["file_path"].startswith("s3://") for f in files)
    assert all(f["file_size_in_bytes"] > 0 for f in files)
    partitions = query(
        "SELECT partition.kafka_partition, record_count, file_count "
        f"FROM {catalog.table('hotset', topic, '$partitions')}"
    ).rows
    by_partition: dict[int, int] = {}
    for partition, records, _files in partitions:
        by_partition[partition] = by_partition.get(partition, 0) + records
    assert by_partition == {0: 11, 1: 10}


def test_trino_column_statistics_of_hot_files(
    catalog: TrinoCatalog, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Every file's manifest entry bounds and counts the timestamp type, key and value too, so
    ``$partitions`` shows their min, max and null counts and Trino prunes files by them."""
    topic = new_topic(partitions=1)
    produce(kafka_bootstrap, topic, [{**r, "partition": 0} for r in mixed_records(20)])
    rows = consume_rows(kafka_bootstrap, topic, 20)
    keys = [r["kafka_key"] for r in rows if r["kafka_key"] is not None]
    values = [r["kafka_value"] for r in rows if r["kafka_value"] is not None]
    query = catalog.trino.query

    files = query(
        "SELECT record_count, value_counts, null_value_counts, lower_bounds, upper_bounds "
        f"FROM {catalog.table('hotset', topic, '$files')}"
    ).dicts()
    assert len(files) >= 2 and sum(f["record_count"] for f in files) == 20
    for file in files:  # JSON gives the maps' integer keys (field ids) as text
        for field_id in (KEY_ID, VALUE_ID):
            assert file["value_counts"][str(field_id)] == file["record_count"]
            assert str(field_id) in file["null_value_counts"]
        assert str(TIMESTAMP_TYPE_ID) in file["lower_bounds"]
        assert str(TIMESTAMP_TYPE_ID) in file["upper_bounds"]
    nulls = query(
        "SELECT sum(data.kafka_key.null_count), sum(data.kafka_value.null_count), "
        "to_hex(min(data.kafka_key.min)), to_hex(max(data.kafka_key.max)), "
        "to_hex(min(data.kafka_value.min)), to_hex(max(data.kafka_value.max)), "
        "min(data.kafka_timestamp_type.min), max(data.kafka_timestamp_type.max) "
        f"FROM {catalog.table('hotset', topic, '$partitions')}"
    ).rows
    assert nulls == [
        (
            20 - len(keys),
            20 - len(values),
            min(keys).hex().upper(),
            max(keys).hex().upper(),
            min(values).hex().upper(),
            max(values).hex().upper(),
            0,
            0,
        )
    ]
    # A key above every file's upper bound: no file is read (no split, no row).
    table = catalog.table("hotset", topic)
    pruned = query(f"SELECT count(*) FROM {table} WHERE kafka_key = X'FFFF'")
    scanned = query(f"SELECT count(*) FROM {table} WHERE kafka_key IS NOT NULL")
    assert (pruned.scalar(), scanned.scalar()) == (0, len(keys))
    assert pruned.stats["totalSplits"] < scanned.stats["totalSplits"]
    one = query(f"SELECT kafka_offset FROM {table} WHERE kafka_key = X'{b'k17'.hex()}'").rows
    assert one == [(17,)]


def test_trino_missing_table_is_table_not_found(catalog: TrinoCatalog) -> None:
    with pytest.raises(TrinoError) as raised:
        catalog.trino.query(f"SELECT count(*) FROM {catalog.table('hotset', 'no-such-topic-x')}")
    assert raised.value.error_name == "TABLE_NOT_FOUND"


def test_trino_zero_lag(
    catalog: TrinoCatalog, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    table = catalog.table("hotset", topic)
    for i in range(10):
        value = b"lag-%d" % i
        produce(kafka_bootstrap, topic, [{"partition": i % 2, "key": b"k", "value": value}])
        found = catalog.trino.query(
            f"SELECT kafka_partition, kafka_offset FROM {table} "
            f"WHERE kafka_value = X'{value.hex()}'"
        ).rows
        assert found == [(i % 2, i // 2)], f"round {i}: the record acked before the query"
        assert catalog.trino.query(f"SELECT count(*) FROM {table}").scalar() == i + 1


def current_snapshot(catalog: TrinoCatalog, topic: str) -> tuple[int, str]:
    """The id and commit time (Trino's text) of the table's newest snapshot."""
    return catalog.trino.query(
        "SELECT snapshot_id, CAST(committed_at AS varchar) FROM "
        f"{catalog.table('hotset', topic, '$snapshots')} ORDER BY committed_at DESC LIMIT 1"
    ).rows[0]


def test_trino_time_travel_by_version_and_timestamp(
    catalog: TrinoCatalog, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Needs ISK's snapshot history: after new records, the earlier snapshot is still listed
    and reads exactly the earlier rows."""
    topic = new_topic(partitions=2)
    table = catalog.table("hotset", topic)
    produce(kafka_bootstrap, topic, mixed_records(20))
    earlier = contract(consume_rows(kafka_bootstrap, topic, 20))
    assert trino_rows(catalog, table) == earlier  # the load that records the first snapshot
    first_id, first_at = current_snapshot(catalog, topic)
    time.sleep(1.5)  # snapshot times are in ms: the next one is strictly later
    produce(kafka_bootstrap, topic, mixed_records(13))
    everything = contract(consume_rows(kafka_bootstrap, topic, 33))
    assert trino_rows(catalog, table) == everything
    second_id, second_at = current_snapshot(catalog, topic)
    assert second_id != first_id and second_at > first_at

    listed = catalog.trino.query(
        f"SELECT snapshot_id FROM {catalog.table('hotset', topic, '$snapshots')}"
    )
    ids = {row[0] for row in listed.rows}
    assert {first_id, second_id} <= ids
    by_version = f"{table} FOR VERSION AS OF {first_id}"
    assert trino_rows(catalog, by_version) == earlier
    by_time = f"{table} FOR TIMESTAMP AS OF TIMESTAMP '{first_at}'"
    assert trino_rows(catalog, by_time) == earlier
    assert trino_rows(catalog, f"{table} FOR VERSION AS OF {second_id}") == everything
    assert catalog.trino.query(f"SELECT count(*) FROM {by_version}").scalar() == 20


def test_trino_cli_reads_the_table(
    catalog: TrinoCatalog, kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Trino's own CLI jar (Maven Central) against the same server and catalog."""
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, mixed_records(12))
    out = catalog.trino.cli(
        f"SELECT count(*), sum(kafka_offset) FROM {catalog.table('hotset', topic)}"
    )
    assert out.strip() == '"12","30"'  # offsets 0-5 in each of two partitions
