"""The public filter test kit: FakeFilterContext answers out-of-band requests as the test says,
and wire_round_trip proves a message is valid for its API version (or fails)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from bergstream.core.api import (
    ApiKey,
    FakeFilterContext,
    build,
    build_request,
    build_response,
    field_entity_type,
    make_request_header,
    response_schema,
    wire_round_trip,
)
from bergstream.core.proxy.codec import CodecError


def _metadata_answer(request: Any) -> Any:
    return build_response(ApiKey.METADATA, request.__version__, controller_id=1)


async def _slow_metadata_answer(request: Any) -> Any:
    return _metadata_answer(request)


@pytest.mark.parametrize("upstream", [_metadata_answer, _slow_metadata_answer])
async def test_out_of_band_requests_are_recorded_and_answered(upstream: Any) -> None:
    context = FakeFilterContext(upstream=upstream)
    first = build_request(ApiKey.METADATA, 12, topics=None)
    second = build_request(ApiKey.METADATA, 9, topics=None)
    answers = [await context.send_request(first), await context.send_request(second)]
    assert context.sent == [first, second]
    assert [(a.__api_key__, a.__version__, a.controller_id) for a in answers] == [
        (ApiKey.METADATA, 12, 1),
        (ApiKey.METADATA, 9, 1),
    ]


async def test_a_request_nobody_answers_fails_the_test_naming_it() -> None:
    context = FakeFilterContext()
    request = build_request(ApiKey.LIST_OFFSETS, 7)
    with pytest.raises(AssertionError, match=r"ListOffsetsRequest.*upstream="):
        await context.send_request(request)
    assert context.sent == [request]


@pytest.mark.parametrize("version", [3, 9, 13])
def test_a_valid_request_comes_back_equal(version: int) -> None:
    header = make_request_header(ApiKey.PRODUCE, version, correlation_id=3, client_id="kit")
    request = build_request(ApiKey.PRODUCE, version, acks=-1)
    assert wire_round_trip(header, request) == request


def test_a_response_comes_back_equal_with_its_own_header_version() -> None:
    # ApiVersions responses always use header v0, Fetch v12 responses header v1.
    for key, version in ((ApiKey.API_VERSIONS, 3), (ApiKey.FETCH, 4), (ApiKey.FETCH, 12)):
        header = make_request_header(key, version, correlation_id=9, client_id="kit")
        response = build_response(key, version)
        if key == ApiKey.FETCH:
            topic_type = field_entity_type(response_schema(key, version), "responses")
            partition_type = field_entity_type(topic_type, "partitions")
            partition = build(partition_type, partition_index=2, records=b"")
            topic = build(topic_type, topic="t", partitions=(partition,))
            response = replace(response, responses=(topic,))
        assert wire_round_trip(header, response) == response


def test_an_invalid_message_fails() -> None:
    header = make_request_header(ApiKey.PRODUCE, 9, correlation_id=1, client_id="kit")
    request = replace(build_request(ApiKey.PRODUCE, 9), acks=70_000)  # not an int16
    with pytest.raises(CodecError):
        wire_round_trip(header, request)
