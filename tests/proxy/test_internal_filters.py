"""ApiVersions capping, broker address rewriting, and the node-endpoint scans."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema

from bergstream.core.config import GatewayConfig
from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy import codec
from bergstream.core.proxy.frames import ChunkedBuffer
from bergstream.core.proxy.internal_filters import (
    BrokerAddressRewrite,
    ProxyConfigError,
    cap_api_versions,
)
from bergstream.core.proxy.scan import fetch_response_has_tags, produce_response_has_tags
from bergstream.core.proxy.versions import KIO_VERSIONS

GATEWAY = GatewayConfig(
    host="0.0.0.0", advertised_host="proxy.example", port=19092, lowest_broker_id=1, broker_count=3
)


def _resp(key, version, **values):
    return codec.build(load_response_schema(key, version), **values)


def _entity(key, version, *path):
    entity = load_response_schema(key, version)
    for name in path:
        entity = codec.field_entity_type(entity, name)
    return entity


@pytest.mark.parametrize("version", [0, 3, 4])
def test_cap_api_versions(version):
    entry = _entity(ApiKey.API_VERSIONS, version, "api_keys")
    response = _resp(
        ApiKey.API_VERSIONS,
        version,
        api_keys=(
            # in order: wider than kio, inside kio, below kio's Fetch v4
            codec.build(entry, api_key=ApiKey.PRODUCE, min_version=0, max_version=50),
            codec.build(entry, api_key=ApiKey.METADATA, min_version=1, max_version=5),
            codec.build(entry, api_key=ApiKey.FETCH, min_version=0, max_version=2),
            codec.build(entry, api_key=777, min_version=0, max_version=1),  # unknown to kio
        ),
    )
    capped = cap_api_versions(response)
    assert [(e.api_key, e.min_version, e.max_version) for e in capped.api_keys] == [
        (ApiKey.PRODUCE, *KIO_VERSIONS[ApiKey.PRODUCE]),
        (ApiKey.METADATA, 1, 5),
    ]


@pytest.mark.parametrize("version", [1, 9, 12, 13])
def test_metadata_brokers_are_rewritten_and_reported(version):
    broker = _entity(ApiKey.METADATA, version, "brokers")
    response = _resp(
        ApiKey.METADATA,
        version,
        brokers=(
            codec.build(broker, node_id=1, host="k1.internal", port=9092, rack="a"),
            codec.build(broker, node_id=3, host="k3.internal", port=9094),
        ),
    )
    seen = {}
    rewritten = BrokerAddressRewrite(GATEWAY, "vc", seen.update).rewrite(ApiKey.METADATA, response)
    assert [(b.node_id, b.host, b.port) for b in rewritten.brokers] == [
        (1, "proxy.example", 19093),
        (3, "proxy.example", 19095),
    ]
    assert rewritten.brokers[0].rack == response.brokers[0].rack
    assert seen == {1: ("k1.internal", 9092), 3: ("k3.internal", 9094)}


def test_node_outside_range_is_a_clear_error():
    broker = _entity(ApiKey.METADATA, 12, "brokers")
    response = _resp(
        ApiKey.METADATA, 12, brokers=(codec.build(broker, node_id=7, host="k", port=1),)
    )
    with pytest.raises(ProxyConfigError, match=r"node id 7.*node ids 1\.\.3.*broker_count"):
        BrokerAddressRewrite(GATEWAY, "vc").rewrite(ApiKey.METADATA, response)


def test_find_coordinator_single_and_list():
    rewrite = BrokerAddressRewrite(GATEWAY, "vc")
    single = rewrite.rewrite(
        ApiKey.FIND_COORDINATOR, _resp(ApiKey.FIND_COORDINATOR, 3, node_id=2, host="k2", port=9093)
    )
    assert (single.host, single.port) == ("proxy.example", 19094)
    failed = _resp(ApiKey.FIND_COORDINATOR, 3, error_code=15, node_id=-1, host="", port=-1)
    assert rewrite.rewrite(ApiKey.FIND_COORDINATOR, failed) == failed
    coordinator = _entity(ApiKey.FIND_COORDINATOR, 6, "coordinators")
    listed = rewrite.rewrite(
        ApiKey.FIND_COORDINATOR,
        _resp(
            ApiKey.FIND_COORDINATOR,
            6,
            coordinators=(
                codec.build(coordinator, key="g", node_id=1, host="k1", port=9092),
                codec.build(coordinator, key="h", node_id=-1, host="", port=-1, error_code=15),
            ),
        ),
    )
    assert [(c.key, c.host, c.port) for c in listed.coordinators] == [
        ("g", "proxy.example", 19093),
        ("h", "", -1),
    ]


def test_describe_cluster():
    broker = _entity(ApiKey.DESCRIBE_CLUSTER, 1, "brokers")
    response = _resp(
        ApiKey.DESCRIBE_CLUSTER,
        1,
        brokers=(codec.build(broker, broker_id=2, host="k2", port=9093),),
    )
    out = BrokerAddressRewrite(GATEWAY, "vc").rewrite(ApiKey.DESCRIBE_CLUSTER, response)
    assert (out.brokers[0].host, out.brokers[0].port) == ("proxy.example", 19094)


def _fetch_response(version, *, endpoints=(), records=b"R" * 300, partitions=3):
    topic = _entity(ApiKey.FETCH, version, "responses")
    partition = _entity(ApiKey.FETCH, version, "responses", "partitions")
    leader = _entity(ApiKey.FETCH, version, "responses", "partitions", "current_leader")
    aborted = _entity(ApiKey.FETCH, version, "responses", "partitions", "aborted_transactions")
    endpoint = _entity(ApiKey.FETCH, version, "node_endpoints")
    return _resp(
        ApiKey.FETCH,
        version,
        session_id=5,
        responses=(
            codec.build(
                topic,
                topic_id=uuid.uuid4(),
                partitions=tuple(
                    codec.build(
                        partition,
                        partition_index=i,
                        high_watermark=100,
                        records=records,
                        aborted_transactions=(codec.build(aborted, producer_id=1, first_offset=2),)
                        if i == 1
                        else None,
                        current_leader=codec.build(leader, leader_id=2, leader_epoch=3)
                        if endpoints and i == 0
                        else codec.build(leader),
                    )
                    for i in range(partitions)
                ),
            ),
        ),
        node_endpoints=tuple(
            codec.build(endpoint, node_id=n, host=f"k{n}", port=9090 + n) for n in endpoints
        ),
    )


@pytest.mark.parametrize("version", [16, 17, 18])
def test_fetch_node_endpoints(version):
    rewrite = BrokerAddressRewrite(GATEWAY, "vc")
    assert not rewrite.wants_response(ApiKey.FETCH, 15) and rewrite.wants_response(
        ApiKey.FETCH, version
    )
    plain = codec.encode_response(1, _fetch_response(version))[4:]
    assert not rewrite.needs_decode(ApiKey.FETCH, version, plain)
    moved = _fetch_response(version, endpoints=(2,))
    message = codec.encode_response(1, moved)[4:]
    assert rewrite.needs_decode(ApiKey.FETCH, version, message)
    out = rewrite.rewrite(ApiKey.FETCH, codec.decode_response(ApiKey.FETCH, version, message)[1])
    assert [(e.node_id, e.host, e.port) for e in out.node_endpoints] == [
        (2, "proxy.example", 19094)
    ]
    assert out.responses == moved.responses


@pytest.mark.parametrize("version", [10, 11, 12, 13])
def test_produce_node_endpoints(version):
    rewrite = BrokerAddressRewrite(GATEWAY, "vc")
    assert not rewrite.wants_response(ApiKey.PRODUCE, 9) and rewrite.wants_response(
        ApiKey.PRODUCE, version
    )
    topic = _entity(ApiKey.PRODUCE, version, "responses")
    partition = _entity(ApiKey.PRODUCE, version, "responses", "partition_responses")
    error = _entity(ApiKey.PRODUCE, version, "responses", "partition_responses", "record_errors")
    endpoint = _entity(ApiKey.PRODUCE, version, "node_endpoints")
    ident = {"topic_id": uuid.uuid4()} if version >= 13 else {"name": "topic"}

    def response(endpoints):
        return _resp(
            ApiKey.PRODUCE,
            version,
            responses=(
                codec.build(
                    topic,
                    **ident,
                    partition_responses=(
                        codec.build(
                            partition,
                            index=0,
                            base_offset=5,
                            error_message="m",
                            record_errors=(
                                codec.build(error, batch_index=1, batch_index_error_message="x"),
                            ),
                        ),
                        codec.build(partition, index=1, base_offset=6),
                    ),
                ),
            ),
            node_endpoints=tuple(
                codec.build(endpoint, node_id=n, host="k", port=1) for n in endpoints
            ),
        )

    assert not rewrite.needs_decode(
        ApiKey.PRODUCE, version, codec.encode_response(1, response(()))[4:]
    )
    message = codec.encode_response(1, response((3,)))[4:]
    assert rewrite.needs_decode(ApiKey.PRODUCE, version, message)
    plain = codec.encode_response(1, response(()))[4:]
    assert all(produce_response_has_tags(plain[:-cut], version) for cut in range(1, 30))
    out = rewrite.rewrite(
        ApiKey.PRODUCE, codec.decode_response(ApiKey.PRODUCE, version, message)[1]
    )
    assert [(e.node_id, e.port) for e in out.node_endpoints] == [(3, 19095)]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([16, 17, 18]),
    st.lists(st.integers(0, 3), max_size=2, unique=True),
    st.binary(max_size=200),
    st.integers(0, 4),
    st.integers(1, 60),
)
def test_fetch_scan_agrees_with_kio(version, endpoints, records, partitions, cut):
    message = codec.encode_response(
        1,
        _fetch_response(
            version, endpoints=tuple(endpoints), records=records, partitions=partitions
        ),
    )[4:]
    assert fetch_response_has_tags(message) == bool(endpoints)
    # a truncated message never reads as "no tags": it must fall back to a full decode
    assert fetch_response_has_tags(message[:-cut]) is True
    chunks = [memoryview(message[i : i + 7]) for i in range(0, len(message), 7)]
    assert fetch_response_has_tags(ChunkedBuffer(chunks)) == bool(endpoints)
