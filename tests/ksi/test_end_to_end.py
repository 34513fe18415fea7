"""KSI end to end on the real stack: 30,000 records in 3 partitions, copied by the real
pipeline, the first 8,000 of each partition deleted in Kafka; real clients read through the
proxy from offset 0 and get every record exactly once, byte for byte. A second proxy, whose ksi
filter has no ``topics`` and which started before the topic had a table, serves it too."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bergstream.devstack.stack import kafka_tool_command
from tests.kits.ksi_stack import (
    Seen,
    delete_records_below,
    lake_yaml,
    make_records,
    produce,
    run_pipeline_once,
    seen_from_aiokafka,
    seen_from_confluent,
    start_ksi_proxy,
)
from tests.support import ProxyProcess, require_binary

pytestmark = pytest.mark.slow

PARTITIONS = 3
RECORDS = 30_000
DELETED_BELOW = 8_000
TOPIC_CONFIG = {
    "retention.ms": "-1",
    "message.timestamp.after.max.ms": "9223372036854775807",
}


@dataclass
class World:
    """The topic, its ground truth and the proxy serving it."""

    topic: str
    proxy: ProxyProcess
    kafka_bootstrap: str
    home: Path
    lake: str
    expected: list[Seen] = field(default_factory=list)
    next_index: int = RECORDS
    #: A ksi filter without ``topics``, started before the topic had a table.
    default_proxy: ProxyProcess | None = None

    def sorted_expected(self) -> list[Seen]:
        return sorted(self.expected, key=lambda r: (r[0], r[1]))


@pytest.fixture(scope="module")
def world(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from confluent_kafka.admin import AdminClient, NewTopic

    home = tmp_path_factory.mktemp("ksi-e2e")
    topic = f"ksi-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics(
        [NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1, config=TOPIC_CONFIG)]
    )[topic].result(timeout=30)
    expected = produce(kafka_bootstrap, topic, make_records(RECORDS, PARTITIONS))
    lake = lake_yaml(home, kafka_bootstrap)
    default_proxy = start_ksi_proxy(home, kafka_bootstrap, None, lake)
    try:
        # Read through it while the topic has no table: Kafka serves it, and KSI has listed
        # the (still missing) namespace before the pipeline creates the table.
        early = World(topic, default_proxy, kafka_bootstrap, home, lake, expected)
        assert len(_confluent_read(early, f"early-{uuid.uuid4().hex[:8]}", limit=50)) == 50
        assert "serving topic" not in default_proxy.log()
        config = home / "lake.yaml"
        config.write_text(lake)
        summary = run_pipeline_once(config, topic)
        assert summary["records"] == RECORDS, summary
        delete_records_below(kafka_bootstrap, topic, PARTITIONS, DELETED_BELOW)
        proxy = start_ksi_proxy(home, kafka_bootstrap, [topic], lake)
        try:
            yield World(topic, proxy, kafka_bootstrap, home, lake, expected, RECORDS, default_proxy)
        finally:
            proxy.stop()
    finally:
        default_proxy.stop()


def _produce_more(world: World, count: int) -> None:
    records = make_records(count, PARTITIONS, start=world.next_index)
    world.next_index += count
    world.expected.extend(produce(world.proxy.bootstrap, world.topic, records))


async def _aiokafka_read_all(world: World, produce_midway: int) -> list[Seen]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=world.proxy.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(world.topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        got: list[Seen] = []
        produced = False
        deadline = time.monotonic() + 300
        while len(got) < len(world.expected) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000)
            for messages in batches.values():
                got.extend(seen_from_aiokafka(m) for m in messages)
            if not produced and got:
                await asyncio.to_thread(_produce_more, world, produce_midway)
                produced = True
        return got
    finally:
        await consumer.stop()


def _kafka_log_starts(world: World) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": world.kafka_bootstrap, "group.id": "probe"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(world.topic, p), timeout=30)[0]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def test_aiokafka_reads_every_record_from_offset_zero(world: World) -> None:
    assert _kafka_log_starts(world) == dict.fromkeys(range(PARTITIONS), DELETED_BELOW)
    got = asyncio.run(_aiokafka_read_all(world, produce_midway=300))
    assert len(got) == len(world.expected) == RECORDS + 300
    assert sorted(got, key=lambda r: (r[0], r[1])) == world.sorted_expected()
    firsts = {p: min(r[1] for r in got if r[0] == p) for p in range(PARTITIONS)}
    assert firsts == dict.fromkeys(range(PARTITIONS), 0)


def _confluent_read(world: World, group: str, limit: int | None = None) -> list[Seen]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": world.proxy.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([world.topic])
    got: list[Seen] = []
    want = len(world.expected) if limit is None else limit
    deadline = time.monotonic() + 300
    try:
        while len(got) < want and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(seen_from_confluent(message))
    finally:
        consumer.close()
    return got


def test_confluent_kafka_reads_every_record_from_offset_zero(world: World) -> None:
    got = _confluent_read(world, f"g-{uuid.uuid4().hex[:8]}")
    assert sorted(got, key=lambda r: (r[0], r[1])) == world.sorted_expected()


def test_kcat_reads_every_record_from_offset_zero(world: World) -> None:
    kcat = require_binary("kcat")
    want = world.sorted_expected()
    done = subprocess.run(
        [
            kcat,
            "-b",
            world.proxy.bootstrap,
            "-C",
            "-t",
            world.topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%p|%o|%T|%K|%k|%S|%s\\n",
        ],
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    lines = done.stdout.decode().splitlines()
    got = sorted((tuple(line.split("|")) for line in lines), key=lambda f: (int(f[0]), int(f[1])))
    expected = [
        (
            str(p),
            str(o),
            str(t),
            str(-1 if k is None else len(k)),
            (k or b"").decode(),
            str(-1 if v is None else len(v)),
            (v or b"").decode(),
        )
        for p, o, t, k, v, _ in want
    ]
    assert got == expected


def test_console_consumer_reads_every_record_from_offset_zero(world: World) -> None:
    want = world.sorted_expected()
    command = kafka_tool_command(
        "console-consumer",
        "--bootstrap-server",
        world.proxy.bootstrap,
        "--topic",
        world.topic,
        "--from-beginning",
        "--max-messages",
        str(len(want)),
        "--timeout-ms",
        "120000",
        "--formatter-property",
        "print.partition=true",
        "--formatter-property",
        "print.offset=true",
        "--formatter-property",
        "print.timestamp=true",
        "--formatter-property",
        "print.key=true",
        "--formatter-property",
        "key.separator=|",
        "--formatter-property",
        "null.literal=<null>",
    )
    done = subprocess.run(command, capture_output=True, timeout=400)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    lines = done.stdout.decode().splitlines()
    assert len(lines) == len(want)
    got = sorted(
        (tuple(re.split(r"[|\t]", line)) for line in lines),
        key=lambda f: (int(f[1].split(":")[1]), int(f[2].split(":")[1])),
    )
    expected = [
        (
            f"CreateTime:{t}",
            f"Partition:{p}",
            f"Offset:{o}",
            "<null>" if k is None else k.decode(),
            "<null>" if v is None else v.decode(),
        )
        for p, o, t, k, v, _ in want
    ]
    assert got == expected


def test_a_group_commits_at_a_cold_offset_and_resumes_there(world: World) -> None:
    from confluent_kafka import Consumer, TopicPartition

    group = f"resume-{uuid.uuid4().hex[:8]}"
    first = _confluent_read(world, group, limit=3000)
    commit_at = {
        p: max((r[1] for r in first if r[0] == p), default=999) + 1 for p in range(PARTITIONS)
    }
    assert all(0 < o < DELETED_BELOW for o in commit_at.values())  # cold offsets
    consumer = Consumer({"bootstrap.servers": world.proxy.bootstrap, "group.id": group})
    consumer.commit(
        offsets=[TopicPartition(world.topic, p, o) for p, o in commit_at.items()],
        asynchronous=False,
    )
    consumer.close()
    resumed = _confluent_read(world, group, limit=len(world.expected) - sum(commit_at.values()))
    firsts = {p: min(r[1] for r in resumed if r[0] == p) for p in range(PARTITIONS)}
    assert firsts == commit_at
    want = [r for r in world.sorted_expected() if r[1] >= commit_at[r[0]]]
    assert sorted(resumed, key=lambda r: (r[0], r[1])) == want


async def _offset_for_time(world: World, partition: int, timestamp: int) -> tuple[int, Seen]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=world.proxy.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(world.topic, partition)
        consumer.assign([tp])
        found = await consumer.offsets_for_times({tp: timestamp})
        answer = found[tp]
        assert answer is not None
        consumer.seek(tp, answer.offset)
        message = await asyncio.wait_for(consumer.getone(), 60)
        return answer.offset, seen_from_aiokafka(message)
    finally:
        await consumer.stop()


def test_a_filter_without_topics_serves_a_table_created_after_it_started(world: World) -> None:
    assert world.default_proxy is not None
    served = World(world.topic, world.default_proxy, world.kafka_bootstrap, world.home, world.lake)
    served.expected = list(world.expected)
    got = _confluent_read(served, f"g-{uuid.uuid4().hex[:8]}")  # EARLIEST, then Fetch
    assert sorted(got, key=lambda r: (r[0], r[1])) == served.sorted_expected()
    firsts = {p: min(r[1] for r in got if r[0] == p) for p in range(PARTITIONS)}
    assert firsts == dict.fromkeys(range(PARTITIONS), 0)  # cold offsets, below Kafka's log start
    assert f"serving topic {world.topic}" in world.default_proxy.log()


def test_seeking_to_a_cold_timestamp_lands_on_its_offset(world: World) -> None:
    target = next(r for r in world.sorted_expected() if r[0] == 1 and r[1] == 1234)
    offset, message = asyncio.run(_offset_for_time(world, 1, target[2]))
    assert offset == 1234 and message == target
    hot = next(r for r in world.sorted_expected() if r[0] == 2 and r[1] == DELETED_BELOW + 5)
    offset, message = asyncio.run(_offset_for_time(world, 2, hot[2]))
    assert offset == hot[1] and message == hot


def test_other_topics_pass_through(world: World) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    other = f"plain-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": world.proxy.bootstrap})
    # The records are from 2020: without TOPIC_CONFIG's retention, the broker's next retention
    # check may delete them before the consumer reads them.
    admin.create_topics(
        [NewTopic(other, num_partitions=1, replication_factor=1, config=TOPIC_CONFIG)]
    )[other].result(timeout=30)
    sent = produce(world.proxy.bootstrap, other, make_records(500, 1))
    plain = World(other, world.proxy, world.kafka_bootstrap, world.home, world.lake, sent)
    got = _confluent_read(plain, f"g-{uuid.uuid4().hex[:8]}")
    assert sorted(got, key=lambda r: (r[0], r[1])) == sorted(sent, key=lambda r: (r[0], r[1]))


async def _read_for(world: World, seconds: float) -> list[Seen]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=world.proxy.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(world.topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[Seen] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for messages in batches.values():
                got.extend(seen_from_aiokafka(m) for m in messages)
        return got
    finally:
        await consumer.stop()


def test_an_unreachable_coldset_gives_retriable_errors_and_recovers(world: World) -> None:
    warehouse = world.home / "lake" / "warehouse"
    hidden = world.home / "lake" / "warehouse-hidden"
    proxy = start_ksi_proxy(world.home, world.kafka_bootstrap, [world.topic], world.lake)
    try:
        shutil.move(warehouse, hidden)
        try:
            during = asyncio.run(
                _read_for(
                    World(world.topic, proxy, world.kafka_bootstrap, world.home, world.lake), 4
                )
            )
        finally:
            shutil.move(hidden, warehouse)
        assert during == []  # nothing, rather than a jump to Kafka's log start
        assert proxy.process.poll() is None  # the proxy keeps running
        assert "KAFKA_STORAGE_ERROR" in proxy.log() or "coldset failed" in proxy.log()
        after = asyncio.run(
            _read_for(World(world.topic, proxy, world.kafka_bootstrap, world.home, world.lake), 6)
        )
        want = [r for r in world.sorted_expected() if r[0] == 0]
        assert sorted(after, key=lambda r: r[1])[: len(want)] == want
    finally:
        proxy.stop()
