"""KSI on the secured three-broker stack (SASL_SSL, SCRAM-SHA-512, the standard authorizer):
the pipeline copies a topic as the admin user, Kafka deletes its first records, and clients
authenticate through the proxy with their own credentials. The admin reads every record from
offset 0; the user without rights is refused by the broker, for cold offsets exactly as for hot
ones, and nothing else goes down."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from bergstream.core.api import KafkaClientSettings, open_kafka_connection
from tests.kits.ksi_stack import (
    Seen,
    fetch_partition,
    make_records,
    run_pipeline_once,
    seen_from_confluent,
)
from tests.support import (
    ProxyProcess,
    admin_librdkafka,
    secure_lake_yaml,
    start_bergstream_run,
    write_proxy_config,
)

pytestmark = pytest.mark.slow

PARTITIONS = 3
RECORDS = 3_000
DELETED_BELOW = 400
REFUSED = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED}


def _props(path: str) -> dict[str, str]:
    lines = Path(path).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


@dataclass
class World:
    topic: str
    proxy: ProxyProcess
    env: dict[str, str]
    expected: list[Seen]

    def client(self, user: str = "admin", **extra: Any) -> dict[str, Any]:
        """confluent-kafka settings of ``user`` toward the proxy (SASL over plain TCP)."""
        props = _props(
            self.env[
                "BERGSTREAM_KAFKA_CONFIG" if user == "admin" else "BERGSTREAM_KAFKA_CONFIG_NOACCESS"
            ]
        )
        return {
            "bootstrap.servers": self.proxy.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": props["sasl.mechanisms"],
            "sasl.username": props["sasl.username"],
            "sasl.password": props["sasl.password"],
            **extra,
        }


def _produce(env: dict[str, str], topic: str) -> list[Seen]:
    records = make_records(RECORDS, PARTITIONS)
    producer = Producer({**admin_librdkafka(env), "enable.idempotence": True, "linger.ms": 5})
    offsets: list[tuple[int, int]] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        offsets.append((message.partition(), message.offset()))

    for r in records:
        producer.produce(
            topic,
            key=r.key,
            value=r.value,
            partition=r.partition,
            timestamp=r.timestamp,
            headers=list(r.headers),
            on_delivery=delivered,
        )
    assert producer.flush(60) == 0
    # One partition's deliveries arrive in order, so the n-th of a partition is its n-th record.
    by_partition: dict[int, list[int]] = {}
    for partition, offset in offsets:
        by_partition.setdefault(partition, []).append(offset)
    seen = []
    taken = dict.fromkeys(by_partition, 0)
    for r in records:
        offset = by_partition[r.partition][taken[r.partition]]
        taken[r.partition] += 1
        seen.append((r.partition, offset, r.timestamp, r.key, r.value, r.headers))
    return seen


@pytest.fixture(scope="module")
def world(
    secure_stack_env: dict[str, str],
    new_secure_topic: Callable[..., str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    from bergstream.devstack.stack.ports import free_port_block

    home = tmp_path_factory.mktemp("ksi-secure")
    topic = new_secure_topic(
        partitions=PARTITIONS, **{"message.timestamp.after.max.ms": "9223372036854775807"}
    )
    expected = _produce(secure_stack_env, topic)
    lake = secure_lake_yaml(home)
    pipeline_config = home / "lake.yaml"
    pipeline_config.write_text(lake)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in secure_stack_env.items():
            patch.setenv(name, value)
        summary = run_pipeline_once(pipeline_config, topic)
    assert summary, summary
    admin = AdminClient(admin_librdkafka(secure_stack_env))
    futures = admin.delete_records(
        [TopicPartition(topic, p, DELETED_BELOW) for p in range(PARTITIONS)]
    )
    for future in futures.values():
        assert future.result(timeout=60).low_watermark == DELETED_BELOW
    port = free_port_block(5)
    config = write_proxy_config(
        home / "ksi.yaml", "ksi", port, f'[{{type: ksi, config: {{topics: ["{topic}"]}}}}]', lake
    )
    proxy = start_bergstream_run(config, f"127.0.0.1:{port}", secure_stack_env, "the ksi proxy")
    try:
        yield World(topic, proxy, secure_stack_env, expected)
    finally:
        proxy.stop()


def test_the_admin_reads_every_record_from_offset_zero(world: World) -> None:
    consumer = Consumer(
        world.client(**{"group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    )
    consumer.assign([TopicPartition(world.topic, p, 0) for p in range(PARTITIONS)])
    got: list[Seen] = []
    try:
        while len(got) < RECORDS:
            message = consumer.poll(30)
            if message is None:
                per_partition = {q: sum(1 for g in got if g[0] == q) for q in range(PARTITIONS)}
                pytest.fail(f"stalled after {len(got)} records: {per_partition} per partition")
            if message.error():
                raise KafkaException(message.error())
            got.append(seen_from_confluent(message))
    finally:
        consumer.close()
    assert sorted(got) == sorted(world.expected)


async def _fetch_error(world: World, user: str, offset: int, partition: int = 0) -> tuple[int, int]:
    """Fetch ``partition`` at ``offset`` as ``user`` on a raw SASL connection to the proxy port
    of its leader: (the partition's error code, bytes of records)."""
    props = _props(
        world.env[
            "BERGSTREAM_KAFKA_CONFIG" if user == "admin" else "BERGSTREAM_KAFKA_CONFIG_NOACCESS"
        ]
    )
    settings = KafkaClientSettings.model_validate(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": props["sasl.mechanisms"],
            "sasl.username": props["sasl.username"],
            "sasl.password": props["sasl.password"],
        }
    )
    metadata = AdminClient(world.client()).list_topics(world.topic, timeout=30)
    leader = metadata.topics[world.topic].partitions[partition].leader
    broker = metadata.brokers[leader]
    connection = await open_kafka_connection(broker.host, broker.port, settings)
    try:
        return await fetch_partition(connection, world.topic, partition, offset)
    finally:
        await connection.close()


@pytest.mark.parametrize("offset", [0, DELETED_BELOW + 10], ids=["cold", "hot"])
@pytest.mark.parametrize("partition", range(PARTITIONS))
def test_the_broker_decides_who_reads_cold_offsets(
    world: World, offset: int, partition: int
) -> None:
    code, size = asyncio.run(_fetch_error(world, "admin", offset, partition))
    assert (code, size > 0) == (0, True)
    code, size = asyncio.run(_fetch_error(world, "noaccess", offset, partition))
    assert code == ErrorCode.topic_authorization_failed
    assert size == 0


def test_a_consumer_without_rights_gets_kafka_errors_and_the_proxy_stays_up(world: World) -> None:
    consumer = Consumer(
        world.client(
            "noaccess", **{"group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
        )
    )
    consumer.assign([TopicPartition(world.topic, p, 0) for p in range(PARTITIONS)])
    codes: set[int] = set()
    try:
        for _ in range(20):
            message = consumer.poll(1)
            if message is None:
                continue
            assert message.error(), "the user without rights read a record through KSI"
            codes.add(message.error().code())
            if codes & REFUSED:
                break
    finally:
        consumer.close()
    # librdkafka reports the first refusal it meets: the group's or the topic's (the topic's
    # for cold offsets is checked byte for byte above).
    assert codes & REFUSED, codes
    assert world.proxy.process.poll() is None
    # Still serving the admin, cold offsets included.
    assert asyncio.run(_fetch_error(world, "admin", 0))[0] == 0
