"""The proxy counts requests and bytes per virtual cluster and API key on every path a frame
takes (raw pass-through, cut-through, decoded by a filter, answered by a filter, acks=0), and
its log lines carry the client; against a fake broker, in-process."""

from __future__ import annotations

import asyncio
import logging
import struct
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from bergstream.core.api import ApiKey
from bergstream.core.metrics import PROXY_BYTES, PROXY_REQUESTS
from bergstream.core.proxy import codec
from bergstream.core.proxy.api import ProxyFilter, ShortCircuit
from bergstream.core.proxy.server import ProxyServer
from bergstream.core.proxy.stats import PUBLISH_SECONDS, api_label, cluster_stats
from tests.kits.proxy import FactoryOf, FakeBroker, cluster_config, response_for

PRODUCE, METADATA = ApiKey.PRODUCE, ApiKey.METADATA
HEARTBEAT, LIST_GROUPS = ApiKey.HEARTBEAT, ApiKey.LIST_GROUPS


class AnswerHeartbeats(ProxyFilter):
    """Answers Heartbeat requests itself: they never reach the broker."""

    request_api_keys: ClassVar = frozenset({HEARTBEAT})

    async def on_request(self, header: Any, request: Any, context: Any) -> ShortCircuit:
        return ShortCircuit(response_for(HEARTBEAT, header.request_api_version))


@pytest.fixture
async def proxy() -> AsyncIterator[ProxyServer]:
    broker = await FakeBroker(
        handlers={LIST_GROUPS: lambda h, r: response_for(LIST_GROUPS, 4)}
    ).start()
    name = f"count-{uuid.uuid4().hex[:8]}"
    server = ProxyServer(
        cluster_config(broker.address, name=name), [FactoryOf(AnswerHeartbeats, name)]
    )
    await server.start()
    yield server
    await server.stop()
    await broker.stop()


def frame(request: Any, correlation_id: int, client_id: str = "metrics-test") -> bytes:
    key, version = request.__api_key__, request.__version__
    header = codec.make_request_header(key, version, correlation_id, client_id)
    return codec.encode_request(header, request)


def produce(acks: int) -> Any:
    schema = codec.request_schema(PRODUCE, 9)
    topic_type = codec.field_entity_type(schema, "topic_data")
    partition_type = codec.field_entity_type(topic_type, "partition_data")
    partition = codec.build(partition_type, index=0, records=b"")
    topic = codec.build(topic_type, name="t", partition_data=(partition,))
    return codec.build(schema, acks=acks, topic_data=(topic,))


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
    return struct.pack(">i", length) + await asyncio.wait_for(reader.readexactly(length), 5)


def value(metric: Any, **labels: str) -> float:
    return float(metric.labels(**labels)._value.get())


async def test_a_running_proxy_publishes_its_counts_by_itself(proxy: ProxyServer) -> None:
    cluster = proxy.cluster.name
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.cluster.gateway.port)
    writer.write(frame(codec.build_request(LIST_GROUPS, 4), 1))
    await read_frame(reader)
    writer.close()
    deadline = asyncio.get_running_loop().time() + 10 * PUBLISH_SECONDS
    while value(PROXY_REQUESTS, virtual_cluster=cluster, api_key="ListGroups") < 1:
        assert asyncio.get_running_loop().time() < deadline, "counts were never published"
        await asyncio.sleep(0.1)


async def test_stopping_publishes_what_is_left() -> None:
    broker = await FakeBroker(
        handlers={LIST_GROUPS: lambda h, r: response_for(LIST_GROUPS, 4)}
    ).start()
    name = f"stop-{uuid.uuid4().hex[:8]}"
    server = ProxyServer(cluster_config(broker.address, name=name))
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.cluster.gateway.port)
    writer.write(frame(codec.build_request(LIST_GROUPS, 4), 1))
    await read_frame(reader)
    writer.close()
    await server.stop()  # at once, well within PUBLISH_SECONDS
    await broker.stop()
    assert value(PROXY_REQUESTS, virtual_cluster=name, api_key="ListGroups") == 1


def test_api_labels_are_kafka_names() -> None:
    assert [api_label(k) for k in (0, 1, 2, 3, 18, 22)] == [
        "Produce",
        "Fetch",
        "ListOffsets",
        "Metadata",
        "ApiVersions",
        "InitProducerId",
    ]
    assert api_label(999) == api_label(-1) == "unknown"
    stats = cluster_stats(f"labels-{uuid.uuid4().hex[:6]}")
    assert stats.api(999) is stats.api(1000)  # one shared series for unknown keys
    assert 999 not in stats.by_key and stats.api(1) is stats.by_key[1]


async def test_every_request_and_response_path_is_counted(proxy: ProxyServer) -> None:
    cluster = proxy.cluster.name
    port = proxy.cluster.gateway.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = {
        LIST_GROUPS: [frame(codec.build_request(LIST_GROUPS, 4), 1)],  # cut through
        METADATA: [frame(codec.build_request(METADATA, 12), 2)],  # filtered response
        HEARTBEAT: [  # answered by a filter
            frame(codec.build_request(HEARTBEAT, 4, group_id="g"), cid) for cid in (3, 4)
        ],
        PRODUCE: [frame(produce(acks=0), 5), frame(produce(acks=1), 6)],  # one has no answer
    }
    for frames in sent.values():
        for item in frames:
            writer.write(item)
    received = [await read_frame(reader) for _ in range(5)]
    writer.close()
    ids = [struct.unpack_from(">i", item, 4)[0] for item in received]
    assert sorted(ids) == [1, 2, 3, 4, 6]
    by_id = dict(zip(ids, received, strict=True))
    # Connections count into plain integers; the server publishes them once a second (and when
    # it stops): publish now rather than wait.
    assert value(PROXY_REQUESTS, virtual_cluster=cluster, api_key="Heartbeat") == 0
    proxy.stats.publish()
    responses = {
        LIST_GROUPS: len(by_id[1]),
        METADATA: len(by_id[2]),
        HEARTBEAT: len(by_id[3]) + len(by_id[4]),
        PRODUCE: len(by_id[6]),
    }
    for key, frames in sent.items():
        api = api_label(key)
        assert value(PROXY_REQUESTS, virtual_cluster=cluster, api_key=api) == len(frames), api
        request_bytes = value(
            PROXY_BYTES, virtual_cluster=cluster, api_key=api, direction="request"
        )
        assert request_bytes == sum(len(item) for item in frames), api
        response_bytes = value(
            PROXY_BYTES, virtual_cluster=cluster, api_key=api, direction="response"
        )
        assert response_bytes == responses[key], api


async def test_connection_logs_name_the_cluster_the_peer_and_the_client_id(
    proxy: ProxyServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="bergstream.proxy"):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.cluster.gateway.port)
        peer = "127.0.0.1:{}".format(writer.get_extra_info("sockname")[1])
        writer.write(frame(codec.build_request(METADATA, 12), 1, client_id="billing-7"))
        await read_frame(reader)
        writer.close()
        await asyncio.sleep(0.2)
    records = [r for r in caplog.records if r.name == "bergstream.proxy"]
    connected = next(r for r in records if "client connected" in r.getMessage())
    assert (connected.component, connected.virtual_cluster, connected.client) == (  # type: ignore[attr-defined]
        "proxy",
        proxy.cluster.name,
        peer,
    )
    assert connected.getMessage().startswith(f"[{proxy.cluster.name} {peer}] ")
    later = [r for r in records if getattr(r, "client_id", None) == "billing-7"]
    assert later, "no line names the client.id after the first request"
    assert all(r.client == peer for r in later)  # type: ignore[attr-defined]
