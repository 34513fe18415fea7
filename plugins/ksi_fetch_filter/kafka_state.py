"""What KSI asks Kafka out of band, cached per virtual cluster: topic ids (Fetch v13+ names
topics by id) and high watermarks / last stable offsets (for cold partitions' responses)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from bergstream.core.api import ApiKey, build, build_request, field_entity_type, request_schema

SendRequest = Callable[[Any], Awaitable[Any]]

#: ListOffsets timestamps with a special meaning.
LATEST = -1
EARLIEST = -2
_METADATA_VERSION = 12
_LIST_OFFSETS_VERSION = 7


class TopicIds:
    """Topic id -> name, refreshed with a Metadata request when an id is unknown."""

    def __init__(self, min_refresh_seconds: float = 1.0) -> None:
        self._names: dict[uuid.UUID, str] = {}
        self._refreshed = float("-inf")
        self._min_refresh = min_refresh_seconds
        self._pending: asyncio.Future[None] | None = None

    def name(self, topic_id: uuid.UUID) -> str | None:
        """The cached name of ``topic_id``."""
        return self._names.get(topic_id)

    def learn(self, topic_id: uuid.UUID, name: str) -> None:
        """Remember one pair."""
        self._names[topic_id] = name

    async def resolve(self, topic_ids: Iterable[uuid.UUID], send: SendRequest) -> None:
        """Make sure ``topic_ids`` are known, asking Kafka (all topics) at most once per
        ``min_refresh_seconds`` when some are not."""
        missing = [t for t in topic_ids if t not in self._names]
        if not missing:
            return
        if self._pending is not None:
            # Another connection is asking right now: its answer is the one to wait for
            # (returning early would leave this request's topics unnamed, so not served).
            await asyncio.shield(self._pending)
            return
        if time.monotonic() - self._refreshed < self._min_refresh:
            return
        self._refreshed = time.monotonic()
        self._pending = asyncio.get_running_loop().create_future()
        try:
            request = build_request(
                ApiKey.METADATA, _METADATA_VERSION, topics=None, allow_auto_topic_creation=False
            )
            response = await send(request)
            for topic in response.topics:
                if topic.error_code == ErrorCode.none and topic.name and topic.topic_id:
                    self.learn(topic.topic_id, topic.name)
        finally:
            self._pending.set_result(None)
            self._pending = None


class EndOffsets:
    """High watermark (read_uncommitted) or last stable offset (read_committed) per partition,
    asked with ListOffsets LATEST and reused for ``max_age_seconds``."""

    def __init__(self, max_age_seconds: float) -> None:
        self._max_age = max_age_seconds
        self._values: dict[tuple[str, int, int], tuple[int, float]] = {}

    async def get(
        self, wanted: Iterable[tuple[str, int]], isolation_level: int, send: SendRequest
    ) -> dict[tuple[str, int], int]:
        """End offset of each (topic, partition); partitions Kafka does not answer for are
        left out."""
        now = time.monotonic()
        out: dict[tuple[str, int], int] = {}
        ask: dict[str, list[int]] = {}
        for topic, partition in wanted:
            cached = self._values.get((topic, partition, isolation_level))
            if cached is not None and now - cached[1] <= self._max_age:
                out[(topic, partition)] = cached[0]
            else:
                ask.setdefault(topic, []).append(partition)
        if not ask:
            return out
        schema = request_schema(ApiKey.LIST_OFFSETS, _LIST_OFFSETS_VERSION)
        topic_type = field_entity_type(schema, "topics")
        partition_type = field_entity_type(topic_type, "partitions")
        request = build(
            schema,
            replica_id=-1,
            isolation_level=isolation_level,
            topics=tuple(
                build(
                    topic_type,
                    name=topic,
                    partitions=tuple(
                        build(
                            partition_type,
                            partition_index=p,
                            current_leader_epoch=-1,
                            timestamp=LATEST,
                        )
                        for p in partitions
                    ),
                )
                for topic, partitions in ask.items()
            ),
        )
        response = await send(request)
        for topic in response.topics:
            for partition in topic.partitions:
                if partition.error_code == ErrorCode.none and partition.offset >= 0:
                    key = (topic.name, partition.partition_index)
                    out[key] = partition.offset
                    self._values[(*key, isolation_level)] = (partition.offset, now)
        return out


#: AclOperation READ's bit in Metadata's ``topic_authorized_operations``.
_READ_BIT = 1 << 3
#: What a broker puts there when it did not compute the operations.
_OPERATIONS_OMITTED = -(2**31)


class ReadAccess:
    """Whether one client connection's principal may READ topics, as the broker decides it:
    a Metadata request with ``include_topic_authorized_operations`` sent on the client's own
    (authenticated) connection, each answer reused for ``max_age_seconds``.

    A topic the principal may not DESCRIBE comes back with TOPIC_AUTHORIZATION_FAILED; one it
    may describe but not read lacks the READ bit. Either way KSI serves none of its cold
    offsets and lets Kafka answer the Fetch, which refuses it the same way for every offset.
    """

    def __init__(self, max_age_seconds: float) -> None:
        self._max_age = max_age_seconds
        self._allowed: dict[str, tuple[bool, float]] = {}

    async def readable(self, topics: Iterable[str], send: SendRequest) -> set[str]:
        """The topics of ``topics`` the connection may read (asks Kafka for the ones not
        cached; a failed request raises, so nothing is served on a guess)."""
        now = time.monotonic()
        out: set[str] = set()
        ask: list[str] = []
        for topic in topics:
            cached = self._allowed.get(topic)
            if cached is not None and now - cached[1] <= self._max_age:
                if cached[0]:
                    out.add(topic)
            else:
                ask.append(topic)
        if not ask:
            return out
        schema = request_schema(ApiKey.METADATA, _METADATA_VERSION)
        topic_type = field_entity_type(schema, "topics")
        response = await send(
            build(
                schema,
                topics=tuple(build(topic_type, name=topic) for topic in sorted(set(ask))),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=True,
            )
        )
        answered: dict[str, bool] = {}
        for topic in response.topics:
            operations = topic.topic_authorized_operations
            answered[topic.name] = topic.error_code == ErrorCode.none and (
                operations == _OPERATIONS_OMITTED or bool(operations & _READ_BIT)
            )
        for topic in ask:
            allowed = answered.get(topic, False)
            self._allowed[topic] = (allowed, now)
            if allowed:
                out.add(topic)
        return out
