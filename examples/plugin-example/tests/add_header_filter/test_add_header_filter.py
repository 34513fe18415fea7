"""The ``add-header`` filter, driven with bergstream's filter test kit: no proxy, no broker.

:class:`FakeFilterContext` is the connection the filter runs on; :func:`wire_round_trip` encodes
what the filter forwards as the proxy would send it and decodes it back, so the test also proves
the rewritten request is a valid Produce request of its version.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest
from bergstream_example_plugin.add_header_filter import plugin
from bergstream_example_plugin.add_header_filter.filter import AddHeaderConfig, AddHeaderFilter

from bergstream.core.api import (
    ApiKey,
    BatchInfo,
    BergstreamConfig,
    FakeFilterContext,
    FilterFactoryContext,
    Forward,
    Record,
    batch_info,
    build,
    build_batch,
    field_entity_type,
    field_names,
    load_registry,
    make_request_header,
    read_records,
    request_schema,
    split_batches,
    wire_round_trip,
)

CONFIG = AddHeaderConfig(header="x-proxied-by", value="bergstream example")
ADDED = ("x-proxied-by", b"bergstream example")
GZIP = 1

#: Produce v3 (the first with v2 record batches), v9 (the first flexible one) and v13 (topics
#: named by id): the filter must not care which one a client speaks.
VERSIONS = [3, 9, 13]


def _records(base: int, count: int, *, headers: bool) -> list[Record]:
    return [
        Record(
            offset=base + i,
            timestamp=1_700_000_000_000 + i,
            key=b"k%d" % i if i % 2 else None,
            value=b"value %d" % i,
            headers=(("original", b"kept"), ("empty", None)) if headers else (),
        )
        for i in range(count)
    ]


#: Two batches in one partition's blob as an idempotent producer sends them (the second
#: gzip-compressed, its records with headers of their own), and a transactional one.
PLAIN = build_batch(_records(0, 3, headers=False), BatchInfo(producer_id=7, base_sequence=0))
COMPRESSED = build_batch(
    _records(3, 4, headers=True),
    BatchInfo(base_offset=3, compression_type=GZIP, producer_id=7, base_sequence=3),
)
TRANSACTIONAL = build_batch(
    _records(0, 2, headers=True),
    BatchInfo(is_transactional=True, producer_id=9, producer_epoch=2, base_sequence=0),
)


def produce_request(version: int) -> Any:
    """A Produce request of ``version``: two topics, one partition of which sends nothing."""
    request_type = request_schema(ApiKey.PRODUCE, version)
    topic_type = field_entity_type(request_type, "topic_data")
    partition_type = field_entity_type(topic_type, "partition_data")

    def topic(name: str, partitions: dict[int, bytes | None]) -> Any:
        by_id = "topic_id" in field_names(topic_type)
        ref = {"topic_id": uuid.uuid5(uuid.NAMESPACE_URL, name)} if by_id else {"name": name}
        data = tuple(build(partition_type, index=i, records=r) for i, r in partitions.items())
        return build(topic_type, **ref, partition_data=data)

    return build(
        request_type,
        transactional_id=None,
        acks=-1,
        topic_data=(
            topic("orders", {0: PLAIN + COMPRESSED, 1: None}),
            topic("payments", {2: TRANSACTIONAL}),
        ),
    )


def without_records(request: Any) -> Any:
    """``request`` with every partition's records left out: what the filter must not touch."""
    return replace(
        request,
        topic_data=tuple(
            replace(t, partition_data=tuple(replace(p, records=None) for p in t.partition_data))
            for t in request.topic_data
        ),
    )


def records_by_partition(request: Any) -> list[bytes | None]:
    """Each partition's records blob, in request order."""
    return [p.records for t in request.topic_data for p in t.partition_data]


@pytest.mark.parametrize("version", VERSIONS)
async def test_every_record_gets_the_header_and_nothing_else_changes(version: int) -> None:
    request = produce_request(version)
    header = make_request_header(ApiKey.PRODUCE, version, correlation_id=7, client_id="test")
    context = FakeFilterContext()

    action = await AddHeaderFilter(CONFIG).on_request(header, request, context)

    assert isinstance(action, Forward)
    forwarded = action.payload
    assert wire_round_trip(header, forwarded) == forwarded  # a valid Produce of this version
    assert context.sent == []  # no out-of-band request
    assert without_records(forwarded) == without_records(request)
    for before, after in zip(
        records_by_partition(request), records_by_partition(forwarded), strict=True
    ):
        if before is None:
            assert after is None
            continue
        old_batches, new_batches = list(split_batches(before)), list(split_batches(after))
        assert len(new_batches) == len(old_batches)
        for old, new in zip(old_batches, new_batches, strict=True):
            assert batch_info(new) == batch_info(old)  # offsets, compression, producer state
            expected = [replace(r, headers=(*r.headers, ADDED)) for r in read_records(old)]
            assert read_records(new) == expected


def test_the_registered_factory_makes_one_filter_per_connection() -> None:
    registry = load_registry([plugin], entry_points=False)
    registration = registry.get("filter", "add-header")
    config = registration.config_model.model_validate({"value": "v"})
    assert config.header == "x-bergstream"
    factory = registration.factory(config, FilterFactoryContext("c", BergstreamConfig(), registry))
    first, second = factory.create_filter(), factory.create_filter()
    assert isinstance(first, AddHeaderFilter) and first is not second
    # Only Produce requests are decoded; every other request and all responses pass as bytes.
    assert first.request_api_keys == {ApiKey.PRODUCE}
    assert not first.response_api_keys
