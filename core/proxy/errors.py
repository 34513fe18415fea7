"""Error responses built from a request, for :class:`~bergstream.core.proxy.api.ErrorResponse`.

Every API whose response has a top-level ``error_code`` is supported generically. Produce, Fetch,
ListOffsets, Metadata, OffsetCommit and OffsetFetch also get per-topic/per-partition error slots
mirroring the request, as the broker would answer; any other API raises
:class:`ErrorResponseNotSupported`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.protocol import RequestHeader, RequestPayload, ResponsePayload

from bergstream.core.proxy.codec import build, field_entity_type, field_names, response_schema
from bergstream.core.proxy.versions import api_name


class ErrorResponseNotSupported(Exception):
    """The proxy cannot build an error response for this API."""


def _topic_key(source: Any, target_type: type[Any]) -> dict[str, Any]:
    """Copy whichever topic identity fields (``name``/``topic``/``topic_id``) both sides have."""
    names = field_names(target_type)
    out = {}
    for name in ("name", "topic", "topic_id"):
        if name in names and hasattr(source, name):
            out[name] = getattr(source, name)
    return out


def _top_level(
    response_type: type[Any], error_code: ErrorCode, message: str | None
) -> dict[str, Any]:
    names = field_names(response_type)
    values: dict[str, Any] = {}
    if "error_code" in names:
        values["error_code"] = error_code
    if "error_message" in names and message is not None:
        values["error_message"] = message
    return values


def _produce(request: Any, response_type: type[Any], code: ErrorCode, message: str | None) -> Any:
    topic_type = field_entity_type(response_type, "responses")
    partition_type = field_entity_type(topic_type, "partition_responses")
    extra = {"error_message": message} if "error_message" in field_names(partition_type) else {}
    topics = tuple(
        build(
            topic_type,
            **_topic_key(topic, topic_type),
            partition_responses=tuple(
                build(
                    partition_type,
                    index=partition.index,
                    error_code=code,
                    base_offset=-1,
                    **extra,
                )
                for partition in topic.partition_data
            ),
        )
        for topic in request.topic_data
    )
    return build(response_type, responses=topics)


def _fetch(request: Any, response_type: type[Any], code: ErrorCode, message: str | None) -> Any:
    topic_type = field_entity_type(response_type, "responses")
    partition_type = field_entity_type(topic_type, "partitions")
    names = field_names(partition_type)
    extra: dict[str, Any] = {"high_watermark": -1}
    if "last_stable_offset" in names:
        extra["last_stable_offset"] = -1
    if "log_start_offset" in names:
        extra["log_start_offset"] = -1
    topics = tuple(
        build(
            topic_type,
            **_topic_key(topic, topic_type),
            partitions=tuple(
                build(partition_type, partition_index=partition.partition, error_code=code, **extra)
                for partition in topic.partitions
            ),
        )
        for topic in request.topics
    )
    return build(response_type, responses=topics, **_top_level(response_type, code, message))


def _list_offsets(
    request: Any, response_type: type[Any], code: ErrorCode, message: str | None
) -> Any:
    topic_type = field_entity_type(response_type, "topics")
    partition_type = field_entity_type(topic_type, "partitions")
    names = field_names(partition_type)
    extra = {name: -1 for name in ("timestamp", "offset", "leader_epoch") if name in names}
    topics = tuple(
        build(
            topic_type,
            **_topic_key(topic, topic_type),
            partitions=tuple(
                build(
                    partition_type,
                    partition_index=partition.partition_index,
                    error_code=code,
                    **extra,
                )
                for partition in topic.partitions
            ),
        )
        for topic in request.topics
    )
    return build(response_type, topics=topics)


def _metadata(request: Any, response_type: type[Any], code: ErrorCode, message: str | None) -> Any:
    topic_type = field_entity_type(response_type, "topics")
    extra = {"controller_id": -1} if "controller_id" in field_names(response_type) else {}
    topics = tuple(
        build(topic_type, error_code=code, **_topic_key(topic, topic_type))
        for topic in request.topics or ()
    )
    return build(response_type, topics=topics, **extra, **_top_level(response_type, code, message))


def _commit_partitions(
    partition_type: type[Any], indexes: Iterable[int], code: ErrorCode
) -> tuple[Any, ...]:
    names = field_names(partition_type)
    extra = {name: -1 for name in ("committed_offset", "committed_leader_epoch") if name in names}
    return tuple(
        build(partition_type, partition_index=index, error_code=code, **extra) for index in indexes
    )


def _offset_commit(
    request: Any, response_type: type[Any], code: ErrorCode, message: str | None
) -> Any:
    topic_type = field_entity_type(response_type, "topics")
    partition_type = field_entity_type(topic_type, "partitions")
    topics = tuple(
        build(
            topic_type,
            **_topic_key(topic, topic_type),
            partitions=_commit_partitions(
                partition_type, (p.partition_index for p in topic.partitions), code
            ),
        )
        for topic in request.topics
    )
    return build(response_type, topics=topics, **_top_level(response_type, code, message))


def _offset_fetch_topics(topics: Any, topic_type: type[Any], code: ErrorCode) -> tuple[Any, ...]:
    partition_type = field_entity_type(topic_type, "partitions")
    return tuple(
        build(
            topic_type,
            **_topic_key(topic, topic_type),
            partitions=_commit_partitions(partition_type, topic.partition_indexes, code),
        )
        for topic in topics or ()
    )


def _offset_fetch(
    request: Any, response_type: type[Any], code: ErrorCode, message: str | None
) -> Any:
    names = field_names(response_type)
    if "groups" in names:
        group_type = field_entity_type(response_type, "groups")
        topic_type = field_entity_type(group_type, "topics")
        groups = tuple(
            build(
                group_type,
                group_id=group.group_id,
                topics=_offset_fetch_topics(group.topics, topic_type, code),
                error_code=code,
            )
            for group in request.groups
        )
        return build(response_type, groups=groups)
    topic_type = field_entity_type(response_type, "topics")
    return build(
        response_type,
        topics=_offset_fetch_topics(request.topics, topic_type, code),
        **_top_level(response_type, code, message),
    )


_MIRRORED: dict[int, Callable[[Any, type[Any], ErrorCode, str | None], Any]] = {
    0: _produce,
    1: _fetch,
    2: _list_offsets,
    3: _metadata,
    8: _offset_commit,
    9: _offset_fetch,
}


def can_build_error_response(api_key: int, api_version: int) -> bool:
    """True when :func:`build_error_response` supports this API version."""
    if api_key in _MIRRORED:
        return True
    try:
        return "error_code" in field_names(response_schema(api_key, api_version))
    except Exception:
        return False


def build_error_response(
    header: RequestHeader,
    request: RequestPayload,
    error_code: int,
    message: str | None = None,
) -> ResponsePayload:
    """Build the response to ``request`` that reports ``error_code`` in every error slot.

    Raises :class:`ErrorResponseNotSupported` for APIs that have neither a top-level error
    code nor a mirrored layout here, and ``ValueError`` for an error code kio does not know.
    """
    api_key = header.request_api_key
    api_version = header.request_api_version
    response_type = response_schema(api_key, api_version)
    code = ErrorCode(error_code)
    mirror = _MIRRORED.get(api_key)
    if mirror is not None:
        return mirror(request, response_type, code, message)  # type: ignore[no-any-return]
    values = _top_level(response_type, code, message)
    names = field_names(response_type)
    values.update({name: -1 for name in ("node_id", "port", "leader_id") if name in names})
    if "error_code" not in values:
        raise ErrorResponseNotSupported(
            f"cannot build an error response for {api_name(api_key)} v{api_version}: its "
            f"response has no top-level error_code"
        )
    return build(response_type, **values)
