"""Error responses mirror the request's topics and partitions, and encode."""

from __future__ import annotations

import uuid

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.errors import (
    ErrorResponseNotSupported,
    build_error_response,
    can_build_error_response,
)

CODE = ErrorCode.topic_authorization_failed


def _request(key, version, build_topics):
    schema = load_request_schema(key, version)
    header = codec.make_request_header(key, version, 1, "c")
    return header, build_topics(schema)


def _check_encodes(header, response):
    frame = codec.encode_response(header.correlation_id, response)
    key, version = header.request_api_key, header.request_api_version
    assert codec.decode_response(key, version, frame[4:])[1] == response


@pytest.mark.parametrize("version", [3, 9, 12, 13])
def test_produce(version):
    def topics(schema):
        topic_type = codec.field_entity_type(schema, "topic_data")
        partition_type = codec.field_entity_type(topic_type, "partition_data")
        ident = {"topic_id": uuid.uuid4()} if version >= 13 else {"name": "t1"}
        return codec.build(
            schema,
            acks=1,
            topic_data=(
                codec.build(
                    topic_type,
                    **ident,
                    partition_data=(
                        codec.build(partition_type, index=0, records=b""),
                        codec.build(partition_type, index=4, records=b""),
                    ),
                ),
            ),
        )

    header, request = _request(ApiKey.PRODUCE, version, topics)
    response = build_error_response(header, request, CODE, "no")
    topic = response.responses[0]
    assert [p.index for p in topic.partition_responses] == [0, 4]
    assert all(p.error_code is CODE and p.base_offset == -1 for p in topic.partition_responses)
    if version >= 13:
        assert topic.topic_id == request.topic_data[0].topic_id
    else:
        assert topic.name == "t1"
    _check_encodes(header, response)


@pytest.mark.parametrize("version", [4, 12, 13, 16, 18])
def test_fetch(version):
    def topics(schema):
        topic_type = codec.field_entity_type(schema, "topics")
        partition_type = codec.field_entity_type(topic_type, "partitions")
        ident = {"topic_id": uuid.uuid4()} if version >= 13 else {"topic": "t1"}
        return codec.build(
            schema,
            topics=(
                codec.build(
                    topic_type,
                    **ident,
                    partitions=(codec.build(partition_type, partition=3, fetch_offset=10),),
                ),
            ),
        )

    header, request = _request(ApiKey.FETCH, version, topics)
    response = build_error_response(header, request, CODE)
    partition = response.responses[0].partitions[0]
    assert partition.partition_index == 3 and partition.error_code is CODE
    assert partition.high_watermark == -1 and partition.records is None
    if version >= 7:
        assert response.error_code is CODE
    _check_encodes(header, response)


@pytest.mark.parametrize("version", [1, 5, 11])
def test_list_offsets(version):
    def topics(schema):
        topic_type = codec.field_entity_type(schema, "topics")
        partition_type = codec.field_entity_type(topic_type, "partitions")
        return codec.build(
            schema,
            topics=(
                codec.build(
                    topic_type,
                    name="t",
                    partitions=(
                        codec.build(partition_type, partition_index=1, timestamp=-2),
                        codec.build(partition_type, partition_index=2, timestamp=-1),
                    ),
                ),
            ),
        )

    header, request = _request(ApiKey.LIST_OFFSETS, version, topics)
    response = build_error_response(header, request, CODE)
    partitions = response.topics[0].partitions
    assert [p.partition_index for p in partitions] == [1, 2]
    assert all(p.error_code is CODE and p.offset == -1 for p in partitions)
    _check_encodes(header, response)


@pytest.mark.parametrize("version", [1, 9, 12, 13])
def test_metadata(version):
    def topics(schema):
        topic_type = codec.field_entity_type(schema, "topics")
        return codec.build(
            schema, topics=(codec.build(topic_type, name="a"), codec.build(topic_type, name="b"))
        )

    header, request = _request(ApiKey.METADATA, version, topics)
    response = build_error_response(header, request, CODE)
    assert [(t.name, t.error_code) for t in response.topics] == [("a", CODE), ("b", CODE)]
    assert response.brokers == ()
    _check_encodes(header, response)


def test_metadata_all_topics():
    header, request = _request(ApiKey.METADATA, 12, lambda schema: codec.build(schema, topics=None))
    response = build_error_response(header, request, CODE)
    assert response.topics == ()
    _check_encodes(header, response)


@pytest.mark.parametrize("version", [2, 8, 9, 10])
def test_offset_commit(version):
    def topics(schema):
        topic_type = codec.field_entity_type(schema, "topics")
        partition_type = codec.field_entity_type(topic_type, "partitions")
        ident = {"topic_id": uuid.uuid4()} if version >= 10 else {"name": "t"}
        return codec.build(
            schema,
            group_id="g",
            topics=(
                codec.build(
                    topic_type,
                    **ident,
                    partitions=(
                        codec.build(partition_type, partition_index=7, committed_offset=5),
                    ),
                ),
            ),
        )

    header, request = _request(ApiKey.OFFSET_COMMIT, version, topics)
    response = build_error_response(header, request, CODE)
    assert response.topics[0].partitions[0].partition_index == 7
    assert response.topics[0].partitions[0].error_code is CODE
    _check_encodes(header, response)


@pytest.mark.parametrize("version", [1, 7, 8, 10])
def test_offset_fetch(version):
    def topics(schema):
        if version >= 8:
            group_type = codec.field_entity_type(schema, "groups")
            topic_type = codec.field_entity_type(group_type, "topics")
            ident = {"topic_id": uuid.uuid4()} if version >= 10 else {"name": "t"}
            return codec.build(
                schema,
                groups=(
                    codec.build(
                        group_type,
                        group_id="g",
                        topics=(codec.build(topic_type, **ident, partition_indexes=(0, 1)),),
                    ),
                ),
            )
        topic_type = codec.field_entity_type(schema, "topics")
        return codec.build(
            schema,
            group_id="g",
            topics=(codec.build(topic_type, name="t", partition_indexes=(0, 1)),),
        )

    header, request = _request(ApiKey.OFFSET_FETCH, version, topics)
    response = build_error_response(header, request, CODE)
    if version >= 8:
        group = response.groups[0]
        assert group.group_id == "g" and group.error_code is CODE
        partitions = group.topics[0].partitions
    else:
        partitions = response.topics[0].partitions
    assert [(p.partition_index, p.error_code, p.committed_offset) for p in partitions] == [
        (0, CODE, -1),
        (1, CODE, -1),
    ]
    _check_encodes(header, response)


def test_top_level_error_code_apis():
    header, request = _request(
        ApiKey.HEARTBEAT, 4, lambda schema: codec.build(schema, group_id="g")
    )
    response = build_error_response(header, request, ErrorCode.rebalance_in_progress)
    assert response.error_code is ErrorCode.rebalance_in_progress
    header, request = _request(ApiKey.FIND_COORDINATOR, 3, codec.build)
    response = build_error_response(header, request, 15, "coordinator moved")
    assert response.error_message == "coordinator moved" and response.node_id == -1
    _check_encodes(header, response)


def test_unsupported_api_raises():
    # CreateTopics: per-topic errors only
    header, request = _request(ApiKey.CREATE_TOPICS, 7, codec.build)
    assert not can_build_error_response(ApiKey.CREATE_TOPICS, 7)
    with pytest.raises(ErrorResponseNotSupported, match="create_topics v7"):
        build_error_response(header, request, CODE)
    with pytest.raises(ValueError):
        build_error_response(*_request(ApiKey.HEARTBEAT, 4, codec.build), 31999)
