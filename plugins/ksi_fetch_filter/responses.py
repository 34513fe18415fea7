"""Fetch and ListOffsets messages taken apart and put back together (kio dataclasses), for
every version the proxy's codec knows: Fetch v4-v18 (topics by id from v13), ListOffsets
v1-v11."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass, replace
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from bergstream.core.api import ApiKey, build, field_entity_type, field_names, response_schema

TopicRef = str | uuid.UUID
_NO_WAIT = i32Timedelta.parse(datetime.timedelta(0))


def uses_topic_ids(version: int) -> bool:
    """Fetch v13+ names topics by id."""
    return version >= 13


def topic_ref(topic: Any) -> TopicRef:
    """The name (Fetch < v13) or id (v13+) of a request or response topic entry."""
    return topic.topic_id if hasattr(topic, "topic_id") else topic.topic


@dataclass(frozen=True, slots=True)
class ColdPartition:
    """A partition response KSI builds itself."""

    partition: int
    error_code: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""


def _partition_response(partition_type: type[Any], cold: ColdPartition) -> Any:
    names = field_names(partition_type)
    values: dict[str, Any] = {
        "partition_index": cold.partition,
        "error_code": cold.error_code,
        "high_watermark": cold.high_watermark,
        "records": cold.records,
    }
    if "last_stable_offset" in names:
        values["last_stable_offset"] = cold.high_watermark
    if "log_start_offset" in names:
        values["log_start_offset"] = cold.log_start_offset
    if "preferred_read_replica" in names:
        values["preferred_read_replica"] = -1
    return build(partition_type, **values)


def _topic_key(topic_type: type[Any], ref: TopicRef) -> dict[str, Any]:
    return {"topic_id": ref} if "topic_id" in field_names(topic_type) else {"topic": ref}


def build_fetch_response(version: int, cold: dict[TopicRef, list[ColdPartition]]) -> Any:
    """A whole Fetch response made of KSI's partitions (no fetch session)."""
    response_type = response_schema(ApiKey.FETCH, version)
    topic_type = field_entity_type(response_type, "responses")
    partition_type = field_entity_type(topic_type, "partitions")
    topics = tuple(
        build(
            topic_type,
            **_topic_key(topic_type, ref),
            partitions=tuple(_partition_response(partition_type, p) for p in parts),
        )
        for ref, parts in cold.items()
    )
    return build(response_type, responses=topics)


def merge_fetch_response(
    response: Any,
    cold: dict[TopicRef, list[ColdPartition]],
    guarded: set[tuple[TopicRef, int]],
    log_starts: dict[tuple[TopicRef, int], int],
) -> Any:
    """Kafka's Fetch response with KSI's partitions added; for ``guarded`` partitions (the
    coldset failed, so Kafka alone cannot say an offset is gone) OFFSET_OUT_OF_RANGE becomes
    the retriable KAFKA_STORAGE_ERROR; the log start offset of served topics is lowered to the
    first cold offset. No fetch session is kept (session id 0)."""
    topic_type = field_entity_type(type(response), "responses")
    partition_type = field_entity_type(topic_type, "partitions")
    has_log_start = "log_start_offset" in field_names(partition_type)
    remaining = dict(cold)
    topics = []
    for topic in response.responses:
        ref = topic_ref(topic)
        partitions = []
        for part in topic.partitions:
            key = (ref, part.partition_index)
            if key in guarded and part.error_code == ErrorCode.offset_out_of_range:
                part = replace(part, error_code=ErrorCode.kafka_storage_error, records=b"")
            first = log_starts.get(key)
            if has_log_start and first is not None and part.log_start_offset > first:
                part = replace(part, log_start_offset=first)
            partitions.append(part)
        extra = remaining.pop(ref, [])
        partitions.extend(_partition_response(partition_type, p) for p in extra)
        topics.append(replace(topic, partitions=tuple(partitions)))
    for ref, parts in remaining.items():
        topics.append(
            build(
                topic_type,
                **_topic_key(topic_type, ref),
                partitions=tuple(_partition_response(partition_type, p) for p in parts),
            )
        )
    changes: dict[str, Any] = {"responses": tuple(topics)}
    if "session_id" in field_names(type(response)):
        changes["session_id"] = 0
    return replace(response, **changes)


def sessionless(request: Any) -> Any:
    """A Fetch request that asks for no fetch session (KIP-227: session 0, epoch -1), so the
    broker keeps no per-session partition state KSI's split requests would confuse."""
    if "session_id" not in field_names(type(request)):
        return request
    return replace(request, session_id=0, session_epoch=-1, forgotten_topics_data=())


def forward_fetch(request: Any, keep: set[tuple[TopicRef, int]], cold_bytes: int) -> Any | None:
    """The Fetch request for Kafka: only the partitions in ``keep``; no long poll and a smaller
    ``max_bytes`` when cold records are already on the way. None when nothing is left."""
    topics = []
    for topic in request.topics:
        ref = topic_ref(topic)
        partitions = tuple(p for p in topic.partitions if (ref, p.partition) in keep)
        if partitions:
            topics.append(replace(topic, partitions=partitions))
    if not topics:
        return None
    out = replace(sessionless(request), topics=tuple(topics))
    if cold_bytes:
        out = replace(out, max_wait=_NO_WAIT, max_bytes=max(out.max_bytes - cold_bytes, 1))
    return out


def list_offsets_answer(part: Any, offset: int, timestamp: int) -> Any:
    """A ListOffsets partition response answering ``offset`` (found in the coldset)."""
    changes: dict[str, Any] = {
        "error_code": ErrorCode.none,
        "offset": offset,
        "timestamp": timestamp,
    }
    if "leader_epoch" in field_names(type(part)):
        changes["leader_epoch"] = -1
    return replace(part, **changes)


def list_offsets_error(part: Any) -> Any:
    """A ListOffsets partition response with the retriable KAFKA_STORAGE_ERROR."""
    changes: dict[str, Any] = {
        "error_code": ErrorCode.kafka_storage_error,
        "offset": -1,
        "timestamp": -1,
    }
    if "leader_epoch" in field_names(type(part)):
        changes["leader_epoch"] = -1
    return replace(part, **changes)
