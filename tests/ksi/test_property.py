"""Property: any records -> Kafka -> pipeline -> DeleteRecords -> consumed through KSI from
offset 0 are the records produced, field for field."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.kits.ksi_stack import (
    Outgoing,
    Seen,
    delete_records_below,
    lake_yaml,
    produce,
    run_pipeline_once,
    seen_from_aiokafka,
    start_ksi_proxy,
)
from tests.support import ProxyProcess

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("BERGSTREAM_KSI_PROPERTY_EXAMPLES", "4"))
PARTITIONS = 2
FAR_FUTURE_MS = 253_402_300_799_999
TOPIC_CONFIG = {
    "retention.ms": "-1",
    "message.timestamp.after.max.ms": "9223372036854775807",
    "max.message.bytes": "4194304",
}


@dataclass
class Setup:
    """Topics made in advance (the proxy's config names its topics) and the proxy."""

    home: Path
    topics: list[str]
    proxy: ProxyProcess
    bootstrap: str


@pytest.fixture(scope="module")
def setup(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    from confluent_kafka.admin import AdminClient, NewTopic

    home = tmp_path_factory.mktemp("ksi-property")
    topics = [f"ksi-prop-{uuid.uuid4().hex[:8]}" for _ in range(EXAMPLES + 2)]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(t, num_partitions=PARTITIONS, replication_factor=1, config=TOPIC_CONFIG)
            for t in topics
        ]
    )
    for future in futures.values():
        future.result(timeout=30)
    lake = lake_yaml(home, kafka_bootstrap)
    (home / "lake.yaml").write_text(lake)
    proxy = start_ksi_proxy(home, kafka_bootstrap, topics, lake)
    try:
        yield Setup(home, topics, proxy, kafka_bootstrap)
    finally:
        proxy.stop()


headers = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "ключ", ""]) | st.text(max_size=8),
        st.none() | st.binary(max_size=32),
    ),
    max_size=6,
).map(tuple)

outgoing = st.builds(
    Outgoing,
    partition=st.integers(0, PARTITIONS - 1),
    timestamp=st.sampled_from([0, 1, FAR_FUTURE_MS]) | st.integers(0, FAR_FUTURE_MS),
    key=st.none() | st.just(b"") | st.binary(max_size=64),
    value=st.none() | st.just(b"") | st.binary(max_size=2000),
    headers=headers,
).filter(lambda r: r.key is not None or r.value is not None)


async def _consume(bootstrap: str, topic: str, count: int) -> list[Seen]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        got: list[Seen] = []
        deadline = time.monotonic() + 120
        while len(got) < count and time.monotonic() < deadline:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(seen_from_aiokafka(m) for m in messages)
        return got
    finally:
        await consumer.stop()


@pytest.mark.timeout(1800)
def test_records_come_back_through_ksi_as_produced(setup: Setup) -> None:
    topics = iter(setup.topics)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        phases=(Phase.explicit, Phase.generate),
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(records=st.lists(outgoing, min_size=1, max_size=60), cut=st.floats(0, 1))
    def check(records: list[Outgoing], cut: float) -> None:
        topic = next(topics)
        sent = produce(setup.bootstrap, topic, records)
        summary = run_pipeline_once(setup.home / "lake.yaml", topic)
        assert summary["records"] == len(records)
        ends = {p: 1 + max((r[1] for r in sent if r[0] == p), default=-1) for p in range(2)}
        below = int(min(ends.values()) * cut)
        if below:
            delete_records_below(setup.bootstrap, topic, PARTITIONS, below)
        got = asyncio.run(_consume(setup.proxy.bootstrap, topic, len(sent)))
        key = lambda r: (r[0], r[1])  # noqa: E731
        assert sorted(got, key=key) == sorted(sent, key=key)

    check()
