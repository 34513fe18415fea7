"""Random and truncated frames: each closes (at most) its own connection, never the proxy.

Each test fuzzes a proxy of its own, then checks that it still serves clients: the fuzz tests
with many inputs and one plain request, the "still served" tests with a few inputs and real
clients. No test depends on another having run.
"""

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
from tests.kits.proxy import FuzzTarget, RawClient

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


#: Inputs each test sends. A fuzz test sends many, then checks that a client is still served; a
#: "still served" test sends a few of its own first, then checks with real clients.
FAKE_EXAMPLES, FAKE_STILL_SERVED_EXAMPLES = 270, 30
KAFKA_EXAMPLES, KAFKA_STILL_SERVED_EXAMPLES = 900, 100
TLS_EXAMPLES, TLS_STILL_SERVED_EXAMPLES = 270, 30


async def poke(target: FuzzTarget, data: bytes, wait: float, **connect: Any) -> None:
    """Send ``data`` to ``target`` on a fresh connection (``connect``: ``ssl=`` for a TLS
    gateway); give the proxy ``wait`` seconds to react; close."""
    client = await RawClient.connect(target.address, **connect)
    target.examples += 1
    try:
        client.send_raw(data)
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            await asyncio.wait_for(client.reader.read(65536), wait)
    finally:
        await client.close()


async def fuzz(target: FuzzTarget, examples: int, wait: float, **connect: Any) -> None:
    """Send ``examples`` inputs drawn by hypothesis to ``target``, each with :func:`poke`.

    Hypothesis drives a plain function in a worker thread; each input is sent on this test's
    event loop, where the proxy runs. A failing input is shrunk and raised here as usual.
    """
    loop = asyncio.get_running_loop()

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=fuzz_input)
    def send(data: bytes) -> None:
        asyncio.run_coroutine_threadsafe(poke(target, data, wait, **connect), loop).result(60)

    await asyncio.to_thread(send)
    assert target.examples > 0


async def assert_served(target: FuzzTarget, request: Any, **connect: Any) -> Any:
    """A plain client's ``request`` through ``target`` is answered, and no internal error was
    logged while the test ran; return the response."""
    client = await RawClient.connect(target.address, **connect)
    try:
        response = await client.call(request)
    finally:
        await client.close()
    assert not target.errors, target.errors[:5]
    return response


def metadata() -> Any:
    """A Metadata v12 request for every topic."""
    return codec.build(load_request_schema(ApiKey.METADATA, 12))


async def test_fuzz_against_fake_broker(fake_fuzz_proxy: FuzzTarget) -> None:
    await fuzz(fake_fuzz_proxy, FAKE_EXAMPLES, 0.01)
    assert (await assert_served(fake_fuzz_proxy, metadata())).brokers


async def test_fake_broker_still_served_after_fuzzing(fake_fuzz_proxy: FuzzTarget) -> None:
    await fuzz(fake_fuzz_proxy, FAKE_STILL_SERVED_EXAMPLES, 0.01)
    assert (await assert_served(fake_fuzz_proxy, metadata())).brokers


@pytest.mark.slow
async def test_fuzz_against_kafka(kafka_fuzz_proxy: FuzzTarget) -> None:
    await fuzz(kafka_fuzz_proxy, KAFKA_EXAMPLES, 0.03)
    assert (await assert_served(kafka_fuzz_proxy, metadata())).brokers


@pytest.mark.slow
async def test_clients_work_after_fuzzing(
    kafka_bootstrap: str, kafka_fuzz_proxy: FuzzTarget
) -> None:
    """After a few fuzzed inputs of its own, real clients still get through the proxy."""
    await fuzz(kafka_fuzz_proxy, KAFKA_STILL_SERVED_EXAMPLES, 0.03)
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


@pytest.fixture
async def tls_fuzz_proxy(secure_stack: Any) -> AsyncIterator[tuple[FuzzTarget, ssl.SSLContext]]:
    """A proxy of the test's own whose gateway speaks TLS (the stack's broker certificate, SANs
    127.0.0.1) in front of the secured Kafka (its TLS and the admin's SASL from the stack's
    properties file), and a client TLS context trusting the stack's CA."""
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
async def test_fuzz_against_a_tls_gateway(
    tls_fuzz_proxy: tuple[FuzzTarget, ssl.SSLContext],
) -> None:
    """Fuzzed inputs inside TLS; then a plain client's ApiVersions (what a client may send
    before it authenticates) is still answered through the gateway."""
    target, context = tls_fuzz_proxy
    tls = {"ssl": context, "server_hostname": "127.0.0.1"}
    await fuzz(target, TLS_EXAMPLES, 0.03, **tls)
    request = codec.build_request(
        ApiKey.API_VERSIONS, 3, client_software_name="fuzz", client_software_version="1"
    )
    response = await assert_served(target, request, **tls)
    assert response.error_code == 0 and response.api_keys


@pytest.mark.slow
async def test_sasl_ssl_clients_work_after_fuzzing_the_tls_gateway(
    tls_fuzz_proxy: tuple[FuzzTarget, ssl.SSLContext], secure_stack: Any, new_secure_topic: Any
) -> None:
    """After a few fuzzed inputs of its own inside TLS, a SASL_SSL client (TLS to the gateway,
    its own SCRAM credentials through it) still produces and consumes."""
    from confluent_kafka import Consumer, Producer

    target, context = tls_fuzz_proxy
    await fuzz(target, TLS_STILL_SERVED_EXAMPLES, 0.03, ssl=context, server_hostname="127.0.0.1")
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
