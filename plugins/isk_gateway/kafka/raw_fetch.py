"""Fetch requests for bulk reads on connections of their own: each response is received straight
into one preallocated buffer, and its records are handed on as a view of that buffer.

A general client (aiokafka) grows a stream buffer chunk by chunk, copies the frame out of it and
copies the records out of the frame: three copies of every byte, which cost more CPU than
decoding the records. Here a response costs one receive into memory allocated once.

Fetch v4 (Kafka >= 0.11, still served by Kafka 4): read_committed, one partition per request.
Connections are pooled per broker; one request at a time per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass

import numpy as np

from bergstream.core.api import ApiKey
from bergstream.plugins.isk_gateway.kafka.buffers import pooled_array

__all__ = ["FetchConnections", "FetchError", "PartitionFetch"]

_VERSION = 4
_READ_COMMITTED = 1
_MAX_FRAME = 1 << 31
_IDLE_PER_BROKER = 4


class FetchError(Exception):
    """A Fetch that could not be sent or whose response could not be read."""


@dataclass(frozen=True)
class PartitionFetch:
    """One partition's part of a Fetch response: its error code, high watermark, last stable
    offset, aborted transactions ``(producer_id, first_offset)`` and records (a view)."""

    error_code: int
    high_watermark: int
    last_stable_offset: int
    aborted: tuple[tuple[int, int], ...]
    records: memoryview


def _encode_request(
    correlation_id: int, client_id: bytes, topic: bytes, partition: int, offset: int, size: int
) -> bytes:
    body = struct.pack(
        f">hhih{len(client_id)}s iiiib i h{len(topic)}s i iqi",
        ApiKey.FETCH, _VERSION, correlation_id, len(client_id), client_id,
        -1, 500, 1, size, _READ_COMMITTED,
        1, len(topic), topic,
        1, partition, offset, size,
    )  # fmt: skip
    return struct.pack(">i", len(body)) + body


class _Connection:
    """One socket to one broker."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.correlation_id = 0

    async def fetch(
        self,
        client_id: bytes,
        topic: bytes,
        partition: int,
        offset: int,
        size: int,
        into: np.ndarray | None,
    ) -> PartitionFetch:
        """Send one Fetch and read its response field by field, the records straight into the
        start of ``into`` when they fit (else into a buffer of their own)."""
        loop = asyncio.get_running_loop()
        self.correlation_id = (self.correlation_id + 1) & 0x7FFFFFFF
        request = _encode_request(self.correlation_id, client_id, topic, partition, offset, size)
        await loop.sock_sendall(self.sock, request)
        (length,) = struct.unpack(">i", await self._receive(loop, 4))
        if not 0 < length < _MAX_FRAME:
            raise FetchError(f"Fetch response of invalid length {length}")
        got, _throttle, topics, name_length = struct.unpack(">iiih", await self._receive(loop, 14))
        if got != self.correlation_id:
            raise FetchError(f"response to request {got}, expected {self.correlation_id}")
        if topics != 1 or name_length < 0:
            raise FetchError(f"{topics} topics in a one-partition response")
        fixed = await self._receive(loop, name_length + 30)
        partitions, _partition, error_code, high, stable, aborted_count = struct.unpack_from(
            ">iihqqi", fixed, name_length
        )
        if partitions != 1:
            raise FetchError(f"{partitions} partitions in a one-partition response")
        listed = await self._receive(loop, 16 * max(aborted_count, 0) + 4)
        aborted = tuple(struct.unpack_from(">qq", listed, 16 * i) for i in range(aborted_count))
        (records_size,) = struct.unpack_from(">i", listed, len(listed) - 4)
        records_size = max(records_size, 0)
        rest = length - 14 - len(fixed) - len(listed) - records_size
        if rest < 0:
            raise FetchError("Fetch response records run past the frame")
        if into is not None and records_size <= into.size:
            records = memoryview(into[:records_size]).cast("B")
            await self._receive(loop, records_size, records)
        else:
            records = await self._receive(loop, records_size)
        if rest:
            await self._receive(loop, rest)  # fields of later versions: none in v4
        return PartitionFetch(error_code, high, stable, aborted, records)

    async def _receive(
        self, loop: asyncio.AbstractEventLoop, size: int, view: memoryview | None = None
    ) -> memoryview:
        if view is None:
            view = memoryview(pooled_array(size)).cast("B")
        received = 0
        while received < size:
            count = await loop.sock_recv_into(self.sock, view[received:size])
            if not count:
                raise FetchError("the broker closed the connection")
            received += count
        return view

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class FetchConnections:
    """Pooled Fetch connections per broker address."""

    def __init__(self, client_id: str, timeout_seconds: float = 30.0) -> None:
        self._client_id = client_id.encode()
        self._timeout = timeout_seconds
        self._idle: dict[tuple[str, int], list[_Connection]] = {}

    async def fetch(
        self,
        address: tuple[str, int],
        topic: str,
        partition: int,
        offset: int,
        size: int,
        into: np.ndarray | None = None,
    ) -> PartitionFetch:
        """Fetch up to ``size`` bytes of ``topic``/``partition`` from ``offset`` on the broker at
        ``address``, read_committed, the records received into the start of ``into`` (a uint8
        array) if they fit; :class:`FetchError` on any connection or protocol error (the
        connection is then dropped)."""
        connection = await self._take(address)
        try:
            async with asyncio.timeout(self._timeout):
                result = await connection.fetch(
                    self._client_id, topic.encode(), partition, offset, size, into
                )
        except TimeoutError as error:
            connection.close()
            raise FetchError(
                f"Fetch from {address[0]}:{address[1]}: no whole response within "
                f"{self._timeout:g} s"
            ) from error
        except (OSError, FetchError) as error:
            connection.close()
            raise FetchError(f"Fetch from {address[0]}:{address[1]}: {error}") from error
        except BaseException:
            connection.close()
            raise
        idle = self._idle.setdefault(address, [])
        if len(idle) < _IDLE_PER_BROKER:
            idle.append(connection)
        else:
            connection.close()
        return result

    async def _take(self, address: tuple[str, int]) -> _Connection:
        idle = self._idle.get(address)
        if idle:
            return idle.pop()
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(*address, type=socket.SOCK_STREAM)
        except OSError as error:
            raise FetchError(f"resolve {address[0]}:{address[1]}: {error}") from error
        family, kind, proto, _name, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout(self._timeout):
                await loop.sock_connect(sock, sockaddr)
        except BaseException as error:
            sock.close()
            if isinstance(error, OSError | TimeoutError):
                raise FetchError(f"connect to {address[0]}:{address[1]}: {error}") from error
            raise
        return _Connection(sock)

    def close(self) -> None:
        """Close every idle connection."""
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()
