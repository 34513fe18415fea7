"""The stage of the ``merged`` tests (tests/isk/merged and the Trino tests): one topic, half of it
copied into the coldset by the pipeline and the oldest part deleted from Kafka, served by
``bergstream run``'s ``isk`` service; the records it holds, one every 11 minutes (they span
days)."""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.kits.isk_gateway import Gateway, produce, start_gateway
from tests.kits.ksi_stack import delete_records_below, lake_yaml, run_pipeline_once
from tests.support import consume_rows, sort_rows

PARTITIONS = 2
COLD = 30  # records per partition the pipeline copies
DELETED = 20  # records per partition then deleted from Kafka (below the boundary)
HOT = 20  # records per partition produced after the pipeline ran
START = dt.datetime(2024, 3, 1, 20, 0, tzinfo=dt.UTC)


def records(first: int, count: int) -> list[dict[str, Any]]:
    """``count`` records per partition, one every 11 minutes from ``first``: they span days."""
    out = []
    for i in range(first, first + count):
        for partition in range(PARTITIONS):
            stamp = START + dt.timedelta(minutes=11 * i)
            out.append(
                {
                    "partition": partition,
                    "key": None if i % 4 == 0 else b"k%d" % i,
                    "value": None if i % 9 == 0 else b"value-%d-%d" % (partition, i),
                    "headers": [("h", b"%d" % i), ("h", None)][: i % 3] or None,
                    "timestamp": int(stamp.timestamp() * 1000),
                }
            )
    return out


@dataclass
class Stage:
    """The module's topic, its gateway, and every record it ever held, as rows."""

    gateway: Gateway
    topic: str
    all_rows: list[dict[str, Any]]
    config: Path


def run_merged_stage(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    """The body of a module fixture: ``COLD`` records per partition copied by the pipeline, ``HOT``
    more produced after it, the first ``DELETED`` deleted from Kafka, and a ``bergstream run``
    serving the topic as ISK with the lake attached."""
    workdir = tmp_path_factory.mktemp("isk-merged")
    topic = new_topic(partitions=PARTITIONS)
    produce(kafka_bootstrap, topic, records(0, COLD))
    lake = lake_yaml(workdir / "home", kafka_bootstrap)
    gateway = start_gateway(kafka_bootstrap, workdir, chunk_records=7, extra=lake)
    try:
        summary = run_pipeline_once(workdir / "isk.yaml", topic)
        assert summary, summary
        produce(kafka_bootstrap, topic, records(COLD, HOT))
        all_rows = consume_rows(kafka_bootstrap, topic, PARTITIONS * (COLD + HOT))
        delete_records_below(kafka_bootstrap, topic, PARTITIONS, DELETED)
        yield Stage(gateway, topic, all_rows, workdir / "isk.yaml")
    finally:
        code = gateway.process.stop()
        print(gateway.process.log()[-20000:], file=sys.stderr)  # shown when a test failed
        assert code == 0, f"bergstream run exited with {code}:\n{gateway.process.log()}"


def pyiceberg_rows(stage: Stage, namespace: str) -> list[dict[str, Any]]:
    """The rows of ``namespace.<topic>`` read by PyIceberg, in (partition, offset) order."""
    table = stage.gateway.catalog().load_table(f"{namespace}.{stage.topic}")
    return sort_rows(table.scan().to_arrow().to_pylist())
