"""``bergstream quickstart``: start the local stack, run the proxy example, move records through it.

Every step runs on real components: Kafka in KRaft mode, the proxy from ``examples/proxy.yaml``,
and aiokafka clients that only ever see the proxy's addresses.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

from bergstream.core.config import load_config
from bergstream.core.plugins import load_registry
from bergstream.core.runner import build_services

TOPIC = "bergstream-quickstart"


async def _round_trip(bootstrap: str, records: int, say: Callable[[str], None]) -> dict[str, int]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        try:
            await admin.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=1)])
            say(f"created topic {TOPIC} (3 partitions) through the proxy")
        except TopicAlreadyExistsError:
            say(f"topic {TOPIC} exists already")
        metadata = await admin.describe_cluster()
        brokers = sorted(f"{b['host']}:{b['port']}" for b in metadata["brokers"])
        say(f"brokers as clients see them: {', '.join(brokers)}")
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    run_id = str(time.time_ns()).encode()
    started = time.perf_counter()
    try:
        futures = [
            await producer.send(
                TOPIC,
                key=f"key-{i}".encode(),
                value=f"record {i}".encode(),
                headers=[("run", run_id), ("n", str(i).encode())],
            )
            for i in range(records)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    say(f"produced {records} records with keys and headers in {time.perf_counter() - started:.2f}s")

    consumer = AIOKafkaConsumer(
        TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(seen) < records and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=1000)
            for messages in batches.values():
                for message in messages:
                    headers = dict(message.headers)
                    if headers.get("run") != run_id:
                        continue
                    n = int(headers["n"])
                    if (
                        message.key != f"key-{n}".encode()
                        or message.value != f"record {n}".encode()
                    ):
                        raise RuntimeError(f"record {n} came back changed: {message}")
                    seen.add(n)
    finally:
        await consumer.stop()
    if len(seen) != records:
        raise RuntimeError(f"consumed {len(seen)} of {records} records within 60 s")
    say(f"consumed all {records} records back, identical, through the proxy")
    return {"produced": records, "consumed": len(seen)}


async def run_quickstart(
    config_file: Path, records: int, say: Callable[[str], None]
) -> dict[str, int]:
    """Start the stack, run the proxy of ``config_file`` in-process and round-trip ``records``."""
    from bergstream.core.stack import stack_up

    say("starting the local stack (Kafka in KRaft mode, S3, Redis); first run downloads jars ...")
    env = await asyncio.to_thread(stack_up)
    os.environ.update(env.as_dict())
    say(f"Kafka is up at {env.as_dict()['BERGSTREAM_KAFKA_BOOTSTRAP']}")

    registry = load_registry()
    config = load_config(config_file, registry=registry)
    services = build_services(config, registry)
    for service in services:
        await service.start()
    try:
        gateway = config.virtual_clusters[0].gateway
        bootstrap = f"{gateway.advertised_host or gateway.host}:{gateway.port}"
        say(f"proxy '{config.virtual_clusters[0].name}' listening on {bootstrap}")
        result = await _round_trip(bootstrap, records, say)
    finally:
        for service in reversed(services):
            await service.stop()
    say("proxy stopped; the stack keeps running until `bergstream stack down`")
    say(
        'run the proxy yourself:  eval "$(bergstream stack env)" && '
        f"bergstream run -c {config_file}"
    )
    say(f"then point any Kafka client at {bootstrap}, e.g.  kcat -b {bootstrap} -C -t {TOPIC} -e")
    return result
