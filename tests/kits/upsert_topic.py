"""The stage of the ``current.<topic>`` tests of an upsert topic (tests/isk/current and the
Trino tests): random changes of a few keys, half copied into the lake by the pipeline, served by
``bergstream run``'s ``isk`` service, and the state a dictionary replay of them leaves."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.kits.isk_gateway import Gateway, produce, start_gateway, stop_gateway
from tests.kits.ksi_stack import lake_yaml, run_pipeline_once

PARTITIONS = 3
KEYS = 80
TABLES = """
tables:
  topics:
    - match: "plain-*"
      mode: append
    - match: "*"
      mode: upsert
"""


def changes(rng: random.Random, count: int, tag: str) -> list[dict[str, Any]]:
    """Random updates and tombstones of keys that each stay in one partition."""
    out = []
    for i in range(count):
        key = rng.randrange(KEYS)
        value = None if rng.random() < 0.25 else f"{tag}-{i}".encode()
        out.append({"partition": key % PARTITIONS, "key": b"k%d" % key, "value": value})
    return out


def replay(records: list[dict[str, Any]]) -> dict[bytes, bytes]:
    """The state a dictionary replay of ``records`` leaves."""
    state: dict[bytes, bytes] = {}
    for record in records:
        if record.get("key") is None:
            continue
        if record["value"] is None:
            state.pop(record["key"], None)
        else:
            state[record["key"]] = record["value"]
    return state


@dataclass
class Stage:
    """The module's topic, its gateway and everything produced to it."""

    gateway: Gateway
    topic: str
    produced: list[dict[str, Any]]
    config: Path
    kafka_bootstrap: str
    append_topic: str

    def add(self, records: list[dict[str, Any]]) -> None:
        produce(self.kafka_bootstrap, self.topic, records)
        self.produced += records


def run_upsert_stage(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    """The body of a module fixture: an upsert topic of 401 records copied by the pipeline (one
    without a key) and 300 more only in Kafka, and a ``bergstream run`` serving it as ISK with
    the lake attached; ``append_topic`` matches ``plain-*`` (an append topic)."""
    rng = random.Random(30)
    workdir = tmp_path_factory.mktemp("isk-current")
    topic = new_topic(partitions=PARTITIONS)
    extra = lake_yaml(workdir / "home", kafka_bootstrap) + TABLES
    gateway = start_gateway(kafka_bootstrap, workdir, chunk_records=50, extra=extra)
    append_topic = new_topic(partitions=1, prefix="plain")
    stage = Stage(gateway, topic, [], workdir / "isk.yaml", kafka_bootstrap, append_topic)
    try:
        stage.add(changes(rng, 400, "cold"))
        stage.add([{"partition": 0, "key": None, "value": b"no key"}])
        summary = run_pipeline_once(workdir / "isk.yaml", topic)
        assert summary["records"] == 401, summary
        stage.add(changes(rng, 300, "hot"))  # only in Kafka
        yield stage
    finally:
        stop_gateway(gateway)
