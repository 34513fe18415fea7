"""Maintenance on real tables: 200 small files compacted, snapshots expired and orphans removed,
the rows and the boundary unchanged; and maintenance while the pipeline copies."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from bergstream.core.lake import ResolvedLake, load_catalog
from bergstream.core.typed.row_contract import table_boundary
from bergstream.pipeline.maintain import maintain_table
from bergstream.pipeline.stream import run_pipeline
from tests.kits.lake import Produced, consume_all, produce, table_rows_pyiceberg

pytestmark = pytest.mark.slow

DAY_MS = 86_400_000
START_MS = 1_767_225_600_000  # 2026-01-01


def _quiet(line: str) -> None:
    pass


def _spread(partitions: int, days: int, count: int, start: int = 0) -> list[Produced]:
    """``count`` records over ``partitions`` and ``days`` days (one Iceberg partition each)."""
    return [
        Produced(
            i % partitions,
            None,
            f"v{i}".encode(),
            (("n", str(i).encode()),),
            START_MS + ((i // partitions) % days) * DAY_MS + i,
        )
        for i in range(start, start + count)
    ]


def _data_files(lake: ResolvedLake, topic: str) -> int:
    table = load_catalog(lake).load_table(lake.table_identifier(topic))
    return len(list(table.scan().plan_files()))


def test_maintenance_compacts_200_small_files(
    spark: Any,
    make_lake: Callable[..., ResolvedLake],
    lake: ResolvedLake,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
) -> None:
    topic = create_topic(4, prefix="maint")
    produce(kafka_bootstrap, topic, _spread(4, 10, 2000))
    # 5 micro-batches, each writing one file per (Kafka partition, day): 5 x 4 x 10 files.
    small_batches = make_lake(pipeline={"max_offsets_per_trigger": 400})
    result = run_pipeline(spark, small_batches, topic, once=True, report=_quiet)
    assert result.batches == 5
    assert _data_files(lake, topic) == 200
    rows_before = table_rows_pyiceberg(lake, topic)
    table = load_catalog(lake).load_table(lake.table_identifier(topic))
    boundary_before = table_boundary(table)
    data_dir = Path(table.metadata.location.removeprefix("file://")) / "data"
    orphan = data_dir / "orphan-left-by-a-crashed-writer.parquet"
    orphan.write_bytes(b"PAR1 not referenced by any snapshot")
    old = time.time() - 10 * 86_400
    os.utime(orphan, (old, old))

    # Expire everything expirable: only the snapshot holding the boundary must survive.
    strict = make_lake(maintenance={"snapshot_retention_hours": 0, "retain_last": 1})
    report = maintain_table(spark, strict, topic, report=_quiet)

    assert _data_files(lake, topic) == 40
    assert report["rewrite"]["rewritten_data_files"] == 200
    assert report["boundary_after"] == boundary_before
    # The append holding the boundary keeps its (small) files alive until the next append.
    assert report["expire"]["deleted_data_files"] == 0
    assert table_rows_pyiceberg(lake, topic) == rows_before
    table = load_catalog(lake).load_table(lake.table_identifier(topic))
    assert table_boundary(table) == boundary_before == {0: 500, 1: 500, 2: 500, 3: 500}
    assert not orphan.exists()
    assert any(path.endswith(orphan.name) for path in report["orphans"]["removed_files"])

    # After the next pipeline commit the old appends expire and the 200 small files go.
    produce(kafka_bootstrap, topic, _spread(4, 1, 4, start=2000))
    assert run_pipeline(spark, lake, topic, once=True, report=_quiet).records == 4
    again = maintain_table(spark, strict, topic, report=_quiet)
    assert again["expire"]["deleted_data_files"] == 200
    assert again["boundary_after"] == {0: 501, 1: 501, 2: 501, 3: 501}
    assert len(table_rows_pyiceberg(lake, topic)) == 2004
    # Compacted files keep rows sorted by offset.
    table = load_catalog(lake).load_table(lake.table_identifier(topic))
    for task in table.scan().plan_files():
        path = task.file.file_path.removeprefix("file:")
        offsets = pq.read_table(path, columns=["kafka_offset"]).column(0).to_pylist()
        assert offsets == sorted(offsets)


def test_maintenance_while_the_pipeline_runs(
    spark: Any,
    make_lake: Callable[..., ResolvedLake],
    lake: ResolvedLake,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
) -> None:
    topic = create_topic(2, prefix="live")
    produce(kafka_bootstrap, topic, _spread(2, 3, 600))
    running = make_lake(
        pipeline={"trigger_interval_seconds": 0.5, "max_offsets_per_trigger": 100},
    )
    run_pipeline(spark, running, topic, once=True, report=_quiet)  # creates the table

    stop = threading.Event()
    errors: list[BaseException] = []

    def copy() -> None:
        try:
            run_pipeline(spark, running, topic, once=False, report=_quiet, stop=stop)
        except BaseException as error:
            errors.append(error)

    pipeline = threading.Thread(target=copy)
    pipeline.start()
    try:
        for round_ in range(3):
            produce(kafka_bootstrap, topic, _spread(2, 3, 400, start=600 + 400 * round_))
            maintain_table(spark, lake, topic, report=_quiet, orphan_min_age_hours=1)
    finally:
        time.sleep(2)
        stop.set()
        pipeline.join(timeout=120)
    assert not errors, errors
    run_pipeline(spark, lake, topic, once=True, report=_quiet)
    truth = consume_all(kafka_bootstrap, topic, 2)
    rows = table_rows_pyiceberg(lake, topic)
    assert [(r["kafka_partition"], r["kafka_offset"]) for r in rows] == [
        (r.partition, r.record.offset) for r in truth
    ]
    table = load_catalog(lake).load_table(lake.table_identifier(topic))
    assert table_boundary(table) == {0: 900, 1: 900}
