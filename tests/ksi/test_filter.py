"""The ksi filter against a fake upstream: Fetch split and merged, ListOffsets answered from
the coldset, topic ids resolved out of band, faults turned into retriable errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from kio.schema.errors import ErrorCode

from bergstream.core.api import ApiKey, FakeFilterContext
from bergstream.core.lake import ResolvedLake
from bergstream.core.plugins import PluginRegistry
from bergstream.core.proxy.api import ErrorResponse, FilterFactoryContext, Forward, ShortCircuit
from bergstream.core.proxy.codec import (
    build,
    decode_response,
    encode_response,
    field_entity_type,
    make_request_header,
    request_schema,
    response_schema,
)
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.filter import KsiFactory, KsiFilter, KsiSetupError
from tests.kits.coldset_tables import make_lake, make_record, write_cold
from tests.kits.ksi_filter import (
    ALL_TOPIC_OPERATIONS,
    BOUNDARY,
    HIGH_WATERMARK,
    TOPIC,
    TOPIC_ID,
    build_known,
    fake_upstream,
    fetch_request,
    ksi_factory,
    records_in,
)


@pytest.fixture
def lake(tmp_path: Path) -> ResolvedLake:
    lake = make_lake(tmp_path)
    rows = [(p, 0, make_record(o)) for p in (0, 1) for o in range(BOUNDARY)]
    write_cold(lake, TOPIC, rows, {0: BOUNDARY, 1: BOUNDARY}, rows_per_file=250)
    return lake


def _kafka_fetch_response(version: int, partitions: dict[int, int], topic: str = TOPIC) -> Any:
    """Kafka's answer: each partition with the error code given."""
    schema = response_schema(ApiKey.FETCH, version)
    topic_type = field_entity_type(schema, "responses")
    partition_type = field_entity_type(topic_type, "partitions")
    return build_known(
        schema,
        session_id=7,
        responses=(
            build_known(
                topic_type,
                topic=topic,
                topic_id=TOPIC_ID,
                partitions=tuple(
                    build_known(
                        partition_type,
                        partition_index=p,
                        error_code=code,
                        high_watermark=HIGH_WATERMARK,
                        log_start_offset=500,
                        records=b"",
                    )
                    for p, code in partitions.items()
                ),
            ),
        ),
    )


@pytest.mark.parametrize("version", [4, 11, 12, 13, 17, 18])
async def test_a_cold_fetch_is_answered_from_the_coldset(lake: ResolvedLake, version: int) -> None:
    factory = ksi_factory(lake)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    header, request = fetch_request(version, {0: 0, 1: 300})
    action = await KsiFilter(factory).on_request(header, request, context)
    assert isinstance(action, ShortCircuit)
    frame = encode_response(11, action.response)
    _, response = decode_response(1, version, frame[4:])
    (topic,) = response.responses
    parts = {p.partition_index: p for p in topic.partitions}
    assert records_in(parts[0]) == [make_record(o) for o in range(250)]  # one data file's rows
    assert records_in(parts[1])[0] == make_record(300)
    assert parts[0].high_watermark == HIGH_WATERMARK
    if version >= 5:
        assert parts[0].log_start_offset == 0
    await factory.close()


def _upstream_granting(operations: int | None, error_code: int = 0) -> Any:
    """``fake_upstream``, with Metadata telling this topic's authorized operations (or an error)."""

    async def upstream(request: Any) -> Any:
        if (
            request.__api_key__ != ApiKey.METADATA
            or not request.include_topic_authorized_operations
        ):
            return await fake_upstream(request)
        schema = response_schema(request.__api_key__, request.__version__)
        topic_type = field_entity_type(schema, "topics")
        return build(
            schema,
            topics=(
                build(
                    topic_type,
                    name=TOPIC,
                    topic_id=TOPIC_ID if error_code == 0 else None,
                    error_code=error_code,
                    topic_authorized_operations=operations if operations is not None else 0,
                ),
            ),
        )

    return upstream


@pytest.mark.parametrize(
    ("operations", "error_code"),
    [
        (ALL_TOPIC_OPERATIONS & ~(1 << 3), 0),  # may DESCRIBE, not READ
        (0, int(ErrorCode.topic_authorization_failed)),  # may not even DESCRIBE
    ],
    ids=["describe-only", "nothing"],
)
async def test_a_principal_kafka_would_not_let_read_gets_no_cold_offsets(
    lake: ResolvedLake, operations: int, error_code: int
) -> None:
    """The broker decides, on the client's own connection: KSI forwards the whole Fetch, so
    Kafka refuses the cold offsets exactly as it refuses hot ones."""
    factory = ksi_factory(lake)
    await factory.start()
    context = FakeFilterContext(upstream=_upstream_granting(operations, error_code))
    header, request = fetch_request(12, {0: 0, 1: 300})
    action = await KsiFilter(factory).on_request(header, request, context)
    assert isinstance(action, Forward)
    forwarded = [(p.partition, p.fetch_offset) for t in action.payload.topics for p in t.partitions]
    assert forwarded == [(0, 0), (1, 300)]  # every partition goes to Kafka, cold ones too
    (check,) = [r for r in context.sent if r.__api_key__ == ApiKey.METADATA]
    assert check.include_topic_authorized_operations
    assert [t.name for t in check.topics] == [TOPIC]
    await factory.close()


async def test_the_brokers_read_answer_is_cached_per_connection(lake: ResolvedLake) -> None:
    factory = ksi_factory(lake)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    ksi = KsiFilter(factory)
    for _ in range(3):
        header, request = fetch_request(12, {0: 0})
        assert isinstance(await ksi.on_request(header, request, context), ShortCircuit)
    checks = [r for r in context.sent if r.__api_key__ == ApiKey.METADATA]
    assert len(checks) == 1
    # Another connection (another principal, maybe) asks the broker itself.
    other = FakeFilterContext(upstream=_upstream_granting(0, 29))
    header, request = fetch_request(12, {0: 0})
    assert isinstance(await KsiFilter(factory).on_request(header, request, other), Forward)
    await factory.close()


async def test_an_unanswered_authorization_check_serves_nothing(lake: ResolvedLake) -> None:
    factory = ksi_factory(lake)
    await factory.start()

    async def no_metadata(request: Any) -> Any:
        if request.__api_key__ == ApiKey.METADATA:
            raise TimeoutError("no answer")
        return await fake_upstream(request)

    header, request = fetch_request(12, {0: 0})
    action = await KsiFilter(factory).on_request(
        header, request, FakeFilterContext(upstream=no_metadata)
    )
    assert isinstance(action, ErrorResponse)
    assert action.error_code == ErrorCode.kafka_storage_error
    await factory.close()


async def test_a_mixed_fetch_goes_half_upstream_and_comes_back_whole(lake: ResolvedLake) -> None:
    factory = ksi_factory(lake)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    ksi = KsiFilter(factory)
    header, request = fetch_request(13, {0: 10, 1: 700})
    action = await ksi.on_request(header, request, context)
    assert isinstance(action, Forward)
    forwarded = action.payload
    assert [p.partition for t in forwarded.topics for p in t.partitions] == [1]
    assert forwarded.session_id == 0 and forwarded.session_epoch == -1
    assert forwarded.max_wait.total_seconds() == 0  # cold records are waiting
    answer = await ksi.on_response(header, _kafka_fetch_response(13, {1: 0}), context)
    assert isinstance(answer, Forward)
    (topic,) = answer.payload.responses
    parts = {p.partition_index: p for p in topic.partitions}
    assert set(parts) == {0, 1}
    assert records_in(parts[0])[0] == make_record(10)
    assert parts[1].log_start_offset == 0  # coherent with what the coldset serves
    assert answer.payload.session_id == 0
    await factory.close()


async def test_hot_fetches_and_other_topics_pass(lake: ResolvedLake) -> None:
    factory = ksi_factory(lake)
    await factory.start()
    header, request = fetch_request(12, {0: BOUNDARY, 1: 900})
    action = await KsiFilter(factory).on_request(
        header, request, FakeFilterContext(upstream=fake_upstream)
    )
    assert isinstance(action, Forward)
    assert action.payload.topics == request.topics
    await factory.close()


async def test_max_bytes_bounds_the_cold_answer(lake: ResolvedLake) -> None:
    factory = ksi_factory(lake, batch_max_bytes=2048)
    await factory.start()
    header, request = fetch_request(12, {0: 0, 1: 0}, max_bytes=5000)
    action = await KsiFilter(factory).on_request(
        header, request, FakeFilterContext(upstream=fake_upstream)
    )
    assert isinstance(action, ShortCircuit)
    sizes = [len(p.records) for t in action.response.responses for p in t.partitions]
    assert 0 < sum(sizes) <= 5000
    await factory.close()


def _list_offsets(timestamps: dict[int, int], topic: str = TOPIC) -> tuple[Any, Any]:
    schema = request_schema(ApiKey.LIST_OFFSETS, 7)
    topic_type = field_entity_type(schema, "topics")
    partition_type = field_entity_type(topic_type, "partitions")
    request = build(
        schema,
        replica_id=-1,
        topics=(
            build(
                topic_type,
                name=topic,
                partitions=tuple(
                    build(partition_type, partition_index=p, timestamp=t, current_leader_epoch=-1)
                    for p, t in timestamps.items()
                ),
            ),
        ),
    )
    return make_request_header(ApiKey.LIST_OFFSETS, 7, 5, "client"), request


def _kafka_offsets(answers: dict[int, tuple[int, int]], topic: str = TOPIC) -> Any:
    schema = response_schema(ApiKey.LIST_OFFSETS, 7)
    topic_type = field_entity_type(schema, "topics")
    partition_type = field_entity_type(topic_type, "partitions")
    return build(
        schema,
        topics=(
            build(
                topic_type,
                name=topic,
                partitions=tuple(
                    build(partition_type, partition_index=p, offset=o, timestamp=t, leader_epoch=0)
                    for p, (o, t) in answers.items()
                ),
            ),
        ),
    )


async def test_list_offsets_earliest_and_by_time_reach_into_the_coldset(
    lake: ResolvedLake,
) -> None:
    factory = ksi_factory(lake)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    ksi = KsiFilter(factory)
    wanted = make_record(123).timestamp
    header, request = _list_offsets({0: -2, 1: wanted})
    assert isinstance(await ksi.on_request(header, request, context), Forward)
    kafka = _kafka_offsets({0: (500, -1), 1: (500, 1)})
    answer = await ksi.on_response(header, kafka, context)
    assert isinstance(answer, Forward)
    parts = {p.partition_index: p for p in answer.payload.topics[0].partitions}
    assert (parts[0].offset, parts[0].timestamp) == (0, -1)
    assert (parts[1].offset, parts[1].timestamp) == (123, wanted)
    # LATEST passes untouched
    header, request = _list_offsets({0: -1})
    assert isinstance(await ksi.on_request(header, request, context), Forward)
    kafka = _kafka_offsets({0: (HIGH_WATERMARK, -1)})
    answer = await ksi.on_response(header, kafka, context)
    assert isinstance(answer, Forward) and answer.payload == kafka
    await factory.close()


async def test_a_failing_coldset_gives_retriable_errors_never_a_silent_skip(
    lake: ResolvedLake,
) -> None:
    factory = ksi_factory(lake, catalog_error=True)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    ksi = KsiFilter(factory)
    header, request = fetch_request(12, {0: 0})
    action = await ksi.on_request(header, request, context)
    assert isinstance(action, Forward)  # Kafka may still hold the offset
    kafka = _kafka_fetch_response(12, {0: int(ErrorCode.offset_out_of_range)})
    answer = await ksi.on_response(header, kafka, context)
    assert isinstance(answer, Forward)
    (part,) = answer.payload.responses[0].partitions
    assert part.error_code == ErrorCode.kafka_storage_error  # retriable, no offset reset
    header, request = _list_offsets({0: -2})
    await ksi.on_request(header, request, context)
    answer = await ksi.on_response(header, _kafka_offsets({0: (500, -1)}), context)
    assert isinstance(answer, Forward)
    assert answer.payload.topics[0].partitions[0].error_code == ErrorCode.kafka_storage_error
    await factory.close()


async def test_an_internal_failure_answers_a_retriable_error(lake: ResolvedLake) -> None:
    factory = ksi_factory(lake)
    await factory.start()

    async def down(request: Any) -> Any:
        raise ConnectionError("upstream gone")

    header, request = fetch_request(13, {0: 0})
    action = await KsiFilter(factory).on_request(header, request, FakeFilterContext(upstream=down))
    assert isinstance(action, ErrorResponse)
    assert action.error_code == ErrorCode.kafka_storage_error
    await factory.close()


def test_the_filter_needs_a_lake_section() -> None:
    from bergstream.core.config import BergstreamConfig

    context = FilterFactoryContext("test", BergstreamConfig(), cast(PluginRegistry, None))
    with pytest.raises(KsiSetupError, match="lake: section"):
        KsiFactory(KsiConfig(topics=[TOPIC]), context)


def test_topics_take_names_or_mappings() -> None:
    config = KsiConfig(topics=["a", {"topic": "b", "table": "b_cold"}])
    assert config.table_of() == {"a": "a", "b": "b_cold"}
    with pytest.raises(ValueError, match="listed twice"):
        KsiConfig(topics=["a", "a"])


async def test_an_offset_below_the_coldset_goes_to_kafka(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    write_cold(lake, TOPIC, [(0, 0, make_record(o)) for o in range(100, 200)], {0: 200})
    factory = ksi_factory(lake)
    await factory.start()
    ksi = KsiFilter(factory)
    context = FakeFilterContext(upstream=fake_upstream)
    header, request = fetch_request(12, {0: 50})
    action = await ksi.on_request(header, request, context)
    assert isinstance(action, Forward)  # neither store may hold it: Kafka answers
    kafka = _kafka_fetch_response(12, {0: int(ErrorCode.offset_out_of_range)})
    answer = await ksi.on_response(header, kafka, context)
    assert isinstance(answer, Forward)
    assert answer.payload.responses[0].partitions[0].error_code == ErrorCode.offset_out_of_range
    await factory.close()


# ---------------------------------------------------------------------- which topics are served


@pytest.mark.parametrize("topics", [None, ("ord*",)], ids=["default", "pattern"])
@pytest.mark.parametrize("version", [12, 13])
async def test_a_topic_with_a_table_is_served_without_being_listed(
    lake: ResolvedLake, topics: tuple[str, ...] | None, version: int
) -> None:
    factory = ksi_factory(lake, topics=topics)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    ksi = KsiFilter(factory)
    header, request = fetch_request(version, {0: 0, 1: 300})
    action = await ksi.on_request(header, request, context)
    assert isinstance(action, ShortCircuit)
    parts = {p.partition_index: p for p in action.response.responses[0].partitions}
    assert records_in(parts[0])[0] == make_record(0)
    assert records_in(parts[1])[0] == make_record(300)
    header, request = _list_offsets({0: -2})
    assert isinstance(await ksi.on_request(header, request, context), Forward)
    answer = await ksi.on_response(header, _kafka_offsets({0: (500, -1)}), context)
    assert isinstance(answer, Forward)
    assert answer.payload.topics[0].partitions[0].offset == 0
    await factory.close()


async def test_without_topics_a_topic_without_a_table_passes_through(lake: ResolvedLake) -> None:
    factory = ksi_factory(lake, topics=None)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    ksi = KsiFilter(factory)
    header, request = fetch_request(12, {0: 0}, topic="clicks")
    action = await ksi.on_request(header, request, context)
    assert isinstance(action, Forward) and action.payload.topics == request.topics
    kafka = _kafka_fetch_response(12, {0: int(ErrorCode.offset_out_of_range)}, topic="clicks")
    answer = await ksi.on_response(header, kafka, context)
    assert isinstance(answer, Forward) and answer.payload == kafka  # Kafka's answer stands
    header, request = _list_offsets({0: -2}, topic="clicks")
    assert isinstance(await ksi.on_request(header, request, context), Forward)
    kafka = _kafka_offsets({0: (500, -1)}, topic="clicks")
    answer = await ksi.on_response(header, kafka, context)
    assert isinstance(answer, Forward) and answer.payload == kafka
    await factory.close()


async def test_fetch_sessions_stay_on_until_a_served_topic_is_fetched(
    lake: ResolvedLake,
) -> None:
    """KIP-227: a connection fetching only topics KSI does not serve keeps its fetch session
    (incremental fetches pass as they are); once it fetches a served topic, its Fetches go
    without a session, also those of other topics."""
    factory = ksi_factory(lake)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    ksi = KsiFilter(factory)
    header, other = fetch_request(12, {0: 0}, topic="clicks")
    action = await ksi.on_request(header, other, context)
    assert isinstance(action, Forward) and action.payload == other
    assert (action.payload.session_id, action.payload.session_epoch) == (7, 3)
    header, hot = fetch_request(12, {0: BOUNDARY})
    action = await ksi.on_request(header, hot, context)
    assert isinstance(action, Forward)
    assert (action.payload.session_id, action.payload.session_epoch) == (0, -1)
    action = await ksi.on_request(header, other, context)
    assert isinstance(action, Forward) and action.payload.topics == other.topics
    assert (action.payload.session_id, action.payload.session_epoch) == (0, -1)
    # Another connection's filter keeps its sessions.
    action = await KsiFilter(factory).on_request(header, other, context)
    assert isinstance(action, Forward) and action.payload.session_id == 7
    await factory.close()


async def test_a_table_created_after_start_is_served_without_a_restart(tmp_path: Path) -> None:
    lake = make_lake(tmp_path)
    factory = ksi_factory(lake, topics=None, namespace_refresh_seconds=0.2)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    ksi = KsiFilter(factory)
    header, request = fetch_request(12, {0: 0})
    assert isinstance(await ksi.on_request(header, request, context), Forward)  # no table yet
    write_cold(lake, TOPIC, [(0, 0, make_record(o)) for o in range(100)], {0: 100})
    await asyncio.sleep(0.25)
    action = await ksi.on_request(header, request, context)
    assert isinstance(action, ShortCircuit)
    (part,) = action.response.responses[0].partitions
    assert records_in(part) == [make_record(o) for o in range(100)]
    await factory.close()


async def test_without_topics_a_failing_catalog_gives_retriable_errors(
    lake: ResolvedLake,
) -> None:
    factory = ksi_factory(lake, catalog_error=True, topics=None)
    await factory.start()
    context = FakeFilterContext(upstream=fake_upstream)
    ksi = KsiFilter(factory)
    header, request = fetch_request(12, {0: 0, 1: 900})
    action = await ksi.on_request(header, request, context)
    assert isinstance(action, Forward)  # Kafka may still hold the offsets
    kafka = _kafka_fetch_response(12, {0: int(ErrorCode.offset_out_of_range), 1: 0})
    answer = await ksi.on_response(header, kafka, context)
    assert isinstance(answer, Forward)
    parts = {p.partition_index: p for p in answer.payload.responses[0].partitions}
    assert parts[0].error_code == ErrorCode.kafka_storage_error  # retriable, no offset reset
    assert parts[1].error_code == ErrorCode.none  # what Kafka holds is served
    header, request = _list_offsets({0: -2})
    await ksi.on_request(header, request, context)
    answer = await ksi.on_response(header, _kafka_offsets({0: (500, -1)}), context)
    assert isinstance(answer, Forward)
    assert answer.payload.topics[0].partitions[0].error_code == ErrorCode.kafka_storage_error
    await factory.close()
