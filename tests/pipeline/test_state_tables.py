"""The state tables of upsert topics, against real Kafka and Spark: the pipeline applies each
micro-batch's last change per key with position deletes, exactly once, and the table read back
(by PyIceberg and Spark, both applying the deletes) equals a replay of the topic."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from bergstream.core.lake import load_catalog
from bergstream.core.table_modes import TableModeRule
from bergstream.core.typed.row_contract import table_boundary
from bergstream.pipeline.settings import PipelineLake
from bergstream.pipeline.stream import run_pipeline
from tests.kits.lake import Produced, produce

pytestmark = pytest.mark.slow

UPSERT = TableModeRule(match="*", mode="upsert")


def _quiet(line: str) -> None:
    pass


def _changes(
    rng: random.Random, partitions: int, keys: int, count: int, tag: str
) -> list[Produced]:
    """Random upserts and tombstones; a key always goes to the partition its number gives."""
    out = []
    for i in range(count):
        key = rng.randrange(keys)
        value = None if rng.random() < 0.2 else f"{tag}-{i}".encode()
        out.append(Produced(key % partitions, f"k{key}".encode(), value, (), None))
    return out


def _replay(records: list[Produced]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for record in records:
        assert record.key is not None
        if record.value is None:
            state.pop(record.key, None)
        else:
            state[record.key] = record.value
    return state


def _state_rows(lake: PipelineLake, topic: str) -> list[dict[str, Any]]:
    table = load_catalog(lake).load_table((lake.current_namespace, topic))
    return table.scan().to_arrow().to_pylist()


def _delete_files(lake: PipelineLake, topic: str) -> int:
    table = load_catalog(lake).load_table((lake.current_namespace, topic))
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    return int(snapshot.summary.additional_properties.get("total-delete-files", 0))


def test_upsert_state_equals_replay_and_holds_deletes(
    spark: Any,
    lake: PipelineLake,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
) -> None:
    rng = random.Random(7)
    topic = create_topic(3, prefix="upsert")
    produced: list[Produced] = []
    for round_number in range(3):
        batch = _changes(rng, 3, 60, 300, f"r{round_number}")
        # records with a null key are rejected, never applied
        batch.append(Produced(1, None, b"keyless", (), None))
        produce(kafka_bootstrap, topic, batch)
        produced += batch
        run_pipeline(spark, lake, topic, once=True, report=_quiet, mode=UPSERT)
        rows = _state_rows(lake, topic)
        expected = _replay([p for p in produced if p.key is not None])
        assert {r["kafka_key"]: r["kafka_value"] for r in rows} == expected
        assert len(rows) == len(expected)  # no key twice
        log = load_catalog(lake).load_table(lake.table_identifier(topic))
        state = load_catalog(lake).load_table((lake.current_namespace, topic))
        assert table_boundary(state) == table_boundary(log)
    assert _delete_files(lake, topic) >= 1
    rejected = load_catalog(lake).load_table((lake.rejected_namespace, topic))
    reasons = rejected.scan().to_arrow().to_pylist()
    assert [r["kafka_value"] for r in reasons] == [b"keyless"] * 3
    assert all(r["reason"].startswith("no key") for r in reasons)
    # Spark reads the position deletes too
    spark_rows = spark.table(lake.spark_table_name(topic, lake.current_namespace)).collect()
    assert {bytes(r["kafka_key"]): bytes(r["kafka_value"]) for r in spark_rows} == expected


def test_maintain_folds_deletes_and_describe_tells_them(
    spark: Any,
    lake: PipelineLake,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
) -> None:
    from bergstream.core.table_modes import TableMode
    from bergstream.pipeline.describe import describe_table
    from bergstream.pipeline.maintain import maintain_table

    rng = random.Random(11)
    topic = create_topic(2, prefix="upsert-maintain")
    produced: list[Produced] = []
    for round_number in range(3):
        batch = _changes(rng, 2, 40, 200, f"m{round_number}")
        produce(kafka_bootstrap, topic, batch)
        produced += batch
        run_pipeline(spark, lake, topic, once=True, report=_quiet, mode=UPSERT)
    expected = _replay(produced)
    described = describe_table(lake, topic, TableMode.UPSERT)
    assert described["mode"] == "upsert"
    assert described["state"]["rows"] == len(expected)
    assert described["state"]["delete_files"] >= 2
    report = maintain_table(spark, lake, topic, report=_quiet)
    assert report["state"]["deletes_before"]["delete_files"] >= 2
    assert report["state"]["deletes_after"]["delete_files"] == 0
    assert report["state"]["deletes_after"]["rows"] == len(expected)
    rows = _state_rows(lake, topic)
    assert {r["kafka_key"]: r["kafka_value"] for r in rows} == expected
    after = describe_table(lake, topic, TableMode.UPSERT)
    assert after["state"]["delete_files"] == 0 and after["state"]["rows"] == len(expected)
    # the pipeline goes on from the compacted table: its index is read again
    batch = _changes(rng, 2, 40, 100, "after")
    produce(kafka_bootstrap, topic, batch)
    produced += batch
    run_pipeline(spark, lake, topic, once=True, report=_quiet, mode=UPSERT)
    rows = _state_rows(lake, topic)
    assert {r["kafka_key"]: r["kafka_value"] for r in rows} == _replay(produced)
    assert len(rows) == len(_replay(produced))
