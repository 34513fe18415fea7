"""The connection's byte-level state machine under arbitrary chunking (no sockets).

Requests and responses are fed in random chunks; what reaches the broker and the client must
be exactly the frames sent, with correlation ids swapped, in order, whether a response was cut
through or buffered and decoded.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.connection import ProxyConnection
from tests.kits.proxy import cluster_config

CFG = cluster_config("127.0.0.1:1")


class CaptureTransport(asyncio.Transport):
    """Records writes; pretends to be a socket transport."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: Any) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name in ("peername", "sockname") else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


class FakeTarget:
    def __init__(self, upstream: CaptureTransport) -> None:
        self.upstream = upstream

    async def connect(self, factory, node_id):
        return self.upstream, factory(), ("127.0.0.1", 9092)

    def update_nodes(self, nodes) -> None:
        pass


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    out, pos = [], 0
    for cut in cuts:
        if pos >= len(data):
            break
        out.append(data[pos : pos + cut])
        pos += cut
    if pos < len(data):
        out.append(data[pos:])
    return out


def frames_of(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos)
        out.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
    assert pos == len(data)
    return out


def metadata_request_frame(cid: int) -> bytes:
    header = codec.make_request_header(ApiKey.METADATA, 12, cid, "c")
    return codec.encode_request(header, codec.build(load_request_schema(ApiKey.METADATA, 12)))


def metadata_response_message(upstream_cid: int, port: int) -> bytes:
    schema = load_response_schema(ApiKey.METADATA, 12)
    broker = codec.field_entity_type(schema, "brokers")
    response = codec.build(schema, brokers=(codec.build(broker, node_id=1, host="k", port=port),))
    return codec.encode_response(upstream_cid, response)[4:]


def fetch_response_message(upstream_cid: int, size: int, moved: bool) -> bytes:
    schema = load_response_schema(ApiKey.FETCH, 16)
    topic = codec.field_entity_type(schema, "responses")
    partition = codec.field_entity_type(topic, "partitions")
    endpoint = codec.field_entity_type(schema, "node_endpoints")
    response = codec.build(
        schema,
        responses=(
            codec.build(
                topic,
                topic_id=uuid.UUID(int=7),
                partitions=(
                    codec.build(
                        partition, partition_index=0, records=bytes(i % 249 for i in range(size))
                    ),
                ),
            ),
        ),
        node_endpoints=(codec.build(endpoint, node_id=2, host="k2", port=1),) if moved else (),
    )
    return codec.encode_response(upstream_cid, response)[4:]


request_item = st.one_of(
    st.tuples(
        st.just("fetch16"), st.integers(-(2**31), 2**31 - 1), st.booleans(), st.integers(0, 6000)
    ),
    st.tuples(
        st.just("opaque"),
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=50),
        st.integers(0, 5000).map(lambda n: bytes(i % 251 for i in range(n))),
    ),
    st.tuples(st.just("metadata"), st.integers(-(2**31), 2**31 - 1), st.just(b""), st.just(b"")),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(request_item, min_size=1, max_size=12),
    request_cuts=st.lists(st.integers(1, 700), max_size=40),
    response_cuts=st.lists(st.integers(1, 3000), max_size=40),
)
async def test_any_chunking_round_trips(items, request_cuts, response_cuts):
    client, upstream = CaptureTransport(), CaptureTransport()
    connection = ProxyConnection(cluster=CFG, target=FakeTarget(upstream), node_id=None)  # type: ignore[arg-type]
    connection.connection_made(client)
    await asyncio.sleep(0)

    wire = b""
    for kind, cid, body, _ in items:
        if kind == "opaque":
            message = struct.pack(">hhi", 12, 4, cid) + body  # Heartbeat: nobody filters it
        elif kind == "fetch16":
            header = codec.make_request_header(ApiKey.FETCH, 16, cid, "c")
            message = codec.encode_request(
                header, codec.build(load_request_schema(ApiKey.FETCH, 16))
            )[4:]
        else:
            message = metadata_request_frame(cid)[4:]
        wire += struct.pack(">i", len(message)) + message
    for chunk in split(wire, request_cuts):
        connection.data_received(chunk)
        await asyncio.sleep(0)
    sent = frames_of(bytes(upstream.data))
    assert len(sent) == len(items)
    for index, (message, (kind, _, body, _)) in enumerate(zip(sent, items, strict=True)):
        assert struct.unpack_from(">i", message, 4)[0] == index + 1  # the proxy's own ids
        if kind == "opaque":
            assert message[8:] == body
        elif kind == "fetch16":
            assert codec.decode_request(message)[0].client_id == "c"

    answer = b""
    for index, (kind, _, _, response_body) in enumerate(items):
        if kind == "opaque":
            message = struct.pack(">i", index + 1) + response_body
        elif kind == "fetch16":
            message = fetch_response_message(index + 1, response_body, moved=items[index][2])
        else:
            message = metadata_response_message(index + 1, 9092)
        answer += struct.pack(">i", len(message)) + message
    for chunk in split(answer, response_cuts):
        connection.upstream_data(chunk)
        for _ in range(3):
            await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)

    got = frames_of(bytes(client.data))
    assert len(got) == len(items)
    for index, (message, (kind, cid, body, response_body)) in enumerate(
        zip(got, items, strict=True)
    ):
        assert struct.unpack_from(">i", message)[0] == cid
        if kind == "opaque":
            assert message[4:] == response_body
        elif kind == "fetch16":
            original = fetch_response_message(index + 1, response_body, moved=body)
            if not body:
                assert message[4:] == original[4:]  # passed through untouched
            else:
                _, response = codec.decode_response(ApiKey.FETCH, 16, message)
                assert response.node_endpoints[0].port == CFG.gateway.broker_port(2)
                assert (
                    response.responses
                    == codec.decode_response(ApiKey.FETCH, 16, original)[1].responses
                )
        else:
            _, response = codec.decode_response(ApiKey.METADATA, 12, message)
            assert response.brokers[0].port == CFG.gateway.broker_port(1)
    assert not connection._inflight and not connection._slots
    connection.close()
