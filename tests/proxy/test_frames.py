"""Frames: buffering, header peeks, correlation patching, Produce acks, header versions."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_request_schema

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec, frames
from bergstream.core.proxy.frames import ByteQueue, FrameError
from bergstream.core.proxy.versions import (
    KIO_VERSIONS,
    is_flexible,
    request_header_version,
    response_header_version,
)


def test_byte_queue_take_inside_one_chunk_is_a_view():
    queue = ByteQueue()
    data = b"0123456789"
    queue.append(data)
    piece = queue.take(4)
    assert isinstance(piece, memoryview) and piece.obj is data
    assert bytes(piece) == b"0123" and len(queue) == 6


def test_byte_queue_take_across_chunks_joins():
    queue = ByteQueue()
    for part in (b"ab", b"cd", b"ef"):
        queue.append(part)
    assert queue.peek(3) == b"abc"
    assert queue.peek_int32(1) == struct.unpack(">i", b"bcde")[0]
    assert bytes(queue.take(5)) == b"abcde"
    assert [bytes(v) for v in queue.take_views(10)] == [b"f"]
    assert len(queue) == 0


@given(
    st.binary(min_size=0, max_size=300),
    st.lists(st.integers(1, 40), max_size=30),
    st.lists(st.integers(0, 50), max_size=30),
)
def test_byte_queue_preserves_bytes_under_any_chunking(data, cuts, takes):
    queue = ByteQueue()
    pos = 0
    for cut in cuts:
        queue.append(data[pos : pos + cut])
        pos += cut
    queue.append(data[pos:])
    out = b""
    for size in takes:
        size = min(size, len(queue))
        out += bytes(queue.take(size))
    out += b"".join(bytes(v) for v in queue.take_views(len(queue)))
    assert out == data


@pytest.mark.parametrize(
    ("length", "message"),
    [(-1, "negative"), (2000, "exceeds the limit of 1000"), (3, "too short")],
)
def test_check_length_rejects(length, message):
    with pytest.raises(FrameError, match=message):
        frames.check_length(length, 1000, 8)


def _request(api_key, version, cid=7, client_id="my-client", **values):
    request = codec.build(load_request_schema(api_key, version), **values)
    header = codec.make_request_header(api_key, version, cid, client_id)
    return codec.encode_request(header, request)[4:]


@pytest.mark.parametrize("version", [1, 2])
def test_peek_request_header(version):
    message = _request(ApiKey.METADATA, 12 if version == 2 else 4, cid=-5, client_id="cli")
    assert frames.peek_request(message) == (3, 12 if version == 2 else 4, -5)
    peek = frames.peek_request_header(message)
    assert peek.client_id == "cli" and peek.correlation_id == -5


def test_peek_request_header_null_client_id_and_short():
    message = _request(ApiKey.METADATA, 4, client_id=None)
    assert frames.peek_request_header(message).client_id is None
    with pytest.raises(FrameError):
        frames.peek_request(b"\x00\x03")
    with pytest.raises(FrameError, match="client_id"):
        frames.peek_request_header(message[:8] + b"\x00\x09abc")


def test_patch_and_prefixes():
    buffer = bytearray(12)
    frames.patch_correlation_id(buffer, -2, 8)
    assert struct.unpack_from(">i", buffer, 8)[0] == -2
    assert frames.request_prefix(10, 3, 12, 99) == struct.pack(">ihhi", 10, 3, 12, 99)
    assert frames.response_prefix(10, 99) == struct.pack(">ii", 10, 99)


@pytest.mark.parametrize("version", [3, 5, 7, 8, 9, 10, 11, 13])
@pytest.mark.parametrize("acks", [0, 1, -1])
@pytest.mark.parametrize("transactional_id", [None, "", "tx-1"])
def test_produce_acks(version, acks, transactional_id):
    message = _request(ApiKey.PRODUCE, version, acks=acks, transactional_id=transactional_id)
    assert frames.produce_acks(message, version) == acks


def test_produce_acks_truncated():
    message = _request(ApiKey.PRODUCE, 9, acks=1, transactional_id="tx")
    with pytest.raises(FrameError):
        frames.produce_acks(message[:14], 9)


def test_header_versions():
    assert response_header_version(ApiKey.API_VERSIONS, 3) == 0  # ApiVersions: always v0
    assert request_header_version(ApiKey.API_VERSIONS, 3) == 2
    assert (
        request_header_version(ApiKey.METADATA, 8) == 1
        and response_header_version(ApiKey.METADATA, 8) == 0
    )
    assert (
        request_header_version(ApiKey.METADATA, 9) == 2
        and response_header_version(ApiKey.METADATA, 9) == 1
    )
    assert is_flexible(ApiKey.FETCH, 99) is True  # above kio's range: as flexible as kio's highest
    assert is_flexible(12345, 0) is None
    assert response_header_version(12345, 0) is None
    assert KIO_VERSIONS[ApiKey.PRODUCE][0] == 3


def test_uvarint_and_tagged_fields():
    assert frames.read_uvarint(b"\x96\x01", 0) == (150, 2)
    assert frames.skip_tagged_fields(b"\x02\x00\x01X\x05\x02YZ", 0) == 8
    with pytest.raises(FrameError):
        frames.read_uvarint(b"\xff\xff\xff\xff\xff\xff", 0)
    with pytest.raises(FrameError):
        frames.skip_tagged_fields(b"\x01\x00\x05X", 0)


def test_take_frame():
    queue = ByteQueue()
    queue.append(struct.pack(">i", 10) + b"0123")
    assert frames.take_frame(queue, 100, 8) is None
    queue.append(b"456789" + struct.pack(">i", 3))
    assert bytes(frames.take_frame(queue, 100, 8)) == b"0123456789"
    with pytest.raises(FrameError, match="too short"):
        frames.take_frame(queue, 100, 8)  # refused before its body arrives
