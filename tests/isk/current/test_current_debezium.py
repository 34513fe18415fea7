"""``current.<topic>`` of a debezium topic (Debezium change events as Kafka Connect's
JsonConverter writes them without schemas, read by the ``json`` codec): the source table's rows
with ``_op``, ``_source_ts`` and ``_source_position``, through the pipeline's state table and
the changes still only in Kafka."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.kits.isk_gateway import Gateway, produce, start_gateway, stop_gateway
from tests.kits.ksi_stack import lake_yaml, run_pipeline_once

pytestmark = pytest.mark.slow

RULES = """
codecs:
  topics:
    - match: "*"
      value: json
      key: json
tables:
  topics:
    - match: "*"
      mode: debezium
"""
BASE_MS = 1_700_000_000_000


@dataclass
class Source:
    """A source table as Debezium sees it: rows by id, and the change events it emitted."""

    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    lsn: int = 1000

    def _emit(self, op: str, key: int | None, before: Any, after: Any) -> None:
        self.lsn += 8
        value = {
            "before": before,
            "after": after,
            "source": {"version": "3.6.1.Final", "connector": "postgresql", "db": "shop",
                       "ts_ms": BASE_MS + self.lsn, "lsn": self.lsn},
            "op": op,
            "ts_ms": BASE_MS + self.lsn + 3,
        }  # fmt: skip
        self.events.append(
            {
                "key": None if key is None else json.dumps({"id": key}).encode(),
                "value": json.dumps(value).encode(),
            }
        )

    def upsert(self, key: int, name: str, amount: float) -> None:
        row = {"id": key, "name": name, "amount": amount}
        before = self.rows.get(key)
        self.rows[key] = row
        self._emit("u" if before else "c", key, before, row)

    def delete(self, key: int) -> None:
        before = self.rows.pop(key)
        self._emit("d", key, before, None)
        self.events.append({"key": json.dumps({"id": key}).encode(), "value": None})

    def truncate(self) -> None:
        self.rows.clear()
        self._emit("t", None, None, None)


def random_changes(source: Source, rng: random.Random, count: int) -> None:
    for i in range(count):
        key = rng.randrange(30)
        if key in source.rows and rng.random() < 0.3:
            source.delete(key)
        else:
            source.upsert(key, f"n{i}", round(rng.random() * 100, 2))


@dataclass
class Stage:
    gateway: Gateway
    topic: str
    source: Source
    kafka_bootstrap: str
    sent: int = 0

    def flush(self) -> None:
        records = self.source.events[self.sent :]
        produce(self.kafka_bootstrap, self.topic, [{"partition": 0, **r} for r in records])
        self.sent = len(self.source.events)

    def current(self) -> list[dict[str, Any]]:
        table = self.gateway.catalog().load_table(f"current.{self.topic}")
        return table.scan().to_arrow().to_pylist()


@pytest.fixture(scope="module")
def stage(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    workdir = tmp_path_factory.mktemp("isk-debezium")
    topic = new_topic(partitions=1)
    extra = lake_yaml(workdir / "home", kafka_bootstrap) + RULES
    gateway = start_gateway(kafka_bootstrap, workdir, chunk_records=40, extra=extra)
    stage = Stage(gateway, topic, Source(), kafka_bootstrap)
    try:
        yield stage
    finally:
        stop_gateway(gateway)


def source_rows(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    out = {r["id"]: {"id": r["id"], "name": r["name"], "amount": r["amount"]} for r in rows}
    assert len(out) == len(rows), "an id has two rows"
    return out


def test_state_follows_the_source_table(stage: Stage) -> None:
    rng = random.Random(3)
    random_changes(stage.source, rng, 120)
    stage.flush()
    rows = stage.current()
    assert source_rows(rows) == stage.source.rows
    row = rows[0]
    assert row["_op"] in ("c", "u")
    assert row["_source_position"].isdigit()
    assert isinstance(row["_source_ts"], dt.datetime)
    assert {"kafka_partition", "kafka_offset", "kafka_key", "key_id"} <= set(row)
    assert "before" not in row and "kafka_value" not in row


def test_pipeline_state_table_then_hot_changes(stage: Stage) -> None:
    summary = run_pipeline_once(stage.gateway.process.config_path, stage.topic)
    assert summary["records"] == stage.sent
    random_changes(stage.source, random.Random(4), 60)
    stage.flush()
    assert source_rows(stage.current()) == stage.source.rows


def test_truncate_empties_then_new_rows(stage: Stage) -> None:
    stage.source.truncate()
    stage.source.upsert(1, "after-truncate", 1.0)
    stage.flush()
    assert source_rows(stage.current()) == {1: {"id": 1, "name": "after-truncate", "amount": 1.0}}
    rejected = stage.gateway.catalog().load_table(f"rejected.{stage.topic}").scan().to_arrow()
    assert rejected.num_rows == 0  # tombstones after deletes are ignored, not rejected
