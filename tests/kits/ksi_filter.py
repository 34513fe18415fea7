"""The ksi filter against a fake upstream, in-process: a factory over a PyIceberg-written coldset
(:mod:`tests.kits.coldset_tables`), Kafka's side of out-of-band requests (Metadata with topic
ids, ListOffsets LATEST), Fetch requests of any version and the records of an answer."""

from __future__ import annotations

import uuid
from typing import Any, cast

from bergstream.core.api import ApiKey
from bergstream.core.lake import ResolvedLake
from bergstream.core.plugins import PluginRegistry
from bergstream.core.proxy.api import FilterFactoryContext
from bergstream.core.proxy.codec import (
    build,
    field_entity_type,
    field_names,
    make_request_header,
    request_schema,
    response_schema,
)
from bergstream.core.records import read_records, split_batches
from bergstream.plugins.ksi_fetch_filter.config import KsiConfig
from bergstream.plugins.ksi_fetch_filter.filter import KsiFactory
from tests.kits.coldset_tables import ksi_config_model

TOPIC = "orders"
TOPIC_ID = uuid.UUID(int=42)
HIGH_WATERMARK = 1_000
#: The coldset's boundary of the tests: offsets below it are cold.
BOUNDARY = 600


def ksi_factory(
    lake: ResolvedLake,
    catalog_error: bool = False,
    topics: tuple[str, ...] | None = (TOPIC,),
    **settings: Any,
) -> KsiFactory:
    """A factory serving ``topics`` (None: every topic with a table in the namespace)."""
    context = FilterFactoryContext("test", ksi_config_model(lake), cast(PluginRegistry, None))
    listed = None if topics is None else list(topics)
    factory = KsiFactory(KsiConfig(topics=listed, **settings), context)
    if catalog_error:

        def broken(_: ResolvedLake) -> Any:
            raise OSError("catalog unreachable")

        factory.store._catalog_factory = broken
    return factory


#: A topic's authorized operations for a principal allowed everything (what a broker answers:
#: READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS).
ALL_TOPIC_OPERATIONS = sum(1 << bit for bit in (3, 4, 5, 6, 7, 8, 10, 11))


async def fake_upstream(request: Any) -> Any:
    """Kafka's side of out-of-band requests: Metadata (topic ids) and ListOffsets LATEST."""
    schema = response_schema(request.__api_key__, request.__version__)
    if request.__api_key__ == ApiKey.METADATA:
        topic_type = field_entity_type(schema, "topics")
        return build(
            schema,
            topics=(
                build(
                    topic_type,
                    name=TOPIC,
                    topic_id=TOPIC_ID,
                    topic_authorized_operations=ALL_TOPIC_OPERATIONS,
                ),
            ),
        )
    topic_type = field_entity_type(schema, "topics")
    partition_type = field_entity_type(topic_type, "partitions")
    return build(
        schema,
        topics=tuple(
            build(
                topic_type,
                name=t.name,
                partitions=tuple(
                    build(
                        partition_type,
                        partition_index=p.partition_index,
                        offset=HIGH_WATERMARK,
                        timestamp=-1,
                    )
                    for p in t.partitions
                ),
            )
            for t in request.topics
        ),
    )


def build_known(entity_type: type[Any], **values: Any) -> Any:
    """``build`` with the values the entity's version has."""
    names = field_names(entity_type)
    return build(entity_type, **{k: v for k, v in values.items() if k in names})


def fetch_request(
    version: int, offsets: dict[int, int], max_bytes: int = 10**8, topic: str = TOPIC
) -> tuple[Any, Any]:
    """A Fetch request of ``version`` (header, body) for ``offsets`` (partition: fetch offset)
    of ``topic``."""
    schema = request_schema(ApiKey.FETCH, version)
    topic_type = field_entity_type(schema, "topics")
    partition_type = field_entity_type(topic_type, "partitions")
    request = build_known(
        schema,
        replica_id=-1,
        max_bytes=max_bytes,
        session_id=7,
        session_epoch=3,
        topics=(
            build_known(
                topic_type,
                topic=topic,
                topic_id=TOPIC_ID,
                partitions=tuple(
                    build_known(
                        partition_type,
                        partition=p,
                        fetch_offset=o,
                        partition_max_bytes=10**6,
                        current_leader_epoch=-1,
                    )
                    for p, o in offsets.items()
                ),
            ),
        ),
    )
    return make_request_header(ApiKey.FETCH, version, 11, "client"), request


def records_in(partition: Any) -> list[Any]:
    """The records of a Fetch response's partition."""
    return [r for batch in split_batches(partition.records) for r in read_records(batch)]
