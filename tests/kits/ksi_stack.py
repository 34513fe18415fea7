"""Helpers of the end-to-end tests on the stack (KSI's first): produce known records, copy them
with the real pipeline (in the test process's Spark session, on the session's stack or on a
secured one), delete the first ones in
Kafka, and run ``bergstream run`` with the ksi filter."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bergstream.devstack.stack.env import StackEnv
from bergstream.devstack.stack.ports import free_port_block
from tests.kits.worker_spark import run_pipeline_in_worker
from tests.support import BERGSTREAM, ProxyProcess, start_bergstream_run

BASE_TIMESTAMP = 1_600_000_000_000

#: (partition, offset, timestamp, key, value, headers): a record as clients see it.
Seen = tuple[int, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


@dataclass(frozen=True)
class Outgoing:
    """A record to produce."""

    partition: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def make_records(count: int, partitions: int, start: int = 0, size: int = 120) -> list[Outgoing]:
    """Deterministic records: printable values (so kcat's text output compares too), null and
    empty keys and values, duplicate header keys and a null header value, increasing times."""
    out = []
    for i in range(start, start + count):
        rng = random.Random(i)
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randrange(size // 2, size)))
        value: bytes | None = base64.b64encode(raw)
        key: bytes | None = f"key-{i}".encode()
        if i % 101 == 0:
            key = None
        elif i % 103 == 0:
            key = b""
        if i % 107 == 0:
            value = b""
        out.append(
            Outgoing(
                partition=i % partitions,
                timestamp=BASE_TIMESTAMP + i,
                key=key,
                value=value,
                headers=(("i", str(i).encode()), ("dup", b"1"), ("dup", None)),
            )
        )
    return out


def produce(bootstrap: str, topic: str, records: list[Outgoing]) -> list[Seen]:
    """Produce ``records`` with aiokafka (idempotent); return them as clients will see them."""
    return asyncio.run(_produce(bootstrap, topic, records))


async def _produce(bootstrap: str, topic: str, records: list[Outgoing]) -> list[Seen]:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                key=r.key,
                value=r.value,
                partition=r.partition,
                timestamp_ms=r.timestamp,
                headers=list(r.headers),
            )
            for r in records
        ]
        sent = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return [
        (meta.partition, meta.offset, r.timestamp, r.key, r.value, r.headers)
        for meta, r in zip(sent, records, strict=True)
    ]


def lake_yaml(home: Path, kafka_bootstrap: str) -> str:
    """A ``lake:`` section with its catalog and warehouse under ``home``."""
    return textwrap.dedent(
        f"""
        lake:
          kafka_bootstrap: "{kafka_bootstrap}"
          catalog:
            type: sql
            uri: "sqlite:///{home}/lake/catalog.db"
            warehouse: "{home}/lake/warehouse"
          pipeline:
            checkpoint_dir: "{home}/lake/checkpoints"
            spark_conf: {{spark.driver.memory: 1g, spark.sql.shuffle.partitions: "2"}}
        """
    )


def run_pipeline_once(config: Path, topic: str, timeout: float = 900) -> dict[str, Any]:
    """``bergstream pipeline run --once`` in the test process's Spark session
    (:func:`~tests.kits.worker_spark.run_pipeline_in_worker`), or as the command for a lake on
    a Spark cluster; its JSON summary."""
    summary = run_pipeline_in_worker(config, topic)
    return summary if summary is not None else run_pipeline_command(config, topic, timeout)


def run_pipeline_command(config: Path, topic: str, timeout: float = 900) -> dict[str, Any]:
    """``bergstream pipeline run --once`` as a process; its JSON summary (the last stdout line
    that is a JSON object: Spark's Ivy prints to stdout too)."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [BERGSTREAM, "pipeline", "run", "-c", str(config), "--topic", topic, "--once"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the pipeline failed:\n{done.stderr[-4000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"the pipeline printed no summary:\n{done.stdout[-2000:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def pipeline_once(stack: StackEnv, config: Path, topic: str) -> dict[str, Any]:
    """:func:`run_pipeline_once` with the ``BERGSTREAM_*`` variables of ``stack`` (a secured
    stack's: its bootstrap and Kafka properties file)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in stack.as_dict().items():
            patch.setenv(name, value)
        return run_pipeline_once(config, topic)


def delete_records_below(bootstrap: str, topic: str, partitions: int, offset: int) -> None:
    """Kafka's DeleteRecords, as retention would: log start moves to ``offset``."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, p, offset) for p in range(partitions)])
    for future in futures.values():
        result = future.result(timeout=60)
        assert result.low_watermark == offset, result


def start_ksi_proxy(
    tmp: Path,
    kafka_bootstrap: str,
    topics: list[str] | None,
    lake: str,
    extra: str = "",
    env: dict[str, str] | None = None,
) -> ProxyProcess:
    """``bergstream run -c`` with one virtual cluster whose chain is the ksi filter, serving
    ``topics`` (None: no ``topics`` key, so every topic with a table); ``extra`` adds
    settings (``", key: value"``); ``lake`` is appended to the file as is (a ``lake:`` section,
    and any other top-level section such as ``codecs:``); ``env`` adds environment variables."""
    port = free_port_block(4)
    config = tmp / f"ksi-{port}.yaml"
    listed = "" if topics is None else "topics: [" + ", ".join(f'"{t}"' for t in topics) + "]"
    settings = (listed + extra).removeprefix(", ")
    config.write_text(
        textwrap.dedent(
            f"""
            virtual_clusters:
              - name: ksi
                target: {{bootstrap: "{kafka_bootstrap}"}}
                gateway: {{host: 127.0.0.1, port: {port}, lowest_broker_id: 0, broker_count: 3}}
                filters:
                  - type: ksi
                    config: {{{settings}}}
            """
        )
        + lake
    )
    proxy = start_bergstream_run(config, f"127.0.0.1:{port}", env, what="the proxy")
    return proxy


def seen_from_confluent(message: Any) -> Seen:
    """A confluent-kafka message as a :data:`Seen` tuple."""
    headers = tuple((k, v) for k, v in (message.headers() or []))
    return (
        message.partition(),
        message.offset(),
        message.timestamp()[1],
        message.key(),
        message.value(),
        headers,
    )


def seen_from_aiokafka(message: Any) -> Seen:
    """An aiokafka ConsumerRecord as a :data:`Seen` tuple."""
    return (
        message.partition,
        message.offset,
        message.timestamp,
        message.key,
        message.value,
        tuple(message.headers),
    )


async def fetch_partition(
    connection: Any, topic: str, partition: int, offset: int
) -> tuple[int, int]:
    """One Fetch v12 of ``topic``/``partition`` at ``offset`` on an open (authenticated)
    connection, as a consumer sends it: (the partition's error code, bytes of records)."""
    import datetime

    from bergstream.core.api import ApiKey, kafka_request
    from bergstream.core.proxy.codec import build, field_entity_type, request_schema

    schema = request_schema(ApiKey.FETCH, 12)
    topic_type = field_entity_type(schema, "topics")
    partition_type = field_entity_type(topic_type, "partitions")
    wanted = build(
        partition_type,
        partition=partition,
        fetch_offset=offset,
        current_leader_epoch=-1,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    request = build(
        schema,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=1,
        max_bytes=1 << 20,
        session_epoch=-1,
        topics=(build(topic_type, topic=topic, partitions=(wanted,)),),
    )
    response = await kafka_request(
        connection.reader, connection.writer, request, correlation_id=7, client_id="t"
    )
    (part,) = response.responses[0].partitions
    return int(part.error_code), len(part.records or b"")
