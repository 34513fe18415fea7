"""Cheap structural scans of large responses, to decide whether they need decoding at all.

Fetch v16+ and Produce v10+ responses may carry ``node_endpoints`` (KIP-951), a top-level tagged
field at the very end of the message, which the proxy must rewrite. It is only set when a leader
moved, so almost every response has none: walking the structure and skipping record bytes by
their length tells so without decoding (or copying) any records.
"""

from __future__ import annotations

import struct

from bergstream.core.proxy.frames import (
    Buffer,
    ChunkedBuffer,
    FrameError,
    read_uvarint,
    skip_tagged_fields,
)

_FETCH_TOP = 4 + 2 + 4  # throttle_time_ms, error_code, session_id
_FETCH_PARTITION = 4 + 2 + 8 + 8 + 8  # index, error, high watermark, last stable, log start
_PRODUCE_PARTITION = 4 + 2 + 8 + 8 + 8  # index, error, base offset, append time, log start


def _array_length(buffer: Buffer | ChunkedBuffer, pos: int) -> tuple[int, int]:
    size, pos = read_uvarint(buffer, pos)
    return size - 1, pos  # compact arrays store length + 1; 0 means null


def _skip_compact_bytes(buffer: Buffer | ChunkedBuffer, pos: int) -> int:
    size, pos = read_uvarint(buffer, pos)
    return pos + max(size - 1, 0)


def _has_top_level_tags(buffer: Buffer | ChunkedBuffer, pos: int) -> bool:
    count, end = read_uvarint(buffer, pos)
    if count == 0 and end != len(buffer):
        raise FrameError("bytes after the last field")
    return count > 0


def fetch_response_has_tags(message: Buffer | ChunkedBuffer) -> bool:
    """True unless a Fetch v13+ response message provably has no top-level tagged fields.

    ``message`` starts at the correlation id (response header v1). Any surprise in the layout
    answers True, so the caller falls back to a full decode.
    """
    try:
        pos = skip_tagged_fields(message, 4) + _FETCH_TOP
        topics, pos = _array_length(message, pos)
        for _ in range(topics):
            pos += 16  # topic_id
            partitions, pos = _array_length(message, pos)
            for _ in range(partitions):
                pos += _FETCH_PARTITION
                aborted, pos = _array_length(message, pos)
                for _ in range(aborted):
                    pos = skip_tagged_fields(message, pos + 16)
                pos += 4  # preferred_read_replica
                pos = _skip_compact_bytes(message, pos)
                pos = skip_tagged_fields(message, pos)
            pos = skip_tagged_fields(message, pos)
        return _has_top_level_tags(message, pos)
    except (FrameError, struct.error, IndexError):
        return True


def produce_response_has_tags(message: Buffer | ChunkedBuffer, api_version: int) -> bool:
    """True unless a Produce v9+ response message provably has no top-level tagged fields."""
    try:
        pos = skip_tagged_fields(message, 4)
        topics, pos = _array_length(message, pos)
        for _ in range(topics):
            pos = pos + 16 if api_version >= 13 else _skip_compact_bytes(message, pos)
            partitions, pos = _array_length(message, pos)
            for _ in range(partitions):
                pos += _PRODUCE_PARTITION
                errors, pos = _array_length(message, pos)
                for _ in range(errors):
                    pos = _skip_compact_bytes(message, pos + 4)
                    pos = skip_tagged_fields(message, pos)
                pos = _skip_compact_bytes(message, pos)  # error_message
                pos = skip_tagged_fields(message, pos)
            pos = skip_tagged_fields(message, pos)
        pos += 4  # throttle_time_ms
        return _has_top_level_tags(message, pos)
    except (FrameError, struct.error, IndexError):
        return True
