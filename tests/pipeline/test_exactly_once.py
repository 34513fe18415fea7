"""Exactly once against real Kafka and Spark: transactions, re-runs with and without the
checkpoint, a topic whose log starts above offset 0, and the boundary in every snapshot."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bergstream.core.lake import ResolvedLake, load_catalog
from bergstream.core.typed.row_contract import BOUNDARY_PROPERTY, parse_boundary, table_boundary
from bergstream.devstack.stack import kafka_tool_command
from bergstream.pipeline.stream import run_pipeline
from tests.kits.lake import (
    Produced,
    consume_all,
    produce,
    records_of,
    table_rows_pyiceberg,
)

pytestmark = pytest.mark.slow


def _quiet(line: str) -> None:
    pass


def _records(partitions: int, count: int, tag: str) -> list[Produced]:
    return [
        Produced(i % partitions, f"k{i}".encode(), f"{tag}-{i}".encode(), (), None)
        for i in range(count)
    ]


def _snapshots(lake: ResolvedLake, topic: str) -> list[Any]:
    table = load_catalog(lake).load_table(lake.table_identifier(topic))
    return list(table.metadata.snapshots)


async def _transactions(bootstrap: str, topic: str, steps: list[tuple[str, list[Produced]]]):
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"tx-{topic}", enable_idempotence=True
    )
    await producer.start()
    try:
        for outcome, batch in steps:
            await producer.begin_transaction()
            for record in batch:
                await producer.send(
                    topic, key=record.key, value=record.value, partition=record.partition
                )
            await producer.flush()
            if outcome == "commit":
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()


def test_transactions_aborted_never_committed_always(
    spark: Any, lake: ResolvedLake, kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(2, prefix="tx")
    steps = [
        ("commit", _records(2, 40, "c1")),
        ("abort", _records(2, 30, "a1")),
        ("commit", _records(2, 20, "c2")),
        ("abort", _records(2, 10, "a2")),
    ]
    asyncio.run(_transactions(kafka_bootstrap, topic, steps))
    produce(kafka_bootstrap, topic, _records(2, 6, "plain"))
    truth = consume_all(kafka_bootstrap, topic, 2)
    assert len(truth) == 66

    run_pipeline(spark, lake, topic, once=True, report=_quiet)

    got = records_of(table_rows_pyiceberg(lake, topic))
    assert got == truth  # committed records with their offsets, gaps and all
    values = {r.record.value for r in got}
    assert not any(v.startswith((b"a1-", b"a2-")) for v in values if v)
    offsets = [r.record.offset for r in got if r.partition == 0]
    assert offsets != list(range(len(offsets)))  # aborted records and markers leave gaps
    boundary = table_boundary(load_catalog(lake).load_table(lake.table_identifier(topic)))
    ends = {p: max(r.record.offset for r in got if r.partition == p) + 1 for p in (0, 1)}
    assert all(boundary[p] >= ends[p] for p in ends)


def test_rerun_adds_nothing_with_or_without_checkpoint(
    spark: Any, lake: ResolvedLake, kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    topic = create_topic(3, prefix="rerun")
    produce(kafka_bootstrap, topic, _records(3, 300, "first"))
    first = run_pipeline(spark, lake, topic, once=True, report=_quiet)
    assert first.records == 300
    snapshots = _snapshots(lake, topic)
    assert len(snapshots) == first.batches

    again = run_pipeline(spark, lake, topic, once=True, report=_quiet)
    assert again.records == 0 and again.batches == 0
    shutil.rmtree(lake.checkpoint_dir / f"{lake.namespace}.{topic}")
    fresh = run_pipeline(spark, lake, topic, once=True, report=_quiet)
    assert fresh.records == 0 and fresh.batches == 0
    assert [s.snapshot_id for s in _snapshots(lake, topic)] == [s.snapshot_id for s in snapshots]

    # New records after a lost checkpoint: copied once, from the boundary on.
    produce(kafka_bootstrap, topic, _records(3, 90, "second"))
    shutil.rmtree(lake.checkpoint_dir / f"{lake.namespace}.{topic}")
    more = run_pipeline(spark, lake, topic, once=True, report=_quiet)
    assert more.records == 90
    assert records_of(table_rows_pyiceberg(lake, topic)) == consume_all(kafka_bootstrap, topic, 3)
    # Every pipeline snapshot carries a boundary covering all partitions written so far.
    for snapshot in _snapshots(lake, topic):
        boundary = parse_boundary(snapshot.summary.additional_properties[BOUNDARY_PROPERTY])
        assert set(boundary) == {0, 1, 2}
    assert more.boundary == {0: 130, 1: 130, 2: 130}


def test_topic_starting_above_offset_zero(
    spark: Any,
    lake: ResolvedLake,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = create_topic(2, prefix="logstart")
    produce(kafka_bootstrap, topic, _records(2, 100, "r"))
    spec = {"partitions": [{"topic": topic, "partition": 0, "offset": 30}], "version": 1}
    (tmp_path / "delete.json").write_text(json.dumps(spec))
    subprocess.run(
        kafka_tool_command(
            "delete-records",
            "--bootstrap-server",
            kafka_bootstrap,
            "--offset-json-file",
            str(tmp_path / "delete.json"),
        ),
        check=True,
        capture_output=True,
        timeout=120,
    )
    result = run_pipeline(spark, lake, topic, once=True, report=_quiet)
    rows = table_rows_pyiceberg(lake, topic)
    assert result.records == 70  # 20 left in partition 0, 50 in partition 1
    assert min(r["kafka_offset"] for r in rows if r["kafka_partition"] == 0) == 30
    assert records_of(rows) == consume_all(kafka_bootstrap, topic, 2)
    assert result.boundary == {0: 50, 1: 50}
