"""Connection mechanics against a fake broker: ids, order, filter actions, out-of-band, errors."""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import replace
from typing import ClassVar

import pytest
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
from tests.kits.proxy import FactoryOf, RawClient, response_for


def req(key: int, version: int, **values):
    return codec.build(load_request_schema(key, version), **values)


def metadata(version: int = 12, **values):
    return req(ApiKey.METADATA, version, **values)


def bootstrap_of(server) -> str:
    return f"127.0.0.1:{server.cluster.gateway.port}"


async def test_correlation_ids_are_renumbered_and_restored(fake_broker, start_proxy):
    proxy = await start_proxy(fake_broker.address)
    client = await RawClient.connect(bootstrap_of(proxy))
    ids = [1000, -7, 0, 2**31 - 1, 1000]
    for cid in ids:
        client.send(metadata(), cid)
    received = [(await client.receive())[0] for _ in ids]
    assert received == ids
    assert [h.correlation_id for h, _ in fake_broker.seen] == [1, 2, 3, 4, 5]
    await client.close()


async def test_metadata_lists_only_proxy_addresses(fake_broker, start_proxy):
    proxy = await start_proxy(fake_broker.address, advertised_host="proxy.test")
    client = await RawClient.connect(bootstrap_of(proxy))
    for version in (1, 9, 12, 13):
        response = await client.call(metadata(version))
        assert [(b.node_id, b.host, b.port) for b in response.brokers] == [
            (0, "proxy.test", proxy.cluster.gateway.first_broker_port())
        ]
    await client.close()


async def test_api_versions_are_capped(fake_broker, start_proxy):
    proxy = await start_proxy(fake_broker.address)
    client = await RawClient.connect(bootstrap_of(proxy))
    for version in (0, 3, 4):
        response = await client.call(req(ApiKey.API_VERSIONS, version), correlation_id=version + 10)
        keys = {e.api_key: (e.min_version, e.max_version) for e in response.api_keys}
        assert 999 not in keys and keys[ApiKey.PRODUCE] == (3, 13)
    await client.close()


async def test_produce_acks_zero_gets_no_response(fake_broker, start_proxy):
    proxy = await start_proxy(fake_broker.address)
    client = await RawClient.connect(bootstrap_of(proxy))
    client.send(req(ApiKey.PRODUCE, 9, acks=0), 5)
    client.send(req(ApiKey.PRODUCE, 3, acks=0, transactional_id="tx"), 6)
    client.send(req(ApiKey.PRODUCE, 9, acks=1), 7)
    client.send(metadata(), 8)
    assert (await client.receive())[0] == 7
    assert (await client.receive())[0] == 8
    assert [h.request_api_key for h, _ in fake_broker.seen] == [ApiKey.PRODUCE] * 3 + [
        ApiKey.METADATA
    ]
    await client.close()


class ShortCircuitListGroups(ProxyFilter):
    request_api_keys: ClassVar = frozenset({ApiKey.LIST_GROUPS})

    async def on_request(self, header, request, context):
        await asyncio.sleep(0.01)
        return ShortCircuit(
            response_for(ApiKey.LIST_GROUPS, header.request_api_version, error_code=0)
        )


async def test_short_circuit_keeps_response_order(fake_broker, start_proxy):
    async def slow_metadata(header, request):
        await asyncio.sleep(0.05)
        return fake_broker.default_response(header, request)

    fake_broker.handlers[ApiKey.METADATA] = slow_metadata
    proxy = await start_proxy(fake_broker.address, [FactoryOf(ShortCircuitListGroups)])
    client = await RawClient.connect(bootstrap_of(proxy))
    client.send(metadata(), 1)
    client.send(req(ApiKey.LIST_GROUPS, 4), 2)
    client.send(metadata(), 3)
    client.send(req(ApiKey.LIST_GROUPS, 4), 4)
    assert [(await client.receive())[0] for _ in range(4)] == [1, 2, 3, 4]
    assert all(h.request_api_key == ApiKey.METADATA for h, _ in fake_broker.seen)
    await client.close()


class Actions(ProxyFilter):
    """Acts on Produce requests by topic name: deny -> error, drop -> drop, close -> close,
    boom -> exception, rename -> forward a modified request."""

    request_api_keys: ClassVar = frozenset({ApiKey.PRODUCE})

    async def on_request(self, header, request, context):
        name = request.topic_data[0].name
        if name == "deny":
            return ErrorResponse(ErrorCode.topic_authorization_failed, "denied")
        if name == "drop":
            return Drop()
        if name == "close":
            return CloseConnection("closing on purpose")
        if name == "boom":
            raise RuntimeError("filter bug")
        if name == "rename":
            topic = replace(request.topic_data[0], name="renamed")
            return Forward(replace(request, topic_data=(topic,)))
        return Forward(request)


def produce(topic: str, acks: int = 1):
    schema = load_request_schema(ApiKey.PRODUCE, 9)
    topic_type = codec.field_entity_type(schema, "topic_data")
    partition_type = codec.field_entity_type(topic_type, "partition_data")
    return codec.build(
        schema,
        acks=acks,
        topic_data=(
            codec.build(
                topic_type,
                name=topic,
                partition_data=(codec.build(partition_type, index=0, records=b""),),
            ),
        ),
    )


async def test_filter_actions(fake_broker, start_proxy, caplog):
    proxy = await start_proxy(fake_broker.address, [FactoryOf(Actions)])
    client = await RawClient.connect(bootstrap_of(proxy))

    denied = await client.call(produce("deny"), 1)
    assert (
        denied.responses[0].partition_responses[0].error_code
        is ErrorCode.topic_authorization_failed
    )
    assert not fake_broker.seen

    await client.call(produce("rename"), 2)
    assert fake_broker.seen[-1][1].topic_data[0].name == "renamed"

    client.send(produce("drop"), 3)
    client.send(metadata(), 4)
    assert (await client.receive())[0] == 4
    assert [h.request_api_key for h, _ in fake_broker.seen] == [ApiKey.PRODUCE, ApiKey.METADATA]

    other = await RawClient.connect(bootstrap_of(proxy))
    with caplog.at_level(logging.DEBUG, logger="bergstream.proxy"):
        client.send(produce("close"), 5)
        assert await client.closed_by_peer()
        third = await RawClient.connect(bootstrap_of(proxy))
        third.send(produce("boom"), 6)
        assert await third.closed_by_peer()
    lines = [r.getMessage() for r in caplog.records if "closing connection" in r.getMessage()]
    assert any("[vc 127.0.0.1:" in line and "closing on purpose" in line for line in lines)
    failed = [r for r in caplog.records if "filter Actions failed" in r.getMessage()]
    assert failed and failed[0].levelno == logging.ERROR
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.DEBUG)
    assert (await other.call(metadata(), 9)).brokers  # unaffected
    await other.close()


class CountingFilter(ProxyFilter):
    """Counts Metadata requests it sees; tags responses' cluster_id."""

    request_api_keys: ClassVar = frozenset({ApiKey.METADATA})
    response_api_keys: ClassVar = frozenset({ApiKey.METADATA})

    def __init__(self, tag: str, seen: list[str]) -> None:
        self.tag = tag
        self.seen = seen

    async def on_request(self, header, request, context):
        self.seen.append(f"{self.tag}:req:{header.client_id}")
        return Forward(request)

    async def on_response(self, header, response, context):
        self.seen.append(f"{self.tag}:resp:{header.client_id}")
        return Forward(replace(response, cluster_id=f"{response.cluster_id or ''}{self.tag}"))


class OutOfBand(ProxyFilter):
    """On a Metadata request/response from the client, asks the broker for Metadata itself."""

    request_api_keys: ClassVar = frozenset({ApiKey.METADATA})
    response_api_keys: ClassVar = frozenset({ApiKey.METADATA})

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    async def on_request(self, header, request, context):
        if header.client_id != "bergstream-proxy":
            oob = await context.send_request(metadata(9), timeout=5)
            self.seen.append(f"oob-req:{oob.cluster_id}")
        return Forward(request)

    async def on_response(self, header, response, context):
        if header.client_id != "bergstream-proxy":
            oob = await context.send_request(metadata(4), timeout=5)
            return Forward(
                replace(response, cluster_id=f"{response.cluster_id}|oob={len(oob.brokers)}")
            )
        return Forward(response)


async def test_send_request_passes_only_later_filters(fake_broker, start_proxy):
    seen: list[str] = []
    factories = [
        FactoryOf(lambda: CountingFilter("A", seen)),
        FactoryOf(lambda: OutOfBand(seen)),
        FactoryOf(lambda: CountingFilter("B", seen)),
    ]
    proxy = await start_proxy(fake_broker.address, factories)
    client = await RawClient.connect(bootstrap_of(proxy))
    response = await client.call(metadata(), 1)
    # the client's request passes A, OutOfBand, B; the out-of-band ones only B
    assert seen == [
        "A:req:raw",
        "B:req:bergstream-proxy",
        "B:resp:bergstream-proxy",
        "oob-req:B",
        "B:req:raw",
        "B:resp:raw",
        "B:req:bergstream-proxy",  # sent from on_response: must not deadlock
        "B:resp:bergstream-proxy",
        "A:resp:raw",
    ]
    assert response.cluster_id == "B|oob=1A"
    await client.close()


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (struct.pack(">i", -1), "negative frame length"),
        (struct.pack(">i", 10_000_000), "exceeds the limit"),
        (struct.pack(">i", 3) + b"abc", "too short"),
        (b"\xde\xad\xbe\xef" * 4, "negative frame length"),
    ],
)
async def test_malformed_frames_close_only_that_connection(
    fake_broker, start_proxy, caplog, frame, reason
):
    proxy = await start_proxy(fake_broker.address)
    good = await RawClient.connect(bootstrap_of(proxy))
    await good.call(metadata(), 1)
    bad = await RawClient.connect(bootstrap_of(proxy))
    with caplog.at_level(logging.INFO, logger="bergstream.proxy"):
        bad.send_raw(frame)
        assert await bad.closed_by_peer()
        await asyncio.sleep(0.05)
    lines = [r.getMessage() for r in caplog.records if reason in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("[vc 127.0.0.1:")
    assert "malformed request frame" in lines[0]
    assert (await good.call(metadata(), 2)).brokers
    await good.close()


async def test_truncated_frame_then_close(fake_broker, start_proxy):
    proxy = await start_proxy(fake_broker.address)
    bad = await RawClient.connect(bootstrap_of(proxy))
    frame = codec.encode_request(codec.make_request_header(ApiKey.METADATA, 12, 1, "x"), metadata())
    bad.send_raw(frame[: len(frame) // 2])
    await bad.close()
    await asyncio.sleep(0.05)
    assert not proxy.connections or all(c._closing for c in proxy.connections)
    good = await RawClient.connect(bootstrap_of(proxy))
    assert (await good.call(metadata(), 2)).brokers
    await good.close()


async def test_undecodable_request_a_filter_wants_closes(fake_broker, start_proxy, caplog):
    proxy = await start_proxy(fake_broker.address, [FactoryOf(Actions)])
    client = await RawClient.connect(bootstrap_of(proxy))
    header = codec.make_request_header(ApiKey.PRODUCE, 9, 1, "x")
    frame = codec.encode_request(header, produce("t"))
    broken = frame[:-6] + b"\xff\xff\xff\xff\xff\xff"
    with caplog.at_level(logging.INFO, logger="bergstream.proxy"):
        client.send_raw(struct.pack(">i", len(broken) - 4) + broken[4:])
        assert await client.closed_by_peer()
    assert any("malformed request a filter asked for" in r.getMessage() for r in caplog.records)


async def test_broker_ports_route_to_their_node(fake_broker, start_proxy, caplog):
    proxy = await start_proxy(fake_broker.address)
    gateway = proxy.cluster.gateway
    client = await RawClient.connect(f"127.0.0.1:{gateway.broker_port(0)}")
    assert (await client.call(metadata(), 1)).brokers
    assert proxy.target.nodes == {0: ("127.0.0.1", fake_broker.port)}
    await client.close()
    missing = await RawClient.connect(f"127.0.0.1:{gateway.broker_port(2)}")
    with caplog.at_level(logging.INFO, logger="bergstream.proxy"):
        assert await missing.closed_by_peer()
    assert any(
        "node 2 is not in the target cluster's metadata" in r.getMessage() for r in caplog.records
    )


async def test_node_outside_port_range_is_logged_clearly(fake_broker, start_proxy, caplog):
    fake_broker.extra_nodes[40] = ("127.0.0.1", 1)
    proxy = await start_proxy(fake_broker.address, broker_count=2)
    client = await RawClient.connect(bootstrap_of(proxy))
    with caplog.at_level(logging.INFO, logger="bergstream.proxy"):
        client.send(metadata(), 1)
        assert await client.closed_by_peer()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "node id 40" in errors[0].getMessage() and "broker_count" in errors[0].getMessage()


async def test_unreachable_target_closes_client_with_log(start_proxy, caplog):
    from tests.kits.proxy import free_port_block

    proxy = await start_proxy(f"127.0.0.1:{free_port_block(1)}")
    client = await RawClient.connect(bootstrap_of(proxy))
    with caplog.at_level(logging.INFO, logger="bergstream.proxy"):
        assert await client.closed_by_peer()
    assert any("cannot connect to the target cluster" in r.getMessage() for r in caplog.records)


async def test_unknown_correlation_id_from_broker_closes(fake_broker, start_proxy, caplog):
    fake_broker.handlers[ApiKey.HEARTBEAT] = lambda header, request: struct.pack(">ii", 4, 123456)
    proxy = await start_proxy(fake_broker.address)
    client = await RawClient.connect(bootstrap_of(proxy))
    with caplog.at_level(logging.INFO, logger="bergstream.proxy"):
        client.send(req(ApiKey.HEARTBEAT, 4, group_id="g"), 1)
        assert await client.closed_by_peer()
    assert any("unknown correlation id 123456" in r.getMessage() for r in caplog.records)


async def test_large_response_is_cut_through_intact(fake_broker, start_proxy):
    payload = bytes(range(256)) * 40_000  # ~10 MB of records
    schema_key, version = 1, 12  # Fetch v12: nobody filters it, so it is cut through

    def fetch(header, request):
        topic = codec.field_entity_type(codec.response_schema(ApiKey.FETCH, version), "responses")
        partition = codec.field_entity_type(topic, "partitions")
        return response_for(
            ApiKey.FETCH,
            version,
            responses=(
                codec.build(
                    topic,
                    topic="t",
                    partitions=(
                        codec.build(
                            partition, partition_index=0, high_watermark=1, records=payload
                        ),
                    ),
                ),
            ),
        )

    fake_broker.handlers[schema_key] = fetch
    proxy = await start_proxy(fake_broker.address)
    client = await RawClient.connect(bootstrap_of(proxy), limit=64 * 1024)
    for cid in range(3):
        client.send(req(ApiKey.FETCH, version), cid)
    for cid in range(3):
        received, response = await client.receive(timeout=20)
        assert received == cid
        assert response.responses[0].partitions[0].records == payload
    await client.close()


async def test_slow_client_pauses_reading_from_the_broker(fake_broker, start_proxy):
    from bergstream.core.proxy.connection import WRITE_HIGH

    payload = b"z" * (3 * 1024 * 1024)

    def fetch(header, request):
        topic = codec.field_entity_type(codec.response_schema(ApiKey.FETCH, 12), "responses")
        partition = codec.field_entity_type(topic, "partitions")
        return response_for(
            ApiKey.FETCH,
            12,
            responses=(
                codec.build(
                    topic,
                    topic="t",
                    partitions=(
                        codec.build(
                            partition, partition_index=0, high_watermark=1, records=payload
                        ),
                    ),
                ),
            ),
        )

    fake_broker.handlers[ApiKey.FETCH] = fetch
    proxy = await start_proxy(fake_broker.address)
    client = await RawClient.connect(bootstrap_of(proxy), limit=64 * 1024)
    client.writer.transport.pause_reading()  # a client that stops reading
    for cid in range(12):  # ~36 MB of responses
        client.send(req(ApiKey.FETCH, 12), cid)
    [connection] = proxy.connections
    for _ in range(100):
        await asyncio.sleep(0.05)
        if "client-full" in connection._upstream_pauses:
            break
    assert "client-full" in connection._upstream_pauses
    buffered = connection._client.get_write_buffer_size() + len(connection._resp_q)
    assert buffered < WRITE_HIGH + 2 * len(payload)  # bounded, not 36 MB
    client.writer.transport.resume_reading()
    for cid in range(12):
        received, response = await client.receive(timeout=30)
        assert received == cid and response.responses[0].partitions[0].records == payload
    await client.close()
