"""Length-prefixed Kafka frames: buffering received bytes, peeking at headers, patching ids,
writing them out.

A Kafka frame is a big-endian int32 length followed by that many bytes, the *message*. A request
message starts with ``api_key:int16, api_version:int16, correlation_id:int32, client_id``; a
response message starts with ``correlation_id:int32``. Everything here works on bytes without
decoding the rest of the message, so the proxy's pass-through path never builds objects.
"""

from __future__ import annotations

import asyncio
import struct
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from bergstream.core.kafka_wire.api_keys import ApiKey
from bergstream.core.proxy.versions import is_flexible

LENGTH_SIZE = 4
#: Bytes of a request header the pass-through path reads: api_key, api_version, correlation_id.
REQUEST_PEEK_SIZE = 8
#: Smallest valid response message: the correlation id.
RESPONSE_PEEK_SIZE = 4

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_REQUEST_PEEK = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_REQUEST_PREFIX = struct.Struct(">ihhi")  # length, api_key, api_version, correlation_id
_RESPONSE_PREFIX = struct.Struct(">ii")  # length, correlation_id
#: Pieces smaller than this are joined into one write (one syscall).
_JOIN_BELOW = 64 * 1024

Buffer = bytes | bytearray | memoryview


class FrameError(Exception):
    """A frame or header is malformed: bad length, too short, truncated field."""


class RequestHeaderPeek(NamedTuple):
    """The fields of a request header, read straight from bytes."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class ByteQueue:
    """FIFO of received chunks that hands out byte ranges without copying when it can.

    Chunks are kept as memoryviews of the (immutable) ``bytes`` a transport delivered, so a range
    inside one chunk is returned as a zero-copy view; only a range spanning chunks is joined.
    """

    __slots__ = ("_chunks", "_size")

    def __init__(self) -> None:
        self._chunks: deque[memoryview] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, data: Buffer) -> None:
        """Queue received bytes (kept by reference: never mutate ``data`` afterwards)."""
        if data:
            self._chunks.append(data if isinstance(data, memoryview) else memoryview(data))
            self._size += len(data)

    def peek(self, size: int) -> bytes:
        """A copy of the first ``size`` bytes (fewer if fewer are queued); meant for headers."""
        first = self._chunks[0] if self._chunks else memoryview(b"")
        if len(first) >= size:
            return bytes(first[:size])
        out = bytearray()
        for chunk in self._chunks:
            out += chunk[: size - len(out)]
            if len(out) >= size:
                break
        return bytes(out)

    def peek_int32(self, offset: int = 0) -> int:
        """The big-endian int32 at ``offset``; the caller ensures enough bytes are queued."""
        first = self._chunks[0]
        if len(first) >= offset + 4:
            return _I32.unpack_from(first, offset)[0]
        return _I32.unpack_from(self.peek(offset + 4), offset)[0]

    def skip(self, size: int) -> None:
        """Drop the first ``size`` bytes."""
        self.take_views(size)

    def take(self, size: int) -> memoryview | bytes:
        """Remove and return the first ``size`` bytes; a view if they sit in one chunk."""
        if size > self._size:
            raise ValueError(f"take({size}) with only {self._size} bytes queued")
        if size == 0:
            return b""
        first = self._chunks[0] if self._chunks else memoryview(b"")
        if len(first) >= size:
            self._size -= size
            if len(first) == size:
                self._chunks.popleft()
                return first
            self._chunks[0] = first[size:]
            return first[:size]
        return b"".join(self.take_views(size))

    def take_views(self, size: int) -> list[memoryview]:
        """Remove up to ``size`` bytes and return them as views of the queued chunks."""
        out: list[memoryview] = []
        chunks = self._chunks
        while size > 0 and chunks:
            first = chunks[0]
            if len(first) <= size:
                chunks.popleft()
                out.append(first)
                size -= len(first)
                self._size -= len(first)
            else:
                out.append(first[:size])
                chunks[0] = first[size:]
                self._size -= size
                size = 0
        return out

    def clear(self) -> None:
        """Forget everything queued."""
        self._chunks.clear()
        self._size = 0


class ChunkedBuffer:
    """Random access to single bytes across a list of views, for scans that must not copy.

    Supports ``len()`` and integer indexing only: enough for varint-driven structural scans.
    """

    __slots__ = ("_length", "_starts", "_views")

    def __init__(self, views: list[memoryview]) -> None:
        self._views = views
        starts = []
        position = 0
        for view in views:
            starts.append(position)
            position += len(view)
        self._starts = starts
        self._length = position

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self._length:
            raise IndexError(index)
        chunk = bisect_right(self._starts, index) - 1
        return self._views[chunk][index - self._starts[chunk]]  # type: ignore[no-any-return]


def drop_prefix(views: list[memoryview], size: int) -> list[memoryview]:
    """The views without their first ``size`` bytes."""
    out = []
    for view in views:
        if size >= len(view):
            size -= len(view)
            continue
        out.append(view[size:] if size else view)
        size = 0
    return out


def write_pieces(transport: asyncio.WriteTransport, pieces: Sequence[Buffer]) -> None:
    """Write ``pieces`` in order; small neighbours are joined, large ones written as views."""
    if len(pieces) == 1:
        transport.write(pieces[0])
        return
    batch: list[Buffer] = []
    for piece in pieces:
        if len(piece) >= _JOIN_BELOW:
            if batch:
                transport.write(b"".join(batch) if len(batch) > 1 else batch[0])
                batch = []
            transport.write(piece)
        else:
            batch.append(piece)
    if batch:
        transport.write(b"".join(batch) if len(batch) > 1 else batch[0])


def check_length(length: int, max_size: int, min_size: int) -> None:
    """Raise :class:`FrameError` unless ``min_size <= length <= max_size``."""
    if length < 0:
        raise FrameError(f"negative frame length {length}")
    if length > max_size:
        raise FrameError(f"frame of {length} bytes exceeds the limit of {max_size} bytes")
    if length < min_size:
        raise FrameError(f"frame of {length} bytes is too short for a header ({min_size} bytes)")


def take_frame(queue: ByteQueue, max_size: int, min_size: int) -> memoryview | bytes | None:
    """Remove and return the next complete frame's message (without its length prefix).

    Returns None while the frame is incomplete; raises :class:`FrameError` as soon as the
    length prefix is readable and out of bounds, before the body arrives.
    """
    size = len(queue)
    if size < LENGTH_SIZE:
        return None
    length = queue.peek_int32()
    check_length(length, max_size, min_size)
    if size < LENGTH_SIZE + length:
        return None
    queue.skip(LENGTH_SIZE)
    return queue.take(length)


def peek_request(message: Buffer) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a request message."""
    if len(message) < REQUEST_PEEK_SIZE:
        raise FrameError(f"request header needs {REQUEST_PEEK_SIZE} bytes, got {len(message)}")
    api_key, api_version, correlation_id = _REQUEST_PEEK.unpack_from(message, 0)
    return api_key, api_version, correlation_id


def peek_request_header(message: Buffer) -> RequestHeaderPeek:
    """Read api key, version, correlation id and client id of a request message."""
    if len(message) < REQUEST_PEEK_SIZE + 2:
        raise FrameError(f"request header needs at least 10 bytes, got {len(message)}")
    api_key, api_version, correlation_id = _REQUEST_PEEK.unpack_from(message, 0)
    size = _I16.unpack_from(message, 8)[0]
    client_id = None
    if size >= 0:
        if 10 + size > len(message):
            raise FrameError("request header truncated inside client_id")
        try:
            client_id = bytes(message[10 : 10 + size]).decode()
        except UnicodeDecodeError as error:
            raise FrameError("client_id is not valid UTF-8") from error
    return RequestHeaderPeek(api_key, api_version, correlation_id, client_id)


def request_prefix(length: int, api_key: int, api_version: int, correlation_id: int) -> bytes:
    """Length prefix plus the first 8 header bytes of a request, with a new correlation id."""
    return _REQUEST_PREFIX.pack(length, api_key, api_version, correlation_id)


def response_prefix(length: int, correlation_id: int) -> bytes:
    """Length prefix plus the correlation id of a response."""
    return _RESPONSE_PREFIX.pack(length, correlation_id)


def patch_correlation_id(buffer: bytearray | memoryview, correlation_id: int, offset: int) -> None:
    """Overwrite the int32 correlation id at ``offset`` of a mutable buffer, in place."""
    _I32.pack_into(buffer, offset, correlation_id)


def read_uvarint(buffer: Buffer | ChunkedBuffer, pos: int) -> tuple[int, int]:
    """Read an unsigned varint at ``pos``; return ``(value, next_pos)``."""
    result = 0
    shift = 0
    try:
        while True:
            byte = buffer[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result, pos
            shift += 7
            if shift > 28:
                raise FrameError("unsigned varint longer than 5 bytes")
    except IndexError:
        raise FrameError("message truncated inside a varint") from None


def skip_tagged_fields(buffer: Buffer | ChunkedBuffer, pos: int) -> int:
    """Skip a tagged-field section (count, then tag/size/bytes each); return the next position."""
    count, pos = read_uvarint(buffer, pos)
    for _ in range(count):
        _, pos = read_uvarint(buffer, pos)
        size, pos = read_uvarint(buffer, pos)
        pos += size
    if pos > len(buffer):
        raise FrameError("message truncated inside tagged fields")
    return pos


def request_body_offset(message: Buffer, api_key: int, api_version: int) -> int:
    """Offset of the payload after the request header (v1 or v2 by the API's flexibility)."""
    if len(message) < 10:
        raise FrameError(f"request header needs at least 10 bytes, got {len(message)}")
    size = _I16.unpack_from(message, 8)[0]
    pos = 10 + max(size, 0)
    if pos > len(message):
        raise FrameError("request header truncated inside client_id")
    if is_flexible(api_key, api_version):
        pos = skip_tagged_fields(message, pos)
    return pos


def produce_acks(message: Buffer, api_version: int) -> int:
    """The ``acks`` of a Produce request message, read without decoding the records.

    v3+ puts ``transactional_id`` before ``acks``; flexible versions (v9+) use a compact string
    for it and a v2 request header with tagged fields.
    """
    pos = request_body_offset(message, ApiKey.PRODUCE, api_version)
    try:
        if api_version >= 3:
            if api_version >= 9:
                size, pos = read_uvarint(message, pos)
                pos += max(size - 1, 0)
            else:
                size = _I16.unpack_from(message, pos)[0]
                pos += 2 + max(size, 0)
        return _I16.unpack_from(message, pos)[0]
    except struct.error:
        raise FrameError("Produce request truncated before acks") from None
