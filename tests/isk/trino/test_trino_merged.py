"""Trino 476 reads ``hotset``, ``coldset`` and ``merged`` of one topic (half of it copied into
the coldset by the pipeline, the oldest part deleted from Kafka; the stage of
tests/isk/merged/test_merged.py, from tests/kits/merged_topic.py) through ISK, with the same
catalog properties as a user's."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bergstream.devstack.stack.trino import TrinoServer
from tests.isk.trino.trino_rows import contract, trino_rows
from tests.kits.isk_gateway import produce
from tests.kits.merged_topic import COLD, DELETED, Stage, pyiceberg_rows, run_merged_stage
from tests.kits.trino import TrinoCatalog, create_catalog

pytestmark = pytest.mark.slow

NAMESPACES = ("coldset", "hotset", "merged")


@pytest.fixture(scope="module")
def merged_stage(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    """The stage of test_merged.py (its own instance in this module)."""
    yield from run_merged_stage(kafka_bootstrap, new_topic, tmp_path_factory)


@pytest.fixture(scope="module")
def merged_catalog(trino: TrinoServer, merged_stage: Stage) -> Iterator[TrinoCatalog]:
    """A Trino catalog on the stage's gateway, dropped afterwards."""
    created = create_catalog(trino, merged_stage.gateway)
    try:
        yield created
    finally:
        trino.query(f"DROP CATALOG {created.name}")


def split(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """What each namespace holds of ``rows`` (every record of the topic)."""
    return {
        "coldset": [r for r in rows if r["kafka_offset"] < COLD],
        "hotset": [r for r in rows if r["kafka_offset"] >= DELETED],
        "merged": rows,
    }


def test_trino_reads_each_namespace_as_produced(
    merged_catalog: TrinoCatalog, merged_stage: Stage
) -> None:
    expected = split(contract(merged_stage.all_rows))
    for namespace in NAMESPACES:
        table = merged_catalog.table(namespace, merged_stage.topic)
        assert trino_rows(merged_catalog, table) == expected[namespace], namespace
    tables = merged_catalog.trino.query(f"SHOW SCHEMAS FROM {merged_catalog.name}").rows
    assert set(NAMESPACES) <= {row[0] for row in tables}


def test_trino_aggregates_match_pyiceberg(
    merged_catalog: TrinoCatalog, merged_stage: Stage
) -> None:
    merged_now = pyiceberg_rows(merged_stage, "merged")
    expected = split(merged_now)
    for namespace in NAMESPACES:
        table = merged_catalog.table(namespace, merged_stage.topic)
        got = merged_catalog.trino.query(
            "SELECT count(*), count(DISTINCT kafka_partition * 1000000000 + kafka_offset), "
            f"sum(kafka_offset), count(kafka_value) FROM {table}"
        ).rows
        rows = expected[namespace]
        assert got == [
            (
                len(rows),
                len(rows),
                sum(r["kafka_offset"] for r in rows),
                sum(r["kafka_value"] is not None for r in rows),
            )
        ], namespace
        keys = merged_catalog.trino.query(
            f"SELECT DISTINCT kafka_key FROM {table} WHERE kafka_key IS NOT NULL"
        ).rows
        assert {row[0] for row in keys} == {
            r["kafka_key"] for r in rows if r["kafka_key"] is not None
        }, namespace


def test_trino_metadata_tables_of_merged(merged_catalog: TrinoCatalog, merged_stage: Stage) -> None:
    merged_now = pyiceberg_rows(merged_stage, "merged")
    query = merged_catalog.trino.query
    snapshots = query(
        "SELECT snapshot_id FROM "
        f"{merged_catalog.table('merged', merged_stage.topic, '$snapshots')}"
    ).rows
    assert snapshots
    history = query(
        f"SELECT snapshot_id, is_current_ancestor FROM "
        f"{merged_catalog.table('merged', merged_stage.topic, '$history')}"
    ).rows
    assert {row[0] for row in history} <= {row[0] for row in snapshots}
    files = query(
        "SELECT file_path, record_count FROM "
        f"{merged_catalog.table('merged', merged_stage.topic, '$files')}"
    ).rows
    assert sum(count for _path, count in files) == len(merged_now)
    assert any("/files/" in path for path, _count in files)  # the coldset's files
    assert any("/data/p=" in path for path, _count in files)  # hot files from Kafka
    partitions = query(
        "SELECT partition.kafka_partition, sum(record_count) FROM "
        f"{merged_catalog.table('merged', merged_stage.topic, '$partitions')} GROUP BY 1 ORDER BY 1"
    ).rows
    assert partitions == [
        (p, sum(1 for r in merged_now if r["kafka_partition"] == p)) for p in (0, 1)
    ]


def test_trino_time_travel_on_merged(
    merged_catalog: TrinoCatalog, merged_stage: Stage, kafka_bootstrap: str
) -> None:
    """Needs ISK's snapshot history: the snapshot read before new records still reads exactly
    the earlier rows, by id and by time."""
    table = merged_catalog.table("merged", merged_stage.topic)
    snapshots = merged_catalog.table("merged", merged_stage.topic, "$snapshots")
    before = trino_rows(merged_catalog, table)
    first_id, first_at = merged_catalog.trino.query(
        f"SELECT snapshot_id, CAST(committed_at AS varchar) FROM {snapshots} "
        "ORDER BY committed_at DESC LIMIT 1"
    ).rows[0]
    time.sleep(1.5)
    later = [{"partition": 0, "value": b"after-first-snapshot"}]
    produce(kafka_bootstrap, merged_stage.topic, later)
    after = trino_rows(merged_catalog, table)
    assert len(after) == len(before) + 1
    by_version = trino_rows(merged_catalog, f"{table} FOR VERSION AS OF {first_id}")
    assert by_version == before
    by_time = trino_rows(merged_catalog, f"{table} FOR TIMESTAMP AS OF TIMESTAMP '{first_at}'")
    assert by_time == before


def test_trino_zero_lag_on_merged(
    merged_catalog: TrinoCatalog, merged_stage: Stage, kafka_bootstrap: str
) -> None:
    table = merged_catalog.table("merged", merged_stage.topic)
    for i in range(5):
        marker = b"trino-now-%d-%s" % (i, uuid.uuid4().hex.encode())
        produce(kafka_bootstrap, merged_stage.topic, [{"partition": i % 2, "value": marker}])
        found = merged_catalog.trino.query(
            f"SELECT count(*) FROM {table} WHERE kafka_value = X'{marker.hex()}'"
        ).scalar()
        assert found == 1, f"round {i}: the record acked before the query is missing"
