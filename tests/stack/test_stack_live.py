"""The local stack against the real components (Kafka, S3, Redis, Schema Registry): one
``stack up`` / ``stack down`` cycle.

The tests run in file order and share one stack (module fixture); the last ones restart a
component and bring everything down.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bergstream.devstack.stack import (
    KAFKA_TOOL_ALIASES,
    StackEnv,
    StackError,
    ensure_kafka_libs,
    kafka_tool_command,
    stack_down,
    stack_env,
    stack_status,
    stack_up,
)
from bergstream.devstack.stack.ports import port_is_open
from bergstream.devstack.stack.procs import pid_alive
from bergstream.devstack.stack.testing import session_stack

pytestmark = pytest.mark.slow


@dataclass
class LiveStack:
    home: Path
    env: StackEnv
    up_seconds: float


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    home = tmp_path_factory.mktemp("stack") / "home"
    t0 = time.monotonic()
    try:
        env = session_stack(home)
        up_seconds = time.monotonic() - t0
        print(f"\nstack up: {up_seconds:.1f} s; {json.dumps(_timings(home))}")
        yield LiveStack(home, env, up_seconds)
    finally:
        stack_down(home)


def _timings(home: Path) -> dict[str, float | None]:
    return {name: entry["ready_seconds"] for name, entry in stack_status(home).items()}


def _pids(home: Path) -> dict[str, int]:
    return {name: entry["pid"] for name, entry in stack_status(home).items() if entry["running"]}


def _alive(pid: int) -> bool:
    # A zombie (exited, not yet reaped by this test process, its parent) counts as stopped.
    return pid_alive(pid)


def _s3_client(env: StackEnv):  # type: ignore[no-untyped-def]
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=env.s3_endpoint,
        aws_access_key_id=env.s3_access_key,
        aws_secret_access_key=env.s3_secret_key,
        region_name=env.s3_region,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def test_every_tool_alias_is_a_class_in_the_jars() -> None:
    libs = ensure_kafka_libs()
    classes: set[str] = set()
    for jar in libs.glob("*.jar"):
        with zipfile.ZipFile(jar) as archive:
            classes.update(n for n in archive.namelist() if n.endswith(".class"))
    missing = {
        alias: main
        for alias, main in KAFKA_TOOL_ALIASES.items()
        if main.replace(".", "/") + ".class" not in classes
    }
    assert missing == {}
    assert "kafka/Kafka.class" in classes


def test_env_names_every_component(live: LiveStack) -> None:
    exported = live.env.as_dict()
    for name in (
        "BERGSTREAM_HOME",
        "BERGSTREAM_KAFKA_BOOTSTRAP",
        "BERGSTREAM_S3_ENDPOINT",
        "BERGSTREAM_S3_ACCESS_KEY",
        "BERGSTREAM_S3_SECRET_KEY",
        "BERGSTREAM_S3_REGION",
        "BERGSTREAM_REDIS_URL",
        "BERGSTREAM_SCHEMA_REGISTRY_URL",
    ):
        assert exported[name], name
    assert exported["BERGSTREAM_HOME"] == str(live.home)
    assert exported["BERGSTREAM_KAFKA_BOOTSTRAP"].startswith("127.0.0.1:")
    assert exported["BERGSTREAM_S3_ENDPOINT"].startswith("http://127.0.0.1:")
    assert exported["BERGSTREAM_REDIS_URL"].startswith("redis://127.0.0.1:")
    assert exported["BERGSTREAM_SCHEMA_REGISTRY_URL"].startswith("http://127.0.0.1:")
    assert exported["BERGSTREAM_SCHEMA_REGISTRY_URL"].endswith("/apis/ccompat/v7")
    assert exported["BERGSTREAM_S3_REGION"] == "us-east-1"
    assert stack_env(live.home) == live.env
    state = json.loads((live.home / "stack.json").read_text())
    assert state["components"]["kafka"]["version"].startswith("4.")


def test_kafka_produce_and_consume(live: LiveStack) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = f"stack-{uuid.uuid4().hex[:8]}"

    async def roundtrip() -> tuple[bytes | None, bytes | None, int]:
        producer = AIOKafkaProducer(bootstrap_servers=live.env.kafka_bootstrap)
        await producer.start()
        try:
            meta = await producer.send_and_wait(topic, b"value-1", key=b"key-1")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=live.env.kafka_bootstrap,
            group_id=f"g-{topic}",
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            record = await asyncio.wait_for(consumer.getone(), timeout=30)
            await consumer.commit()
        finally:
            await consumer.stop()
        return record.key, record.value, meta.offset

    key, value, offset = asyncio.run(roundtrip())
    assert (key, value, offset) == (b"key-1", b"value-1", 0)


def test_kafka_tools_console_consumer_and_delete_records(live: LiveStack, tmp_path: Path) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    topic = f"tools-{uuid.uuid4().hex[:8]}"
    bootstrap = live.env.kafka_bootstrap
    assert bootstrap

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, f"m{i}".encode())
        finally:
            await producer.stop()

    asyncio.run(produce())
    out = subprocess.run(
        kafka_tool_command(
            "console-consumer",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            "5",
            "--timeout-ms",
            "30000",
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.splitlines() == ["m0", "m1", "m2", "m3", "m4"]  # stdout carries no logs

    offsets = tmp_path / "offsets.json"
    offsets.write_text(
        json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "offset": 3}]})
    )
    subprocess.run(
        kafka_tool_command(
            "delete-records", "--bootstrap-server", bootstrap, "--offset-json-file", str(offsets)
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )

    async def log_start() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            return (await consumer.beginning_offsets([tp]))[tp]
        finally:
            await consumer.stop()

    assert asyncio.run(log_start()) == 3


def test_s3_put_get_with_the_keys(live: LiveStack) -> None:
    s3 = _s3_client(live.env)
    bucket = f"stack-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="dir/object.bin", Body=b"\x00payload\xff")
    assert s3.get_object(Bucket=bucket, Key="dir/object.bin")["Body"].read() == b"\x00payload\xff"
    assert bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}

    from botocore.exceptions import ClientError

    wrong = _s3_client(dataclasses.replace(live.env, s3_secret_key="not-the-secret"))
    with pytest.raises(ClientError):
        wrong.list_buckets()


def test_redis_ping(live: LiveStack) -> None:
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(live.env.redis_url)
    try:
        assert client.ping() is True
        client.set("stack-test", b"v")
        assert client.get("stack-test") == b"v"
    finally:
        client.close()


def test_schema_registry_registers_and_serves_an_avro_schema(live: LiveStack) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    url = live.env.schema_registry_url
    assert url
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/subjects", timeout=10) as response:
        assert response.status == 200
        assert isinstance(json.loads(response.read()), list)

    client = SchemaRegistryClient({"url": url})
    subject = f"payments-{uuid.uuid4().hex[:8]}-value"
    avro = json.dumps(
        {
            "type": "record",
            "name": "Payment",
            "namespace": "bergstream.test",
            "fields": [{"name": "id", "type": "long"}, {"name": "currency", "type": "string"}],
        }
    )
    schema_id = client.register_schema(subject, Schema(avro, "AVRO"))
    assert schema_id > 0
    fresh = SchemaRegistryClient({"url": url})  # no cache: read back from the server
    back = fresh.get_schema(schema_id)
    assert back.schema_type == "AVRO"
    assert json.loads(back.schema_str) == json.loads(avro)
    assert subject in fresh.get_subjects()
    assert fresh.get_latest_version(subject).schema_id == schema_id


def test_status_reports_every_component(live: LiveStack) -> None:
    status = stack_status(live.home)
    assert set(status) == {
        *("kafka", "s3", "redis", "schema-registry", "postgres", "connect", "kdc", "oidc"),
        "rest-catalog",
    }
    for name, entry in status.items():
        if name in ("postgres", "connect", "kdc", "oidc", "rest-catalog"):  # when asked for
            assert entry["running"] is False and entry["pid"] is None
            continue
        assert entry["running"] is True
        assert _alive(entry["pid"])
    assert status["kafka"]["address"] == live.env.kafka_bootstrap
    assert status["s3"]["address"] == live.env.s3_endpoint
    assert status["redis"]["address"] == live.env.redis_url
    assert status["schema-registry"]["address"] == live.env.schema_registry_url


def test_up_again_is_harmless(live: LiveStack) -> None:
    before = _pids(live.home)
    t0 = time.monotonic()
    env = stack_up(live.home)
    assert time.monotonic() - t0 < 10
    assert env == live.env
    assert _pids(live.home) == before


def test_servers_survive_the_process_that_started_them(live: LiveStack) -> None:
    # The servers are in their own sessions: not in this process's group.
    for pid in _pids(live.home).values():
        assert os.getpgid(pid) == pid != os.getpgid(0)


def test_dead_component_is_restarted_on_the_same_port(live: LiveStack) -> None:
    before = _pids(live.home)
    os.kill(before["redis"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while stack_status(live.home)["redis"]["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(StackError, match="bergstream stack up"):
        stack_env(live.home)
    env = stack_up(live.home)
    after = _pids(live.home)
    assert after["redis"] != before["redis"]
    assert after["kafka"] == before["kafka"] and after["s3"] == before["s3"]
    assert env.redis_url == live.env.redis_url  # port reused
    test_redis_ping(live)


def test_down_stops_everything(live: LiveStack) -> None:
    status = stack_status(live.home)
    pids = {name: entry["pid"] for name, entry in status.items()}
    ports = [port for entry in status.values() for port in entry["ports"].values()]
    t0 = time.monotonic()
    stopped = stack_down(live.home)
    print(f"\nstack down: {time.monotonic() - t0:.1f} s")
    assert sorted(stopped) == ["kafka", "redis", "s3", "schema-registry"]
    for name, pid in pids.items():
        assert not _alive(pid), name
    assert [port for port in ports if port_is_open(port)] == []
    leftovers = [
        path
        for port in status["s3"]["ports"].values()
        for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")
    ]
    assert leftovers == []
    assert not any(entry["running"] for entry in stack_status(live.home).values())
    state = json.loads((live.home / "stack.json").read_text())
    assert all("pid" not in entry for entry in state["components"].values())
    with pytest.raises(StackError, match="bergstream stack up"):
        stack_env(live.home)
    assert stack_down(live.home) == []
