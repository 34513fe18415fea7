"""A compacted topic with random keys, updates and tombstones: ``current.<topic>`` equals a
replay of everything produced into a dictionary (hypothesis), from Kafka alone, then through
the pipeline's state table and Kafka, while Kafka's log cleaner compacts the topic underneath
(segments roll every second) and after it has."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kits.isk_gateway import Gateway, produce, start_gateway, stop_gateway
from tests.kits.ksi_stack import lake_yaml, run_pipeline_once
from tests.kits.upsert_topic import TABLES, replay

pytestmark = pytest.mark.slow

PARTITIONS = 2
#: Settings that make the log cleaner compact the topic within seconds of a segment rolling.
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}

changes = st.lists(
    st.tuples(
        st.integers(0, 25),
        st.one_of(st.none(), st.binary(min_size=0, max_size=12)),
    ),
    min_size=1,
    max_size=30,
)


@dataclass
class Stage:
    gateway: Gateway
    topic: str
    kafka_bootstrap: str
    produced: list[dict[str, Any]]

    def send(self, records: list[tuple[int, bytes | None]]) -> None:
        out = [
            {"partition": key % PARTITIONS, "key": b"key-%d" % key, "value": value}
            for key, value in records
        ]
        produce(self.kafka_bootstrap, self.topic, out)
        self.produced += out

    def state(self) -> dict[bytes, bytes]:
        table = self.gateway.catalog().load_table(f"current.{self.topic}")
        rows = table.scan().to_arrow().to_pylist()
        state = {bytes(r["kafka_key"]): bytes(r["kafka_value"]) for r in rows}
        assert len(state) == len(rows), "a key has two rows"
        return state


@pytest.fixture(scope="module")
def stage(
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stage]:
    workdir = tmp_path_factory.mktemp("isk-compacted")
    topic = new_topic(partitions=PARTITIONS, **COMPACTED)
    extra = lake_yaml(workdir / "home", kafka_bootstrap) + TABLES
    gateway = start_gateway(kafka_bootstrap, workdir, chunk_records=20, extra=extra)
    try:
        yield Stage(gateway, topic, kafka_bootstrap, [])
    finally:
        stop_gateway(gateway)


def log_records(stage: Stage) -> int:
    """How many records Kafka's log holds now (a compacted log holds fewer)."""
    from confluent_kafka import Consumer, TopicPartition

    settings = {
        "bootstrap.servers": stage.kafka_bootstrap,
        "group.id": f"g-{time.time_ns()}",
        "enable.auto.commit": False,
    }
    consumer = Consumer(settings)
    try:
        partitions = [TopicPartition(stage.topic, p, 0) for p in range(PARTITIONS)]
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(stage.topic, p))[1]
            for p in range(PARTITIONS)
        }
        consumer.assign(partitions)
        seen, done = 0, set()
        deadline = time.monotonic() + 60
        while len(done) < PARTITIONS and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is None or message.error():
                done |= {p for p in range(PARTITIONS) if ends[p] == 0}
                continue
            seen += 1
            if message.offset() + 1 >= ends[message.partition()]:
                done.add(message.partition())
        return seen
    finally:
        consumer.close()


def test_state_equals_replay_before_and_after_compaction(stage: Stage) -> None:
    @settings(
        max_examples=50,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(records=changes)
    def example(records: list[tuple[int, bytes | None]]) -> None:
        stage.send(records)
        assert stage.state() == replay(stage.produced)

    example()
    # The cleaner may have compacted the log already: the pipeline copies what Kafka holds.
    summary = run_pipeline_once(stage.gateway.process.config_path, stage.topic)
    assert 0 < summary["records"] <= len(stage.produced)
    assert stage.state() == replay(stage.produced)
    example()  # more changes over the state table the pipeline keeps
    # Roll the segments (a record after segment.ms) and let the cleaner compact them.
    deadline = time.monotonic() + 180
    while log_records(stage) >= len(stage.produced) and time.monotonic() < deadline:
        time.sleep(2)
        stage.send([(0, b"roll")])
    compacted = log_records(stage)
    assert compacted < len(stage.produced), "the log cleaner did not compact the topic"
    assert stage.state() == replay(stage.produced)
