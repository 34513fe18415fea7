"""The kio codec: round trips, header versions, and how decode failures are classified."""

from __future__ import annotations

import struct
import uuid

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec


def _req(key, version, **values):
    return codec.build(load_request_schema(key, version), **values)


def _resp(key, version, **values):
    return codec.build(load_response_schema(key, version), **values)


@pytest.mark.parametrize(
    ("key", "version"),
    [
        (ApiKey.METADATA, 4),
        (ApiKey.METADATA, 12),
        (ApiKey.API_VERSIONS, 0),
        (ApiKey.API_VERSIONS, 3),
        (ApiKey.PRODUCE, 3),
        (ApiKey.PRODUCE, 9),
        (ApiKey.FETCH, 4),
        (ApiKey.FETCH, 17),
    ],
)
def test_request_round_trip(key, version):
    request = _req(key, version)
    header = codec.make_request_header(key, version, 42, "cid")
    frame = codec.encode_request(header, request)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    decoded_header, decoded = codec.decode_request(memoryview(frame)[4:])
    assert decoded == request
    assert decoded_header.correlation_id == 42 and decoded_header.client_id == "cid"
    assert type(decoded_header).__version__ == (2 if request.__flexible__ else 1)


def test_produce_request_with_records_round_trip():
    schema = load_request_schema(ApiKey.PRODUCE, 9)
    topic_type = codec.field_entity_type(schema, "topic_data")
    partition_type = codec.field_entity_type(topic_type, "partition_data")
    request = codec.build(
        schema,
        acks=-1,
        topic_data=(
            codec.build(
                topic_type,
                name="t",
                partition_data=(codec.build(partition_type, index=2, records=b"\x01" * 100),),
            ),
        ),
    )
    header = codec.make_request_header(ApiKey.PRODUCE, 9, 1, None)
    _, decoded = codec.decode_request(codec.encode_request(header, request)[4:])
    assert decoded.topic_data[0].partition_data[0].records == b"\x01" * 100


@pytest.mark.parametrize(
    ("key", "version", "header_size"), [(18, 3, 4), (3, 12, 5), (3, 8, 4), (1, 16, 5)]
)
def test_response_round_trip_and_header_version(key, version, header_size):
    response = _resp(key, version)
    frame = codec.encode_response(-9, response)
    # the body starts right after the header: v0 = correlation id, v1 adds a tag count byte
    body = frame[4 + header_size :]
    assert struct.unpack_from(">i", frame, 4)[0] == -9
    cid, decoded = codec.decode_response(key, version, frame[4:])
    assert (cid, decoded) == (-9, response)
    assert len(body) > 0


def test_metadata_response_round_trip_with_content():
    schema = load_response_schema(ApiKey.METADATA, 12)
    broker_type = codec.field_entity_type(schema, "brokers")
    topic_type = codec.field_entity_type(schema, "topics")
    response = codec.build(
        schema,
        brokers=(codec.build(broker_type, node_id=1, host="kafka-1", port=9092, rack="r"),),
        topics=(codec.build(topic_type, name="t", topic_id=uuid.uuid4(), error_code=3),),
        cluster_id="abc",
    )
    _, decoded = codec.decode_response(ApiKey.METADATA, 12, codec.encode_response(5, response)[4:])
    assert decoded == response
    assert decoded.topics[0].error_code is ErrorCode.unknown_topic_or_partition


def test_unknown_version_is_unsupported():
    with pytest.raises(codec.UnsupportedMessage):
        codec.decode_request(struct.pack(">hhih", 3, 99, 1, -1))
    with pytest.raises(codec.UnsupportedMessage):
        codec.decode_response(ApiKey.FETCH, 99, struct.pack(">i", 1))
    with pytest.raises(codec.UnsupportedMessage):
        codec.decode_request(struct.pack(">hhih", 4242, 0, 1, -1))


def test_unknown_tagged_field_is_unsupported():
    frame = codec.encode_response(3, _resp(ApiKey.METADATA, 12))
    # replace the payload's empty tag section (last byte) with one unknown tag 7
    message = frame[4:-1] + bytes([1, 7, 2, 0xAB, 0xCD])
    with pytest.raises(codec.UnsupportedMessage, match="tag"):
        codec.decode_response(ApiKey.METADATA, 12, message)


def test_unknown_error_code_is_unsupported():
    # heartbeat v3: throttle, error_code
    message = codec.encode_response(3, _resp(ApiKey.HEARTBEAT, 3))[4:]
    patched = message[:8] + struct.pack(">h", 32000) + message[10:]
    with pytest.raises(codec.UnsupportedMessage, match="ErrorCode"):
        codec.decode_response(ApiKey.HEARTBEAT, 3, patched)


@pytest.mark.parametrize("cut", [1, 5, 9])
def test_truncated_or_garbage_is_malformed(cut):
    frame = codec.encode_response(3, _resp(ApiKey.METADATA, 12, cluster_id="x" * 10))
    with pytest.raises(codec.MalformedMessage):
        codec.decode_response(ApiKey.METADATA, 12, frame[4:-cut])
    with pytest.raises(codec.MalformedMessage):
        codec.decode_response(ApiKey.METADATA, 12, frame[4:] + b"\x00" * cut)


def test_api_versions_unknown_version_decodes_as_v0():
    response = _resp(ApiKey.API_VERSIONS, 0, error_code=35)
    message = codec.encode_response(1, response)[4:]
    assert codec.decode_response(ApiKey.API_VERSIONS, 42, message) == (1, response)
    newer = codec.encode_response(1, _resp(ApiKey.API_VERSIONS, 3, api_keys=()))[4:] + b"\x07"
    with pytest.raises(codec.UnsupportedMessage):
        codec.decode_response(ApiKey.API_VERSIONS, 42, newer)


def test_encode_request_checks_header_against_payload():
    with pytest.raises(codec.CodecError, match="header says"):
        codec.encode_request(
            codec.make_request_header(ApiKey.METADATA, 11, 1, None), _req(ApiKey.METADATA, 12)
        )


def test_encode_request_fixes_header_class():
    header_v1 = codec.make_request_header(ApiKey.METADATA, 4, 1, "c")
    flexible = _req(ApiKey.METADATA, 12)
    header = type(header_v1)(
        request_api_key=ApiKey.METADATA, request_api_version=12, correlation_id=1, client_id="c"
    )
    decoded_header, _ = codec.decode_request(codec.encode_request(header, flexible)[4:])
    assert type(decoded_header).__version__ == 2


def test_build_fills_zeros_and_rejects_unknown_fields():
    response = _resp(ApiKey.FIND_COORDINATOR, 3, error_code=15)
    assert response.error_code is ErrorCode.coordinator_not_available
    assert response.host == "" and response.error_message is None
    with pytest.raises(TypeError, match="no fields"):
        codec.build(load_response_schema(ApiKey.FIND_COORDINATOR, 3), nope=1)
