"""``current.<topic>`` of an upsert topic through ``bergstream run``'s ``isk`` service: the state
the pipeline keeps in the lake, plus the changes still only in Kafka, read by PyIceberg, DuckDB
and Spark unmodified, at zero lag; the log namespaces keep every record."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.kits.isk_gateway import (
    attach_isk,
    attach_spark_catalog,
    duckdb_connection,
    shared_spark,
)
from tests.kits.upsert_topic import KEYS, PARTITIONS, Stage, changes, replay, run_upsert_stage

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stage(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    yield from run_upsert_stage(kafka_bootstrap, new_topic, tmp_path_factory)


def state_of(rows: list[dict[str, Any]]) -> dict[bytes, bytes]:
    out = {bytes(r["kafka_key"]): bytes(r["kafka_value"]) for r in rows}
    assert len(out) == len(rows), "a key has two rows"
    return out


def test_pyiceberg_reads_the_current_state(stage: Stage) -> None:
    table = stage.gateway.catalog().load_table(f"current.{stage.topic}")
    rows = table.scan().to_arrow().to_pylist()
    assert state_of(rows) == replay(stage.produced)
    summary = table.metadata.current_snapshot().summary
    assert int(summary["total-delete-files"]) == 1  # hot changes replace cold rows
    # the log keeps every record
    merged = stage.gateway.catalog().load_table(f"merged.{stage.topic}")
    assert merged.scan().to_arrow().num_rows == len(stage.produced)


def test_duckdb_and_spark_read_the_current_state(stage: Stage) -> None:
    expected = replay(stage.produced)
    connection = duckdb_connection()
    attach_isk(connection, stage.gateway.catalog_url)
    rows = connection.execute(
        f'SELECT kafka_key, kafka_value FROM isk.current."{stage.topic}"'
    ).fetchall()
    assert {bytes(k): bytes(v) for k, v in rows} == expected
    assert len(rows) == len(expected)
    with shared_spark() as spark:
        name = attach_spark_catalog(spark, stage.gateway.catalog_url)
        found = spark.sql(f"SELECT kafka_key, kafka_value FROM {name}.current.`{stage.topic}`")
        collected = found.collect()
        assert {bytes(r[0]): bytes(r[1]) for r in collected} == expected
        assert len(collected) == len(expected)


def test_zero_lag_updates_and_deletes(stage: Stage) -> None:
    catalog = stage.gateway.catalog()
    for round_number in range(6):
        key = b"k%d" % (round_number * 7 % KEYS)
        partition = int(key[1:]) % PARTITIONS
        value = None if round_number % 3 == 2 else uuid.uuid4().hex.encode()
        stage.add([{"partition": partition, "key": key, "value": value}])
        rows = catalog.load_table(f"current.{stage.topic}").scan().to_arrow().to_pylist()
        state = state_of(rows)
        assert state.get(key) == value, f"round {round_number}: the acked change is missing"
        assert state == replay(stage.produced)


def test_time_travel_to_an_earlier_state(stage: Stage) -> None:
    catalog = stage.gateway.catalog()
    before = catalog.load_table(f"current.{stage.topic}")
    old_state = state_of(before.scan().to_arrow().to_pylist())
    old_id = before.metadata.current_snapshot().snapshot_id
    stage.add(changes(random.Random(5), 40, "later"))
    after = catalog.load_table(f"current.{stage.topic}")
    assert after.metadata.current_snapshot().snapshot_id != old_id
    assert old_id in [s.snapshot_id for s in after.metadata.snapshots]
    travelled = after.scan(snapshot_id=old_id).to_arrow().to_pylist()
    assert state_of(travelled) == old_state
    assert state_of(after.scan().to_arrow().to_pylist()) == replay(stage.produced)


def test_append_and_internal_topics_have_no_current_table(stage: Stage) -> None:
    from pyiceberg.exceptions import NoSuchTableError

    log = stage.append_topic
    catalog = stage.gateway.catalog()
    listed = catalog.list_tables("current")
    assert ("current", stage.topic) in listed
    assert ("current", log) not in listed
    with pytest.raises(NoSuchTableError, match="append topic"):
        catalog.load_table(f"current.{log}")
    # __consumer_offsets is compacted and matches "*", yet it is Kafka's, not a table
    with pytest.raises(NoSuchTableError, match="internal topic"):
        catalog.load_table("current.__consumer_offsets")


def test_rejected_lists_the_records_without_a_key(stage: Stage) -> None:
    stage.add([{"partition": 2, "key": None, "value": b"hot, no key"}])
    catalog = stage.gateway.catalog()
    assert ("rejected", stage.topic) in catalog.list_tables("rejected")
    rows = catalog.load_table(f"rejected.{stage.topic}").scan().to_arrow().to_pylist()
    assert sorted(r["kafka_value"] for r in rows) == [b"hot, no key", b"no key"]
    assert all(r["reason"].startswith("no key") for r in rows)
    # the log keeps them: nothing is dropped
    merged = catalog.load_table(f"merged.{stage.topic}").scan().to_arrow()
    assert merged.filter(merged["kafka_key"].is_null()).num_rows == 2
