"""KSI's out-of-band Kafka state: topic ids resolved once for concurrent connections, and the
broker's READ answers cached per connection."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from bergstream.core.api import ApiKey, build, field_entity_type, response_schema
from bergstream.plugins.ksi_fetch_filter.kafka_state import ReadAccess, TopicIds

TOPIC_ID = uuid.UUID(int=7)


def _metadata(request: Any, operations: int = -(2**31)) -> Any:
    schema = response_schema(ApiKey.METADATA, request.__version__)
    topic_type = field_entity_type(schema, "topics")
    return build(
        schema,
        topics=(
            build(
                topic_type, name="orders", topic_id=TOPIC_ID, topic_authorized_operations=operations
            ),
        ),
    )


async def test_concurrent_connections_wait_for_the_refresh_under_way() -> None:
    """Three connections (one per broker) see the same unknown topic id at once: one asks
    Kafka, the others wait for its answer instead of going on without the name."""
    ids = TopicIds()
    sent: list[Any] = []

    async def slow_send(request: Any) -> Any:
        sent.append(request)
        await asyncio.sleep(0.05)
        return _metadata(request)

    async def connection() -> str | None:
        await ids.resolve([TOPIC_ID], slow_send)
        return ids.name(TOPIC_ID)  # what this connection's Fetch is served with

    assert await asyncio.gather(*(connection() for _ in range(3))) == ["orders"] * 3
    assert len(sent) == 1


async def test_a_failed_refresh_releases_the_waiters() -> None:
    ids = TopicIds()

    async def failing(request: Any) -> Any:
        await asyncio.sleep(0.01)
        raise ConnectionError("gone")

    results = await asyncio.gather(
        *(ids.resolve([TOPIC_ID], failing) for _ in range(2)), return_exceptions=True
    )
    assert any(isinstance(r, ConnectionError) for r in results)
    assert ids.name(TOPIC_ID) is None


async def test_read_access_reads_the_read_bit_and_caches() -> None:
    sent: list[Any] = []

    async def send(request: Any) -> Any:
        sent.append(request)
        return _metadata(request, operations=1 << 8)  # DESCRIBE only

    access = ReadAccess(max_age_seconds=60)
    assert await access.readable({"orders"}, send) == set()
    assert await access.readable({"orders"}, send) == set()
    assert len(sent) == 1
    assert sent[0].include_topic_authorized_operations

    async def send_all(request: Any) -> Any:
        return _metadata(request, operations=(1 << 3) | (1 << 8))

    assert await ReadAccess(60).readable({"orders"}, send_all) == {"orders"}
