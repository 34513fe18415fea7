"""Real Kafka clients, through the proxy only: they never see a broker address."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support import require_binary

pytestmark = pytest.mark.slow

RECORDS = 10_000


def expected_records(tag: str, count: int = RECORDS) -> list[tuple[bytes, bytes, list]]:
    """(key, value, headers) of the records each client produces; headers include a duplicate
    key and a per-record value so reordering or loss would show."""
    return [
        (
            f"{tag}-key-{i % 97}".encode(),
            f"{tag} value {i} ".encode() + bytes(range(32, 32 + i % 60)),
            [("run", tag.encode()), ("n", str(i).encode()), ("dup", b"a"), ("dup", b"b")],
        )
        for i in range(count)
    ]


def create_topic_through_proxy(bootstrap: str, partitions: int = 3) -> str:
    name = f"clients-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[
        name
    ].result(timeout=30)
    return name


def proxy_ports(bootstrap: str) -> set[str]:
    host, port = bootstrap.rsplit(":", 1)
    return {f"{host}:{int(port) + i}" for i in range(4)}


def test_metadata_lists_only_proxy_addresses(run_proxy, kafka_bootstrap):
    proxy = run_proxy()
    topic = create_topic_through_proxy(proxy.bootstrap)
    metadata = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=20)
    brokers = {f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    assert brokers, "no brokers in metadata"
    assert brokers <= proxy_ports(proxy.bootstrap)
    assert kafka_bootstrap not in brokers
    assert len(metadata.topics[topic].partitions) == 3


def test_sigterm_stops_the_proxy_cleanly(run_proxy):
    import socket

    proxy = run_proxy()
    producer = Producer({"bootstrap.servers": proxy.bootstrap})
    producer.produce(create_topic_through_proxy(proxy.bootstrap), value=b"x")
    assert producer.flush(20) == 0
    assert proxy.stop() == 0, proxy.log()
    for address in proxy_ports(proxy.bootstrap):
        host, port = address.rsplit(":", 1)
        with socket.socket() as probe:
            assert probe.connect_ex((host, int(port))) != 0, f"{address} still accepts"


def test_confluent_kafka_round_trip(run_proxy):
    proxy = run_proxy()
    topic = create_topic_through_proxy(proxy.bootstrap)
    records = expected_records("confluent")
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 5, "acks": "all"})
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers)
        producer.poll(0)
    assert producer.flush(60) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got = []
    seen_brokers: set[str] = set()
    try:
        _deadline = time.monotonic() + 120
        while len(got) < RECORDS:
            assert time.monotonic() < _deadline, "records did not all arrive within 120 s"
            message = consumer.poll(5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append((message.key(), message.value(), list(message.headers() or [])))
        seen_brokers = {f"{b.host}:{b.port}" for b in consumer.list_topics(topic).brokers.values()}
    finally:
        consumer.close()
    assert sorted(got) == sorted(records)
    assert seen_brokers <= proxy_ports(proxy.bootstrap)


async def test_aiokafka_round_trip(run_proxy):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    proxy = run_proxy()
    topic = create_topic_through_proxy(proxy.bootstrap)
    records = expected_records("aiokafka")
    producer = AIOKafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        pending = [await producer.send(topic, key=k, value=v, headers=h) for k, v, h in records]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=proxy.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    got = []
    try:
        _deadline = time.monotonic() + 120
        while len(got) < RECORDS:
            assert time.monotonic() < _deadline, "records did not all arrive within 120 s"
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=2000), 30)
            for messages in batches.values():
                got.extend((m.key, m.value, list(m.headers)) for m in messages)
    finally:
        await consumer.stop()
    assert sorted(got) == sorted(records)


def test_kcat_round_trip(run_proxy):
    kcat = require_binary("kcat")
    proxy = run_proxy()
    topic = create_topic_through_proxy(proxy.bootstrap)
    lines = [f"key-{i % 50}\tkcat value {i}" for i in range(RECORDS)]
    subprocess.run(
        [
            kcat,
            "-b",
            proxy.bootstrap,
            "-P",
            "-t",
            topic,
            "-K",
            "\t",
            "-H",
            "origin=kcat",
            "-H",
            "dup=1",
            "-H",
            "dup=2",
        ],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=120,
    )
    out = subprocess.run(
        [
            kcat,
            "-b",
            proxy.bootstrap,
            "-C",
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%k\t%s\t%h\n",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()
    assert sorted(line.rsplit("\t", 1)[0] for line in out) == sorted(lines)
    assert {line.rsplit("\t", 1)[1] for line in out} == {"origin=kcat,dup=1,dup=2"}


def test_consumer_group_splits_commits_and_resumes(run_proxy):
    proxy = run_proxy()
    topic = create_topic_through_proxy(proxy.bootstrap)
    producer = Producer({"bootstrap.servers": proxy.bootstrap})
    for i in range(3000):
        producer.produce(topic, key=str(i).encode(), value=f"first {i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0

    group = f"group-{uuid.uuid4().hex[:8]}"

    def member() -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 500,
            }
        )
        consumer.subscribe([topic])
        return consumer

    members = [member(), member()]
    got: dict[int, list[bytes]] = {0: [], 1: []}
    assignments: dict[int, set[int]] = {0: set(), 1: set()}
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            for index, consumer in enumerate(members):
                messages = consumer.consume(num_messages=500, timeout=0.2)
                assignments[index] = {p.partition for p in consumer.assignment()}
                good = [m for m in messages if m.error() is None]
                got[index].extend(m.value() for m in good)
                if good:
                    consumer.commit(asynchronous=False)
            if len(got[0]) + len(got[1]) >= 3000 and all(assignments.values()):
                break
        assert assignments[0] and assignments[1], f"partitions not split: {assignments}"
        assert not assignments[0] & assignments[1]
        assert assignments[0] | assignments[1] == {0, 1, 2}
        assert sorted(got[0] + got[1]) == sorted(f"first {i}".encode() for i in range(3000))
    finally:
        for consumer in members:
            consumer.close()

    for i in range(300):
        producer.produce(topic, value=f"second {i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0
    resumed = member()
    after: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(after) < 300 and time.monotonic() < deadline:
            messages = resumed.consume(num_messages=500, timeout=0.5)
            after.extend(m.value() for m in messages if m.error() is None)
        # Anything past the 300 new records would be a re-read of committed ones.
        after.extend(
            m.value() for m in resumed.consume(num_messages=500, timeout=2) if m.error() is None
        )
    finally:
        resumed.close()
    assert sorted(after) == sorted(f"second {i}".encode() for i in range(300)), (
        "a restarted member must resume from the committed offsets, not re-read old records"
    )


def test_kafka_console_producer_and_consumer_round_trip(run_proxy):
    from bergstream.devstack.stack import kafka_tool_command

    proxy = run_proxy()
    topic = create_topic_through_proxy(proxy.bootstrap)
    lines = [f"n:{i},dup:a,dup:b\tkey-{i % 50}\tconsole value {i}" for i in range(RECORDS)]
    subprocess.run(
        kafka_tool_command(
            "console-producer",
            "--bootstrap-server",
            proxy.bootstrap,
            "--topic",
            topic,
            "--reader-property",
            "parse.key=true",
            "--reader-property",
            "parse.headers=true",
        ),
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=300,
        capture_output=True,
    )
    out = subprocess.run(
        kafka_tool_command(
            "console-consumer",
            "--bootstrap-server",
            proxy.bootstrap,
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            str(RECORDS),
            "--timeout-ms",
            "60000",
            "--formatter-property",
            "print.key=true",
            "--formatter-property",
            "print.headers=true",
        ),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.splitlines()
    assert sorted(out) == sorted(lines)
