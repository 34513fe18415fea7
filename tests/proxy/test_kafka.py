"""The proxy in front of a real Kafka (KRaft) with unmodified clients: aiokafka, confluent-kafka."""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
import uuid
from dataclasses import replace
from typing import ClassVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAuthorizationFailedError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.api import (
    CloseConnection,
    Drop,
    ErrorResponse,
    Forward,
    ProxyFilter,
    ShortCircuit,
)
from tests.kits.proxy import FactoryOf, RawClient, self_signed_cert

pytestmark = pytest.mark.slow


def bootstrap_of(server) -> str:
    return f"127.0.0.1:{server.cluster.gateway.port}"


async def create_topic(kafka_bootstrap: str, partitions: int = 3, prefix: str = "t") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


async def produce(bootstrap: str, topic: str, count: int, **options) -> list[tuple]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **options)
    await producer.start()
    sent = []
    try:
        futures = []
        for i in range(count):
            key = f"key-{i}".encode()
            value = f"value-{i}".encode() * (1 + i % 7)
            headers = [("n", str(i).encode()), ("dup", b"a"), ("dup", b"b")]
            futures.append(
                await producer.send(topic, value, key=key, headers=headers, partition=i % 3)
            )
            sent.append((i % 3, key, value, headers))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return sent


async def consume(bootstrap: str, topic: str, count: int, timeout: float = 60) -> list:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=True,
    )
    await consumer.start()
    records = []
    try:
        async with asyncio.timeout(timeout):
            _deadline = time.monotonic() + 120
            while len(records) < count:
                assert time.monotonic() < _deadline, "records did not all arrive within 120 s"
                batch = await consumer.getmany(timeout_ms=500)
                for messages in batch.values():
                    records.extend(messages)
        await consumer.commit()
    finally:
        await consumer.stop()
    return records


async def test_produce_and_consume_through_the_proxy(kafka_bootstrap, start_proxy):
    proxy = await start_proxy(kafka_bootstrap)
    topic = await create_topic(kafka_bootstrap)
    sent = await produce(bootstrap_of(proxy), topic, 300, enable_idempotence=True)
    records = await consume(bootstrap_of(proxy), topic, 300)
    got = sorted((r.partition, r.key, r.value, list(r.headers)) for r in records)
    assert got == sorted((p, k, v, h) for p, k, v, h in sent)
    assert {r.partition for r in records} == {0, 1, 2}


def confluent_round_trip(bootstrap: str, topic: str, count: int) -> dict:
    """Produce then consume ``count`` records with confluent-kafka (blocking: run in a thread)."""
    from confluent_kafka import Consumer, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(
            topic,
            f"v{i}".encode() * 50,
            key=f"k{i}".encode(),
            partition=i % 3,
            headers=[("h", str(i).encode())],
        )
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    seen = {}
    try:
        for _ in range(200):
            for message in consumer.consume(500, 0.5):
                assert message.error() is None, message.error()
                seen[message.key()] = (message.value(), message.headers())
            if len(seen) == count:
                break
    finally:
        consumer.close()
    return seen


async def test_confluent_kafka_through_the_proxy(kafka_bootstrap, start_proxy):
    """librdkafka speaks Fetch v16+ (node endpoints): the scan-and-pass-through path."""
    proxy = await start_proxy(kafka_bootstrap)
    topic = await create_topic(kafka_bootstrap)
    seen = await asyncio.to_thread(confluent_round_trip, bootstrap_of(proxy), topic, 500)
    assert len(seen) == 500
    assert seen[b"k7"] == (b"v7" * 50, [("h", b"7")])


async def test_metadata_lists_only_proxy_addresses(kafka_bootstrap, start_proxy):
    proxy = await start_proxy(kafka_bootstrap, advertised_host="localhost")
    gateway = proxy.cluster.gateway
    proxy_ports = set(proxy.ports().values())
    client = await RawClient.connect(bootstrap_of(proxy))
    for version in (1, 9, 12, 13):
        response = await client.call(
            codec.build(load_request_schema(ApiKey.METADATA, version)), version
        )
        assert response.brokers
        assert all(b.host == "localhost" and b.port in proxy_ports for b in response.brokers)
    cluster = await client.call(codec.build(load_request_schema(ApiKey.DESCRIBE_CLUSTER, 1)), 20)
    assert all(
        (b.host, b.port) == ("localhost", gateway.broker_port(b.broker_id)) for b in cluster.brokers
    )
    group = f"g-{uuid.uuid4().hex[:6]}"
    for version, cid in ((3, 30), (4, 31)):
        request = codec.build(
            load_request_schema(ApiKey.FIND_COORDINATOR, version),
            **({"key": group} if version < 4 else {"coordinator_keys": (group,)}),
        )
        for _ in range(20):  # the coordinator may still be loading
            found = await client.call(request, cid)
            entries = [found] if version < 4 else list(found.coordinators)
            if all(e.error_code == ErrorCode.none for e in entries):
                break
            await asyncio.sleep(0.5)
        assert all(
            (e.host, e.port) == ("localhost", gateway.broker_port(e.node_id)) for e in entries
        )
    await client.close()
    real = {tuple(a.split(":")) for a in [kafka_bootstrap]}
    assert all((b.host, str(b.port)) not in real for b in response.brokers)


# ---------------------------------------------------------------- a filter exercising every action


def add_header_to_batches(records: bytes, key: str, value: bytes) -> bytes:
    """Rebuild every v2 batch with one more header per record, keeping producer state."""
    out = bytearray()
    reader = MemoryRecords(bytes(records))
    while reader.has_next():
        batch = reader.next_batch()
        assert batch.magic == 2, "only v2 record batches are rewritten here"
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=batch.compression_type,
            is_transactional=batch.is_transactional,
            producer_id=batch.producer_id,
            producer_epoch=batch.producer_epoch,
            base_sequence=batch.base_sequence,
            batch_size=2**30,
        )
        for record in batch:
            builder.append(
                record.offset - batch.base_offset,
                timestamp=record.timestamp,
                key=record.key,
                value=record.value,
                headers=[*record.headers, (key, value)],
            )
        out += builder.build()
    return bytes(out)


class EveryAction(ProxyFilter):
    """Produce: adds a record header, or errors for topics named ``deny-*``; ListGroups: short
    circuit; DescribeGroups: drop (group ``drop``) or close (group ``close``); Fetch: asks the
    broker for the partitions' end offsets out of band and records the consumer's lag."""

    request_api_keys: ClassVar = frozenset(
        {ApiKey.PRODUCE, ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS, ApiKey.FETCH}
    )
    lag: ClassVar[dict] = {}

    async def on_request(self, header, request, context):
        key = header.request_api_key
        if key == ApiKey.PRODUCE:
            if any(t.name.startswith("deny-") for t in request.topic_data):
                return ErrorResponse(ErrorCode.topic_authorization_failed)
            topics = tuple(
                replace(
                    topic,
                    partition_data=tuple(
                        replace(p, records=add_header_to_batches(p.records, "x-proxy", b"seen"))
                        for p in topic.partition_data
                    ),
                )
                for topic in request.topic_data
            )
            return Forward(replace(request, topic_data=topics))
        if key == ApiKey.LIST_GROUPS:
            return ShortCircuit(
                codec.build(codec.response_schema(ApiKey.LIST_GROUPS, header.request_api_version))
            )
        if key == ApiKey.DESCRIBE_GROUPS:
            if "drop" in request.groups:
                return Drop()
            if "close" in request.groups:
                return CloseConnection("asked to close")
            return Forward(request)
        if key == ApiKey.FETCH and header.request_api_version < 13:
            await self.record_lag(request, context)
        return Forward(request)

    async def record_lag(self, request, context):
        schema = load_request_schema(ApiKey.LIST_OFFSETS, 4)
        topic_type = codec.field_entity_type(schema, "topics")
        partition_type = codec.field_entity_type(topic_type, "partitions")
        query = codec.build(
            schema,
            replica_id=-1,
            topics=tuple(
                codec.build(
                    topic_type,
                    name=topic.topic,
                    partitions=tuple(
                        codec.build(
                            partition_type,
                            partition_index=p.partition,
                            timestamp=-1,
                            current_leader_epoch=-1,
                        )
                        for p in topic.partitions
                    ),
                )
                for topic in request.topics
            ),
        )
        answer = await context.send_request(query, timeout=10)
        fetch_offsets = {
            (t.topic, p.partition): p.fetch_offset for t in request.topics for p in t.partitions
        }
        for topic in answer.topics:
            for partition in topic.partitions:
                tp = (topic.name, partition.partition_index)
                EveryAction.lag[tp] = (partition.offset, partition.offset - fetch_offsets[tp])


async def test_filter_actions_against_kafka(kafka_bootstrap, start_proxy, caplog):
    proxy = await start_proxy(kafka_bootstrap, [FactoryOf(EveryAction)])
    topic = await create_topic(kafka_bootstrap)

    # Forward (modified): every record gets a header; idempotence checks producer state
    sent = await produce(
        bootstrap_of(proxy), topic, 90, enable_idempotence=True, compression_type="gzip"
    )
    records = await consume(kafka_bootstrap, topic, 90)  # read directly from Kafka
    assert len(records) == len(sent)
    assert all(list(r.headers)[-1] == ("x-proxy", b"seen") for r in records)
    assert all(len(r.headers) == 4 for r in records)

    # send_request: the Fetch filter learnt the end offsets (30 per partition) out of band
    EveryAction.lag.clear()
    await consume(bootstrap_of(proxy), topic, 90)
    assert {tp[1]: end for tp, (end, _) in EveryAction.lag.items() if tp[0] == topic} == {
        0: 30,
        1: 30,
        2: 30,
    }

    # ErrorResponse
    denied = await create_topic(kafka_bootstrap, prefix="deny")
    with pytest.raises(TopicAuthorizationFailedError):
        await produce(bootstrap_of(proxy), denied, 1, request_timeout_ms=5000)

    # ShortCircuit, Drop, CloseConnection on a raw connection
    client = await RawClient.connect(bootstrap_of(proxy))
    listed = await client.call(codec.build(load_request_schema(ApiKey.LIST_GROUPS, 4)), 1)
    assert listed.groups == ()  # answered by the filter, not the broker
    client.send(codec.build(load_request_schema(ApiKey.DESCRIBE_GROUPS, 5), groups=("drop",)), 2)
    client.send(codec.build(load_request_schema(ApiKey.METADATA, 12)), 3)
    assert (await client.receive())[0] == 3
    with caplog.at_level(logging.INFO, logger="bergstream.proxy"):
        client.send(
            codec.build(load_request_schema(ApiKey.DESCRIBE_GROUPS, 5), groups=("close",)), 4
        )
        assert await client.closed_by_peer()
    assert any("asked to close" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- malformed input


async def test_malformed_frames_only_close_their_connection(kafka_bootstrap, start_proxy, caplog):
    proxy = await start_proxy(kafka_bootstrap)
    topic = await create_topic(kafka_bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_of(proxy))
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"before", partition=0)
        bad_inputs = [
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # garbage: a huge length
            struct.pack(">i", -5) + b"xxxx",
            struct.pack(">i", proxy.cluster.max_frame_bytes + 1),
            struct.pack(">i", 4) + b"abcd",  # shorter than a request header
        ]
        with caplog.at_level(logging.INFO, logger="bergstream.proxy"):
            for data in bad_inputs:
                client = await RawClient.connect(bootstrap_of(proxy))
                client.send_raw(data)
                assert await client.closed_by_peer(), data
            truncated = await RawClient.connect(bootstrap_of(proxy))
            frame = codec.encode_request(
                codec.make_request_header(ApiKey.METADATA, 12, 1, "x"),
                codec.build(load_request_schema(ApiKey.METADATA, 12)),
            )
            truncated.send_raw(frame[:-3])
            await truncated.close()
            await producer.send_and_wait(topic, b"after", partition=0)
        closing = [
            r.getMessage() for r in caplog.records if "malformed request frame" in r.getMessage()
        ]
        assert len(closing) == 4
        assert all(line.startswith("[vc 127.0.0.1:") for line in closing)
    finally:
        await producer.stop()
    values = [r.value for r in await consume(bootstrap_of(proxy), topic, 2)]
    assert values == [b"before", b"after"]


# ---------------------------------------------------------------- TLS toward clients


async def test_aiokafka_over_tls(kafka_bootstrap, start_proxy, tmp_path):
    cert, key = self_signed_cert(tmp_path)
    proxy = await start_proxy(
        kafka_bootstrap,
        advertised_host="localhost",
        tls={"cert_file": str(cert), "key_file": str(key)},
    )
    context = ssl.create_default_context(cafile=str(cert))
    topic = await create_topic(kafka_bootstrap)
    producer = AIOKafkaProducer(
        bootstrap_servers=f"localhost:{proxy.cluster.gateway.port}",
        security_protocol="SSL",
        ssl_context=context,
    )
    await producer.start()
    try:
        for i in range(20):
            await producer.send_and_wait(topic, b"tls-%d" % i, key=b"k", partition=i % 3)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=f"localhost:{proxy.cluster.gateway.port}",
        security_protocol="SSL",
        ssl_context=context,
        auto_offset_reset="earliest",
        group_id=uuid.uuid4().hex,
    )
    await consumer.start()
    got = []
    try:
        async with asyncio.timeout(60):
            _deadline = time.monotonic() + 120
            while len(got) < 20:
                assert time.monotonic() < _deadline, "records did not all arrive within 120 s"
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(m.value for m in messages)
    finally:
        await consumer.stop()
    assert sorted(got) == sorted(b"tls-%d" % i for i in range(20))


async def test_api_versions_newer_than_kio_is_capped_in_v0(kafka_bootstrap, start_proxy):
    """A client asking ApiVersions v9 gets the broker's v0 error answer, capped to kio."""
    from bergstream.core.proxy.versions import KIO_VERSIONS

    proxy = await start_proxy(kafka_bootstrap)
    client = await RawClient.connect(bootstrap_of(proxy))
    # header v2, no tags
    header = struct.pack(">hhih", ApiKey.API_VERSIONS, 9, 55, 3) + b"raw" + b"\x00"
    body = b"\x02a\x021\x00"  # client_software_name "a", version "1", no tags
    client.send_raw(struct.pack(">i", len(header) + len(body)) + header + body)
    client.sent[55] = (ApiKey.API_VERSIONS, 0)
    correlation_id, response = await client.receive()
    assert correlation_id == 55
    assert response.error_code == ErrorCode.unsupported_version
    assert response.api_keys
    for entry in response.api_keys:
        low, high = KIO_VERSIONS[entry.api_key]
        assert low <= entry.min_version <= entry.max_version <= high
    await client.close()
