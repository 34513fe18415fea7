"""Random and truncated frames: each closes (at most) its own connection, never the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.versions import KIO_VERSIONS
from tests.proxy.proxy_testkit import FuzzTarget, RawClient

REQUESTS = [
    (ApiKey.METADATA, 12),
    (ApiKey.METADATA, 4),
    (ApiKey.API_VERSIONS, 3),
    (ApiKey.API_VERSIONS, 0),
    (ApiKey.FETCH, 11),
    (ApiKey.FETCH, 16),
    (ApiKey.PRODUCE, 7),
    (ApiKey.PRODUCE, 9),
    (ApiKey.LIST_OFFSETS, 7),
    (ApiKey.FIND_COORDINATOR, 4),
]


def _valid(key: int, version: int, cid: int) -> bytes:
    header = codec.make_request_header(key, version, cid, "fuzz")
    return codec.encode_request(header, codec.build(load_request_schema(key, version)))


def _frame(body: bytes, length_delta: int) -> bytes:
    return struct.pack(">i", len(body) + length_delta) + body


random_bytes = st.binary(min_size=1, max_size=80)

header_with_garbage = st.builds(
    lambda key, version, cid, client_id, body, delta: _frame(
        struct.pack(">hhi", key, version, cid) + client_id + body, delta
    ),
    st.one_of(st.sampled_from(sorted(KIO_VERSIONS)), st.integers(-(2**15), 2**15 - 1)),
    st.integers(-2, 20),
    st.integers(-(2**31), 2**31 - 1),
    st.one_of(st.just(b"\xff\xff"), st.just(b"\x00\x03abc"), st.binary(max_size=4)),
    st.binary(max_size=120),
    st.sampled_from([0, 0, 0, 1, 7, -1, -3]),
)

truncated_or_corrupted = st.builds(
    lambda request, cid, cut, flip: (
        lambda data: (
            data[: max(1, len(data) - cut)]
            if flip is None
            else data[:flip] + bytes([data[flip] ^ 0xFF]) + data[flip + 1 :]
            if flip < len(data)
            else data
        )
    )(_valid(*request, cid)),
    st.sampled_from(REQUESTS),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(1, 40),
    st.one_of(st.none(), st.integers(0, 60)),
)

fuzz_input = st.one_of(random_bytes, header_with_garbage, truncated_or_corrupted)


async def poke(address: str, data: bytes, wait: float, **connect: Any) -> None:
    """Send ``data`` on a fresh connection (``connect``: ``ssl=`` for a TLS gateway); give the
    proxy ``wait`` seconds to react; close."""
    client = await RawClient.connect(address, **connect)
    FuzzTarget.count += 1
    try:
        client.send_raw(data)
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            await asyncio.wait_for(client.reader.read(65536), wait)
    finally:
        await client.close()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=fuzz_input)
async def test_fuzz_against_fake_broker(fuzzed_fake_proxy, data):
    await poke(fuzzed_fake_proxy.address, data, 0.01)


async def test_fake_broker_still_served_after_fuzzing(fuzzed_fake_proxy):
    client = await RawClient.connect(fuzzed_fake_proxy.address)
    assert (await client.call(codec.build(load_request_schema(ApiKey.METADATA, 12)))).brokers
    await client.close()
    assert fuzzed_fake_proxy.examples > 0
    assert not fuzzed_fake_proxy.errors, fuzzed_fake_proxy.errors[:5]


@pytest.mark.slow
@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=fuzz_input)
async def test_fuzz_against_kafka(kafka_fuzz_proxy, data):
    await poke(kafka_fuzz_proxy.address, data, 0.03)


@pytest.mark.slow
async def test_clients_work_after_fuzzing(kafka_bootstrap, kafka_fuzz_proxy):
    """Runs after the fuzz test (same module-scoped proxy): real clients still get through."""
    assert kafka_fuzz_proxy.examples > 0
    assert not kafka_fuzz_proxy.errors, kafka_fuzz_proxy.errors[:5]
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"t-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 3, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_fuzz_proxy.address)
    await producer.start()
    for i in range(30):
        await producer.send(topic, b"after-fuzz-%d" % i, key=b"k%d" % i, partition=i % 3)
    await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_fuzz_proxy.address,
        auto_offset_reset="earliest",
        group_id=uuid.uuid4().hex,
    )
    await consumer.start()
    got = []
    async with asyncio.timeout(60):
        _deadline = time.monotonic() + 120
        while len(got) < 30:
            assert time.monotonic() < _deadline, "records did not all arrive within 120 s"
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(messages)
    await consumer.stop()
    assert sorted(m.value for m in got) == sorted(b"after-fuzz-%d" % i for i in range(30))


# --------------------------------------------------------------------------------------------
# A TLS gateway in front of the secured three-broker stack (SASL_SSL): the same inputs inside TLS.


@pytest.fixture(scope="module")
async def tls_fuzz_proxy(secure_stack: Any) -> AsyncIterator[tuple[FuzzTarget, ssl.SSLContext]]:
    """A proxy whose gateway speaks TLS (the stack's broker certificate, SANs 127.0.0.1) in
    front of the secured Kafka (its TLS and the admin's SASL from the stack's properties file),
    and a client TLS context trusting the stack's CA."""
    security = Path(secure_stack.home) / "security"
    env = secure_stack.as_dict()
    context = ssl.create_default_context(cafile=str(security / "ca.pem"))
    async with FuzzTarget.running(
        env["BERGSTREAM_KAFKA_BOOTSTRAP"],
        tls={"cert_file": security / "broker.pem", "key_file": security / "broker.pem"},
        kafka_client={"properties_file": env["BERGSTREAM_KAFKA_CONFIG"]},
        broker_count=4,
    ) as target:
        yield target, context


@pytest.mark.slow
@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=fuzz_input)
async def test_fuzz_against_a_tls_gateway(tls_fuzz_proxy, data):
    target, context = tls_fuzz_proxy
    await poke(target.address, data, 0.03, ssl=context, server_hostname="127.0.0.1")


@pytest.mark.slow
async def test_sasl_ssl_clients_work_after_fuzzing_the_tls_gateway(
    tls_fuzz_proxy, secure_stack, new_secure_topic
):
    """Runs after the TLS fuzz test: a SASL_SSL client (TLS to the gateway, its own SCRAM
    credentials through it) still produces and consumes."""
    from confluent_kafka import Consumer, Producer

    target, _ = tls_fuzz_proxy
    assert target.examples > 0
    assert not target.errors, target.errors[:5]
    env = secure_stack.as_dict()
    props = dict(
        line.split("=", 1)
        for line in Path(env["BERGSTREAM_KAFKA_CONFIG"]).read_text().splitlines()
        if line and not line.startswith("#")
    )
    client = {
        "bootstrap.servers": target.address,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": props["ssl.ca.location"],
        "sasl.mechanism": props["sasl.mechanisms"],
        "sasl.username": props["sasl.username"],
        "sasl.password": props["sasl.password"],
    }
    topic = new_secure_topic(partitions=3)
    producer = Producer(client)
    for i in range(30):
        producer.produce(topic, value=b"after-tls-fuzz-%d" % i, partition=i % 3)
    assert await asyncio.to_thread(producer.flush, 60) == 0
    consumer = Consumer({**client, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < 30 and time.monotonic() < deadline:
        message = await asyncio.to_thread(consumer.poll, 1.0)
        if message is not None and not message.error():
            got.append(message.value())
    await asyncio.to_thread(consumer.close)
    assert sorted(got) == sorted(b"after-tls-fuzz-%d" % i for i in range(30))
